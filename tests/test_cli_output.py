"""What the commands print: a progress bar within an epoch on a terminal only, closing
lines naming every file a run wrote, one summary line for records of older formats in
``figures`` (and no library warnings), and a user's runs beside the reference ones."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bench.results.outputs import closing_lines, written
from bench.train import progress
from bench.train.progress import epoch_bar as _progress
from bench.train.progress import show_step as _show_step
from reproduce.__main__ import main
from tests.conftest import REPO
from tests.test_figures import _curve, _record, results  # noqa: F401  (a fixture)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _state(rank: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        rank=rank,
        steps=5,
        epoch=0,
        run={"run_id": "r"},
        cfg=SimpleNamespace(train=SimpleNamespace(progress=True)),
    )


def test_progress_on_a_terminal_only(monkeypatch) -> None:
    monkeypatch.setattr("sys.stderr", io.StringIO())  # a log file or a pipe
    bar = _progress(_state())
    assert bar.disable
    _show_step(bar, torch.tensor(float("nan")), 64, time.perf_counter())  # no read, no output
    bar.close()
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    assert _progress(_state(rank=1)).disable  # rank 0 only
    bar = _progress(_state())
    assert not bar.disable
    _show_step(bar, torch.tensor(1.25), 64, time.perf_counter() - 1.0)
    assert "loss 1.250" in bar.postfix and "samples/s" in bar.postfix
    bar.refresh()
    assert "1/5" in term.getvalue() and "loss 1.250" in term.getvalue()
    bar.close()


def test_progress_on_a_terminal_of_width_0(monkeypatch) -> None:
    """A pseudo-terminal that reports 0 columns (``script -c`` without a terminal of its
    own) still shows the bar: tqdm draws nothing at width 0."""
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    monkeypatch.setattr(progress, "_size", lambda: progress.SIZE)
    bar = _progress(_state())
    bar.update(1)
    bar.refresh()
    assert "epoch 1" in term.getvalue() and "1/5" in term.getvalue()
    bar.close()
    monkeypatch.undo()
    monkeypatch.setattr("sys.stderr", SimpleNamespace(fileno=lambda: 2))
    monkeypatch.setattr("os.get_terminal_size", lambda fd: os.terminal_size((0, 0)))
    assert progress._size() == progress.SIZE
    monkeypatch.setattr("os.get_terminal_size", lambda fd: os.terminal_size((120, 40)))
    assert progress._size() is None  # a terminal's own size: the bar follows it


@pytest.mark.parametrize("others, busy", [(None, False), (None, True), (0.4, False), (2.0, True)])
def test_a_busy_machine_is_warned_about_and_recorded(monkeypatch, capsys, others, busy) -> None:
    """Load beyond the run's own, from /proc's runnable threads or, where there is no /proc,
    from the load average less the run's workers (2 workers x 1 thread on 2 cores, an hour
    in): one warning line, once, and ``busy`` in the record's ``machine_load``."""
    load = 5.2 if busy else 2.0
    monkeypatch.setattr("os.getloadavg", lambda: (load, load, load))
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("torch.get_num_threads", lambda: 1)
    monkeypatch.setattr(progress, "others_running", lambda *a: others)
    monkeypatch.delenv("RANK", raising=False)
    cluster = {"name": "local", "nnodes": 1, "nproc_per_node": 2}
    payload = {
        "config": {"cluster": cluster},
        "run": {"run_id": "r1", "launch_time": time.time() - 3600},
    }
    progress.watch_load(payload)
    progress._sample("r1", quick=True)
    rec = progress.machine_load("r1")
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "busy" in ln]
    assert rec is not None and rec["busy"] is busy and rec["cores"] == 2
    assert rec["load_at_start"] == load
    assert len(warned) == (1 if busy else 0)
    if busy:
        n = 3.2 if others is None else others
        assert warned[0].startswith(f"warning: this machine is busy ({n:.1f} runnable tasks on 2")
        assert "load average 5.2" in warned[0]
    assert progress.machine_load("r1") is None  # read once, for the record


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_others_running_counts_other_work_and_not_the_runs_own(monkeypatch) -> None:
    """A spinning process is runnable all the time: counted when it is another job's, not
    when it carries this run's torchrun job id or is this process's child; a run that just
    ended leaves nothing behind (the 1-minute load average keeps a tail for minutes)."""
    import subprocess
    import sys

    spin = [sys.executable, "-c", "import time\nt = time.time() + 20\nwhile time.time() < t: pass"]
    cmd = " ".join(f"'{a}'" for a in spin)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "tkb-test-run")
    tag = b"TORCHELASTIC_RUN_ID=tkb-test-run\0"
    seen: dict[int, int] = {}
    for job, counted in (("tkb-another-run", True), ("tkb-test-run", False)):
        # started by a shell, so the spinner is not this process's child; a session of its own
        env = {**os.environ, "TORCHELASTIC_RUN_ID": job}
        sh = subprocess.Popen(["sh", "-c", f"{cmd} & wait"], env=env, start_new_session=True)
        try:
            time.sleep(0.5)  # started and spinning
            kids = Path(f"/proc/{sh.pid}/task/{sh.pid}/children").read_text().split()
            pid = int(kids[0])
            n = max(progress._running_others(pid, os.getpid(), tag, {}) for _ in range(20))
            seen[counted] = n
            assert progress._running_others(sh.pid, os.getpid(), tag, {}) == 0  # it waits
        finally:
            os.killpg(sh.pid, 9)
            sh.wait()
    assert seen == {True: 1, False: 0}
    child = subprocess.Popen(spin)  # this process's child: the run's own, whatever its env
    try:
        time.sleep(0.5)
        n = max(progress._running_others(child.pid, os.getpid(), None, {}) for _ in range(20))
        assert n == 0
    finally:
        child.kill()
        child.wait()
    assert progress.others_running(samples=2) is not None


def test_closing_lines_name_every_file(tmp_path: Path) -> None:
    rid = "20261201-000000-abcdef"
    files = {
        "curve": tmp_path / "curves" / f"{rid}.csv",
        "figure": tmp_path / "figures" / f"{rid}_tta.png",
        "dawnbench_json": tmp_path / "dawnbench" / f"{rid}.json",
        "dawnbench_tsv": tmp_path / "dawnbench" / f"{rid}.tsv",
        "mllog": tmp_path / "mllog" / f"{rid}.log",
    }
    for p in [*files.values(), tmp_path / "checkpoints" / rid / "epoch-0002.json"]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    rec = {"run_id": rid, **{k: str(v) for k, v in files.items()}, "translations": None}
    listed = dict(written(rec, tmp_path))
    assert listed["record"] == f"{tmp_path / 'runs.jsonl'} (run {rid})"
    assert set(listed.values()) >= {str(p) for p in files.values()}
    assert "epoch-0002" in listed["checkpoints"]
    text = closing_lines(rec, tmp_path)
    assert text.startswith("wrote:\n") and len(text.splitlines()) == 1 + len(listed)


def test_first_run_ends_with_the_reference_and_a_next_command() -> None:
    """A dawnbench_digits run is compared with the newest committed run of its recipe,
    told how many held-out images cleared the target, and given one next command."""
    import json

    from bench.results.outputs import comparison_lines

    rows = [json.loads(ln) for ln in (REPO / "results" / "runs.jsonl").read_text().splitlines()]
    ref = [r for r in rows if r.get("experiment") == "dawnbench_digits" and r["status"] == "ok"]
    rec = dict(ref[-1], run_id="20261203-000000-yours0", time_to_target_s=20.0)
    rec["best_value"] = 353 / 360
    lines = comparison_lines(rec, REPO / "results")
    assert any("353 of 360 held-out images" in ln and "to spare" in ln for ln in lines), lines
    refline = next(ln for ln in lines if ln.startswith("reference: "))
    assert " s (" in refline and "yours: 20.0 s (" in refline and " x)" in refline
    assert lines[-1].startswith(f"next: python -m reproduce compare {rec['run_id']} ")
    other = comparison_lines(rec, REPO / "results", results_dir="/tmp/mine")
    assert "--results-dir /tmp/mine --results-dir " in other[-1]  # compare finds both runs


def test_figures_summarises_older_records_in_one_line(results: Path, capsys) -> None:  # noqa: F811
    main(["figures", "--results-dir", str(results), "--dry-run"])
    err = capsys.readouterr().err
    older = [ln for ln in err.splitlines() if "older formats" in ln]
    assert len(older) == 1 and "6 record(s)" in older[0]
    assert "r-old" not in err and "r-dense-0" not in err  # run ids only with --verbose
    main(["figures", "--results-dir", str(results), "--dry-run", "--verbose"])
    assert "r-old" in capsys.readouterr().err  # named with --verbose


def test_figures_beside_the_reference(results: Path, tmp_path: Path, capsys) -> None:  # noqa: F811
    """A user's runs drawn with the reference ones: both read, neither changed, the
    figures and report in the user's directory."""
    mine = tmp_path / "mine"
    rec = _record("r-mine", "hitopk", 5, 7.0)
    (mine / "curves").mkdir(parents=True)
    (mine / "runs.jsonl").write_text(json.dumps(rec) + "\n")
    _curve(mine / "curves" / "r-mine.csv", 7.0)
    ref_before = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
    main(["figures", "--results-dir", str(mine), "--reference", str(results)])
    captured = capsys.readouterr()
    assert "Warning" not in captured.err  # no library warnings
    out = mine / "with-reference"
    report = (out / "REPORT.md").read_text() + (out / "REPORT-appendix.md").read_text()
    assert "r-mine" in report and "r-dense-0" in report
    assert {p: p.read_bytes() for p in results.rglob("*") if p.is_file()} == ref_before
    assert (mine / "runs.jsonl").read_text() == json.dumps(rec) + "\n"


def test_your_run_is_its_own_line_on_the_reference_axes(
    results: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch,
    capsys,
) -> None:
    """``--reference`` with ``--experiment``: the time-to-accuracy figure draws the user's
    run on its own, labelled, on the reference runs' axes (not inside their bands), and
    no figure of another experiment, the scaling study or a benchmark is drawn."""
    import bench.report.tta as F  # the time-to-accuracy figure's own module

    mine = tmp_path / "mine"
    (mine / "curves").mkdir(parents=True)
    (mine / "runs.jsonl").write_text(json.dumps(_record("r-mine", "dense", 9, 6.0)) + "\n")
    _curve(mine / "curves" / "r-mine.csv", 6.0)
    legends: dict[str, list[str]] = {}
    save = F.save_figure

    def keep(fig, path, **kw):  # the legend and tick labels of every panel, by file name
        legends[Path(path).name] = [
            t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().texts
        ] + [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
        return save(fig, path, **kw)

    monkeypatch.setattr(F, "save_figure", keep)
    argv = ["--results-dir", str(mine), "--reference", str(results)]
    main(["figures", *argv, "--experiment", "dawnbench_digits"])
    out = capsys.readouterr().out
    assert "tta_dawnbench-digits.png: written" in out
    assert "scaling" not in out and "bench_" not in out  # only what was asked
    tta = legends["tta_dawnbench-digits.png"]
    assert [t for t in tta if t.startswith("yours: r-mine dense")], tta
    dense = next(t for t in tta if t.startswith("dense") and "reached" in t)
    assert "/3 reached" in dense  # the reference's three dense seeds, without the user's run


def test_compare_finds_runs_in_each_directory(results: Path, tmp_path: Path, capsys) -> None:  # noqa: F811
    mine = tmp_path / "mine"
    (mine / "curves").mkdir(parents=True)
    (mine / "runs.jsonl").write_text(json.dumps(_record("r-mine", "hitopk", 5, 7.0)) + "\n")
    _curve(mine / "curves" / "r-mine.csv", 7.0)
    args = ["compare", "r-mine", "r-dense-0", "--out", str(tmp_path / "c.png"), "--dry-run"]
    main([*args, "--results-dir", str(mine), "--results-dir", str(results)])
    out = capsys.readouterr().out
    assert "r-mine: 'yours: r-mine hitopk'" in out
    assert "r-dense-0: 'compared: r-dense-0 dense'" in out
    with pytest.raises(SystemExit) as e:
        main([*args, "--results-dir", str(mine)])
    assert e.value.code == 2 and "no record 'r-dense-0'" in capsys.readouterr().err


@pytest.mark.parametrize("classes, target, shown", [(10, "top1", False), (1000, "top1", True),
                                                    (10, "top5", True)])  # fmt: skip
def test_top5_column_only_where_it_says_something(classes: int, target: str, shown: bool) -> None:
    from bench.train.outputs import table as _table

    s = SimpleNamespace(
        workload=SimpleNamespace(
            metrics=("top1", "top5", "loss"), data=SimpleNamespace(num_classes=classes)
        ),
        cfg=SimpleNamespace(train=SimpleNamespace(target_metric=target)),
    )
    headers = [h for h, *_ in _table(s)]
    assert "top1%" in headers and ("top5%" in headers) == shown


def test_ddp_is_made_without_a_future_warning(tmp_path: Path) -> None:
    """The run's DDP keyword for "no buffer broadcast each forward" is one torch does not
    deprecate (torch 2.14 warns once per worker for broadcast_buffers)."""
    import warnings

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from bench.train.runtime import NO_BUFFER_SYNC

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            DDP(torch.nn.Linear(2, 2), **NO_BUFFER_SYNC)
    finally:
        dist.destroy_process_group()
