"""``python -m reproduce advise``: ranks the methods, says what is assumed, refuses bad input."""

import subprocess
import sys


def _advise(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reproduce", "advise", *args], capture_output=True, text=True
    )


def test_advise_ranks_methods_on_the_paper_profile(tmp_path):
    p = _advise("--profile", "paper", "--results-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    table = [ln.split() for ln in lines if ln.split()[:1] in (["dense"], ["mstopk"], ["hitopk"])]
    assert [r[0] for r in table][0] == "hitopk"  # 25 Gbit/s between 16 nodes: sparse wins
    steps = [float(r[1]) for r in table]
    assert steps == sorted(steps)
    assert "assumed: nothing hidden" in p.stdout  # no measurement in an empty results dir
    assert "NVIDIA DeepLearningExamples" in p.stdout


def test_advise_refuses_bad_input_in_one_line(tmp_path):
    for args in (["--workers", "2"], ["--nodes", "0", "--workers", "2", "--inter-gbps", "1"]):
        p = _advise(*args, "--results-dir", str(tmp_path))
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "error: advise" in p.stderr
    p = _advise("--nodes", "2", "--workers", "2", "--inter-gbps", "1", "--dry-run")
    assert p.returncode == 0 and "step ms" not in p.stdout
