"""Future plumbing of the asynchronous hooks: collectives issued with ``async_op=True``,
timed, what follows in their callbacks, and :class:`Lane`, which keeps the collectives that
callbacks issue on one process group in bucket order on every worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bench.comm.stats import CommStats

Future = torch.futures.Future


def new_future(like: torch.Tensor) -> Future:
    """An empty future, CUDA-aware on ``like``'s device (its value syncs the streams)."""
    return Future(devices=[like.device]) if like.is_cuda else Future()


def done(t: torch.Tensor) -> Future:
    fut = new_future(t)
    fut.set_result(t)
    return fut


def forward(src: Future, dst: Future, value: Callable[[Any], Any] = lambda v: v) -> None:
    """When ``src`` completes, complete ``dst`` with ``value(src's value)`` (or its error)."""

    def copy(f: Future) -> None:
        try:
            result = value(f.value())
        except BaseException as e:  # the error reaches whoever waits on dst
            dst.set_exception(e)
            return
        dst.set_result(result)

    src.add_done_callback(copy)


def collective(
    stats: CommStats,
    like: torch.Tensor,
    issue: Callable[[], Any],
    then: Callable[[Future], Any] | None = None,
) -> Future:
    """Issue one async collective (``issue()`` returns its Work), timed for ``stats`` from
    the issue to the completion callback, ``then`` (its local part) included."""
    times = stats.times
    start = times.now(like)
    fut = issue().get_future()
    if like.is_cuda:  # a CUDA-aware future on like's device
        src, fut = fut, new_future(like)
        forward(src, fut)
    if then is not None:
        fut = fut.then(then)

    def stamp(_: Future) -> None:
        times.add_comm(start, times.now(like))

    fut.add_done_callback(stamp)
    return fut


class Lane:
    """Issue order of the collectives that one process group receives from callbacks."""

    def __init__(self) -> None:
        self._last: Future = Future()
        self._last.set_result(None)

    def after(self, ready: Future, issue: Callable[[Any], Future], like: torch.Tensor) -> Future:
        """``issue(ready's value)`` once ``ready`` is done and the lane's stage before issued."""
        out = new_future(like)
        turn: Future = Future()
        prev, self._last = self._last, turn

        def go(f: Future) -> None:
            try:
                inner = issue(f.value())
            except BaseException as e:
                turn.set_result(None)
                out.set_exception(e)
                return
            turn.set_result(None)
            forward(inner, out)

        prev.add_done_callback(lambda _: ready.add_done_callback(go))
        return out
