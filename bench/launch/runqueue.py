"""Several runs in one launch of the workers (a run queue): each keeps its own JSON, id and
record; only the processes, process group and cluster are shared (docs/internals/sweeps.md)."""

from __future__ import annotations

import copy
import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.config import to_container, to_object
from bench.launch.run import FAILED, launch_runs, prepare, write_run_json
from bench.results import records, reserve, whole
from bench.results.events import QUEUE_KEY

WARMUP_STEPS = 5


def _sessions(keys: Sequence[str]) -> list[list[int]]:
    return [list(g) for _, g in itertools.groupby(range(len(keys)), key=lambda i: keys[i])]


def run_queue(
    cfgs: Sequence[Any],
    *,
    experiment: str,
    output_dir: str | Path,
    labels: Sequence[str] | None = None,
    warmup: bool = True,
) -> list[tuple[int, dict[str, Any] | None]]:
    """Validate every run, then launch each series with one cluster config once; (exit
    status, record) per run ((130, None): never started, after an interrupt)."""
    launch_time = time.time()
    typed = [to_object(c) for c in cfgs]
    metas = [prepare(c, experiment, launch_time, quiet=i > 0) for i, c in enumerate(typed)]
    names = list(labels) if labels else [""] * len(typed)
    keys = [json.dumps(to_container(c)["cluster"], sort_keys=True) for c in typed]
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: list[tuple[int, dict[str, Any] | None] | None] = [None] * len(typed)
    pending = [(todo, warmup) for todo in _sessions(keys)]
    while pending:
        todo, warm = pending.pop(0)
        cfgs, run_metas = [typed[j] for j in todo], [metas[j] for j in todo]
        run_labels = [names[j] for j in todo]
        if warm:
            w = warmup_config(cfgs[0], out)
            cfgs, run_labels = [w, *cfgs], ["warm-up", *run_labels]
            run_metas = [prepare(w, experiment, time.time(), quiet=True), *run_metas]
        rest, stop = _launch(records.new_run_id(), cfgs, run_metas, run_labels, out)
        warm_failed = warm and rest[0] is not None and rest[0][0] != 0
        rest = rest[1:] if warm else rest
        for j, res in zip(todo, rest):
            results[j] = res
        left = [j for j, res in zip(todo, rest) if res is None]
        if stop:
            break
        if left:  # after a failed warm-up, without one
            pending.insert(0, (left, warm and not warm_failed))
    return [r if r is not None else (130, None) for r in results]


def warmup_config(cfg: Any, out: Path) -> Any:
    """A few steps of ``cfg``, recorded apart, first in each launch."""
    w = copy.deepcopy(cfg)
    w.cluster.profile = None  # the link ``cfg``'s profile chose stays; nothing timed again
    w.results.dir = str(out / "warmup")
    w.results.sweep_id = ""
    w.results.plot = False
    w.train.epochs, w.train.max_steps_per_epoch = 1, WARMUP_STEPS
    w.train.stop_at_target, w.train.checkpoint_every = False, 0
    w.train.eval_stride = 1  # a stride stops at the target, which a warm-up never does
    return w


def _launch(
    qid: str, cfgs: list[Any], metas: list[dict[str, Any]], labels: list[str], out: Path
) -> tuple[list[tuple[int, dict[str, Any] | None] | None], bool]:
    """Per run (status, record) or None (to launch again); and whether to stop."""
    payloads, paths = [], []
    for i, (cfg, meta, label) in enumerate(zip(cfgs, metas, labels)):
        meta["queue"] = {"id": qid, "index": i, "size": len(cfgs), "label": label}
        payloads.append({"config": to_container(cfg), "run": meta})
        paths.append(write_run_json(out, payloads[-1]))
    events = out / f"queue-{qid}.events.jsonl"
    queue_json = out / f"queue-{qid}.json"
    body = {"id": qid, "runs": [str(p.resolve()) for p in paths], "events": str(events.resolve())}
    whole.write(queue_json, json.dumps({QUEUE_KEY: body}, indent=1))
    print(f"queue {qid}: {len(cfgs)} run(s) in one launch of the workers", flush=True)
    launched = launch_runs(cfgs, payloads, queue_json, agent_log=events)
    if launched.raised is not None:  # the launch itself failed: the first run's record says why
        raised = launched.raised
        why = reserve.no_space(raised, cfgs[0].results.dir) or f"{type(raised).__name__}: {raised}"
        print(f"error: queue {qid}: {why}", flush=True)
    results: list[tuple[int, dict[str, Any] | None] | None] = [
        (int(rec["status"] in FAILED) if by_workers else launched.rc or 1, rec)  # type: ignore[index]
        for rec, by_workers in zip(launched.records, launched.by_workers)
    ]  # the run that was training when the launch ended: the launch's status
    return results + [None] * (len(cfgs) - len(launched.records)), launched.status == "interrupted"
