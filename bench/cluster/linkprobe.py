"""Both ends of the link check, run in the emulated nodes' namespaces (usage: :func:`main`);
the standard library only, so that it starts in ~50 ms."""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time

CHUNK = 1 << 20  # bytes per send/recv call


def _recv_exact(c: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        r = c.recv(n - len(out))
        if not r:
            raise ConnectionError("the link check peer went away")
        out += r
    return out


def _drain(c: socket.socket, buf: bytearray, n: int) -> None:
    got = 0
    while got < n:
        r = c.recv_into(buf, min(CHUNK, n - got))
        if r == 0:
            raise ConnectionError("the link check client went away")
        got += r


def serve(host: str, port: int) -> None:
    """One connection: echo pings, take a bulk transfer and small messages, acking each."""
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, port))
        srv.listen(1)
        print("ready", flush=True)
        c, _ = srv.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with c:
        head = _recv_exact(c, 24)
        pings, smalls = int.from_bytes(head[:4], "big"), int.from_bytes(head[4:8], "big")
        small, bulk = int.from_bytes(head[8:16], "big"), int.from_bytes(head[16:], "big")
        for _ in range(pings):
            c.sendall(_recv_exact(c, 1))
        buf = bytearray(CHUNK)
        for n in [bulk] + [small] * smalls:
            _drain(c, buf, n)
            c.sendall(b"k")


def _connect(host: str, port: int, connect_s: float) -> socket.socket:
    deadline = time.monotonic() + connect_s
    while True:
        try:
            c = socket.create_connection((host, port), timeout=60)
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return c
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _timed_send(c: socket.socket, data: memoryview, nbytes: int) -> float:
    t0 = time.perf_counter()
    sent = 0
    while sent < nbytes:
        sent += c.send(data[: min(CHUNK, nbytes - sent)])
    _recv_exact(c, 1)
    return time.perf_counter() - t0


def blast(
    host: str,
    port: int,
    nbytes: int,
    pings: int = 20,
    smalls: int = 0,
    small_bytes: int = 0,
    gap_s: float = 0.05,
    connect_s: float = 10.0,
) -> dict:
    """RTT by ping-pong, one ``nbytes`` transfer, then ``smalls`` messages of ``small_bytes``,
    each ``gap_s`` after the last ack."""
    with _connect(host, port, connect_s) as c:
        head = [pings.to_bytes(4, "big"), smalls.to_bytes(4, "big")]
        c.sendall(b"".join([*head, small_bytes.to_bytes(8, "big"), nbytes.to_bytes(8, "big")]))
        rtts = []
        for _ in range(pings):
            t0 = time.perf_counter()
            c.sendall(b"p")
            _recv_exact(c, 1)
            rtts.append(time.perf_counter() - t0)
        data = memoryview(b"\0" * min(CHUNK, max(nbytes, small_bytes)))
        dt = _timed_send(c, data, nbytes)
        small_s = []
        for _ in range(smalls):
            time.sleep(gap_s)  # idle: the token bucket refills
            small_s.append(_timed_send(c, data, small_bytes))
    rtt = statistics.median(rtts[2:] if len(rtts) > 4 else rtts)  # first pings warm up
    out = {
        "bytes": nbytes,
        "seconds": dt,
        # the ack costs half an RTT beyond the last byte's arrival
        "bps": nbytes * 8 / max(dt - rtt / 2, 1e-9),
        "rtt_s": rtt,
    }
    if smalls:
        # first byte out to last byte in: the message's time less one round trip
        out["small_bytes"] = small_bytes
        # the fastest: the one least delayed by a busy CPU, and the one a token bucket
        # that is too large would show first
        out["small_s"] = max(min(small_s) - rtt, 0.0)
        out["small_all_s"] = small_s
    return out


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"] and len(argv) == 3:
        serve(argv[1], int(argv[2]))
    elif argv[:1] == ["blast"] and len(argv) in (4, 5, 8):  # blast()'s positional arguments
        args = (kind(a) for kind, a in zip((str, int, int, int, int, int, float), argv[1:]))
        print(json.dumps(blast(*args)))
    else:
        raise SystemExit(
            "usage: linkprobe.py serve HOST PORT | blast HOST PORT NBYTES "
            "[PINGS [SMALLS SMALL_BYTES GAP_S]]"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
