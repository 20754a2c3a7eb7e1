"""torchft's Lighthouse (the quorum server of the outer synchronisation) in global rank 0's
process, so that it ends with the run; ``$TORCHFT_LIGHTHOUSE`` names an external one."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

ENV = "TORCHFT_LIGHTHOUSE"  # the address of an external Lighthouse the user started


def node_address(peer: str) -> str:
    """This host's address on the route to ``peer``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((socket.gethostbyname(peer), 9))  # no packet: a UDP connect only routes
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


class Lighthouse:
    """A Lighthouse waiting for all ``min_replicas`` replica groups, at :attr:`address`."""

    def __init__(self, min_replicas: int, host: str, join_timeout_ms: int = 100) -> None:
        os.environ.setdefault("RUST_LOG", "warn")  # torchft logs every quorum otherwise
        from torchft._torchft import LighthouseServer

        self._server = LighthouseServer(
            bind="[::]:0", min_replicas=min_replicas, join_timeout_ms=join_timeout_ms
        )
        self.address = f"http://{host}:{urlparse(self._server.address()).port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None

    def __enter__(self) -> Lighthouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
