"""The CUDA side of the hooks' timing and backend choice, checked on the CPU.

Events must be recorded on the stream of the *tensor's* device (gloo calls back on its
own threads, where the current device is 0); timing is off in training unless
``comm.timing`` turns it on; a ``cpu:gloo,cuda:nccl`` group sends CUDA buckets to NCCL.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bench.comm.communicators import uses_gloo
from bench.comm.config import CommConfig, HookOptions
from bench.comm.stats import PhaseTimes


class _FakeEvent:
    recorded: list = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.stream = None

    def record(self, stream=None) -> None:
        self.stream = stream
        _FakeEvent.recorded.append(stream)


def test_events_go_on_the_tensors_device_stream(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: ("stream of", device))
    like = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 3))
    ev = PhaseTimes(enabled=True).now(like)
    assert ev.stream == ("stream of", torch.device("cuda", 3))  # not the current device's
    assert PhaseTimes(enabled=False).now(like) is None  # timing off: no event at all


def test_timing_is_off_in_training_unless_asked_for() -> None:
    assert CommConfig().timing is False
    assert HookOptions.of(CommConfig()).timing is False
    assert HookOptions.of(CommConfig(timing=True)).timing is True


@pytest.mark.parametrize(
    ("backend", "device", "gloo"),
    [
        ("gloo", "cpu", True),
        ("gloo", "cuda", True),
        ("nccl", "cuda", False),
        ("cpu:gloo,cuda:nccl", "cuda", False),
        ("cpu:gloo,cuda:nccl", "cpu", True),
    ],
)
def test_a_mixed_backend_group_sends_cuda_buckets_to_nccl(
    monkeypatch, backend: str, device: str, gloo: bool
) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    assert uses_gloo(None, torch.device(device)) is gloo
