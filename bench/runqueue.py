"""Several runs in one launch of the workers: a *run queue*.

A sweep (``python -m reproduce ablation`` or ``scaling``) runs dozens of short training
runs on the same cluster.  Launched one by one, each pays the cluster's set-up and
tear-down again (namespaces, link check, agents and workers importing torch, the first
optimizer importing torch's compiler, interpreter shutdown): about 40 s a run on a
2-core machine, more than many of the runs train.  A queue launches the workers once for
consecutive runs that share a cluster config and trains them one after the other in the
same worker processes, in one process group.

Each run is still a run of its own: its own run JSON, run id, seed, model, optimizer, DDP
and communication hook, data loaders, curve, MLPerf log, DAWNBench files and record,
exactly as :func:`bench.train.train` builds them for a single run.  Only the process,
the process group and the cluster (its namespaces and link) are shared.  Training time
is measured from each run's first step, as for a single run; a queued run's
``wall_time_s`` counts from its start in the queue (the first run of a launch: from the
launch).

The queue JSON (``{"queue": {"id", "runs": [run JSON paths], "events"}}``) is passed to
the launcher in place of a run JSON.  When the workers fail, the run that was training
gets its ``error`` record (with the failure events of the launch) and the runs after it
continue in a new launch; an interrupt records the current run as ``interrupted`` and
stops the queue.  After an elastic restart the workers skip the runs already recorded.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

QUEUE_KEY = "queue"


def is_queue(payload: dict[str, Any]) -> bool:
    return QUEUE_KEY in payload


# --- in each worker ---------------------------------------------------------------------


def worker_loop(payload: dict[str, Any], train: Callable[..., Any]) -> None:
    """Train every run of the queue in ``payload``, in order, in this worker process."""
    import torch.distributed as dist

    from bench import runtime
    from bench.config import from_container
    from bench.results import records

    paths = payload[QUEUE_KEY]["runs"]
    runs = [json.loads(Path(p).read_text()) for p in paths]
    rank, _, _ = runtime.setup_distributed(from_container(runs[0]["config"]))  # one group
    # the runs recorded before an elastic restart restarted this queue: rank 0 reads them
    done = runtime.broadcast_object(_recorded(runs) if rank == 0 else None)
    first = True
    for i, run in enumerate(runs):
        if run["run"]["run_id"] in done:
            continue
        if not first:  # the run starts now, not when the queue was launched
            run["run"]["launch_time"] = time.time()
            run["run"]["started_at"] = records.now_iso()
        first = False
        if rank == 0:
            label = run["run"].get("queue", {}).get("label", "")
            qid = payload[QUEUE_KEY]["id"]
            print(f"queue {qid}: run {i + 1} of {len(paths)} {label}", flush=True)
        try:
            train(run, leave_group=False)
        except BaseException as e:
            note_worker_error(run, e)
            raise
        gc.collect()  # the finished run's model, loaders and buffers, before the next one
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _recorded(runs: list[dict[str, Any]]) -> set[str]:
    """The run ids of ``runs`` that already have a record."""
    from bench.results import records

    dirs = {r["config"]["results"]["dir"] for r in runs}
    return {r["run_id"] for d in dirs for r in records.load_records(d)}


def note_worker_error(run: dict[str, Any], e: BaseException) -> None:
    """The exception that ends a worker, in the run's event log (the launcher's error
    record names it)."""
    from bench import checkpoint as ck

    where = ck.events_path(run["config"]["results"]["dir"], run["run"]["run_id"])
    reason = f"{type(e).__name__}: {e}".strip().splitlines()[0][:500]
    ck.log_event(where, kind="worker_error", rank=os.environ.get("RANK"), reason=reason)


# --- in the launcher --------------------------------------------------------------------


def _sessions(keys: Sequence[str]) -> list[list[int]]:
    """Indices grouped into runs of consecutive equal ``keys`` (one launch each)."""
    out: list[list[int]] = []
    for i, k in enumerate(keys):
        if out and keys[out[-1][-1]] == k:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def run_queue(
    cfgs: Sequence[Any],
    *,
    experiment: str,
    output_dir: str | Path,
    labels: Sequence[str] | None = None,
    warmup: bool = True,
) -> list[tuple[int, dict[str, Any] | None]]:
    """Validate every run, then launch consecutive runs with the same cluster config once
    each; returns (exit status, record) per run, in order (status 0: recorded by the
    workers; a run never started, after an interrupt: (130, None))."""
    from bench.config import to_container, to_object
    from bench.results import records
    from bench.run import prepare

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
    """A few steps of ``cfg``, recorded apart (``out/warmup``, no sweep id): run first in
    each launch, so that the first real run finds the workers as warm as the later ones
    (the first steps of a fresh process are slower: about 0.4 s over the first epoch of
    the embedded default on 2 x 2 emulated workers, measured)."""
    w = copy.deepcopy(cfg)
    w.cluster.profile = None  # the link ``cfg``'s profile chose stays; nothing timed again
    w.results.dir = str(out / "warmup")
    w.results.sweep_id = ""
    w.results.plot = False
    w.train.epochs, w.train.max_steps_per_epoch = 1, WARMUP_STEPS
    w.train.stop_at_target, w.train.checkpoint_every = False, 0
    return w


WARMUP_STEPS = 5


def _launch(
    qid: str, cfgs: list[Any], metas: list[dict[str, Any]], labels: list[str], out: Path
) -> tuple[list[tuple[int, dict[str, Any] | None] | None], bool]:
    """One launch of the workers for ``cfgs``: per run (status, record), None for the runs
    after a failure (to be launched again); and whether to stop (an interrupt)."""
    from bench import checkpoint as ck
    from bench.config import to_container
    from bench.results import records, reserve
    from bench.run import guarded_launch, record_after, write_run_json

    payloads, paths = [], []
    for i, (cfg, meta, label) in enumerate(zip(cfgs, metas, labels)):
        meta["queue"] = {"id": qid, "index": i, "size": len(cfgs), "label": label}
        payloads.append({"config": to_container(cfg), "run": meta})
        paths.append(write_run_json(out, payloads[-1]))
    events = out / f"queue-{qid}.events.jsonl"
    queue_json = out / f"queue-{qid}.json"
    body = {"id": qid, "runs": [str(p.resolve()) for p in paths], "events": str(events.resolve())}
    queue_json.write_text(json.dumps({QUEUE_KEY: body}, indent=1))
    print(f"queue {qid}: {len(cfgs)} run(s) in one launch of the workers", flush=True)
    since = time.time()
    room = reserve.hold(cfgs[0].results.dir, qid)  # the failed run's record fits, disk full
    try:
        rc, status, reason, raised = guarded_launch(cfgs[0], queue_json)
    finally:
        room.release()
    if raised is not None:  # the launch itself failed: the first run's record says why
        print(f"error: queue {qid}: {type(raised).__name__}: {raised}", flush=True)
    results: list[tuple[int, dict[str, Any] | None] | None] = []
    failed = False
    recorded = {
        r["run_id"]: r for d in {c.results.dir for c in cfgs} for r in records.load_records(d)
    }
    for cfg, payload in zip(cfgs, payloads):
        run_id = payload["run"]["run_id"]
        rec = recorded.get(run_id)
        if rec is not None:
            ok = rec["status"] not in ("error", "interrupted")
            results.append((0 if ok else 1, rec))
        elif not failed:  # the run that was training when the launch ended
            failed = True
            for e in ck.read_events(events):  # the agents' notes of this launch
                if e.get("time", 0) >= since:
                    ck.log_event(ck.events_path(cfg.results.dir, run_id), **{
                        k: v for k, v in e.items() if k != "time"})  # fmt: skip
            rec = record_after(cfg, payload, rc or 1, status, reason, since)
            results.append((rc or 1, rec))
        else:
            results.append(None)
    return results, status == "interrupted"
