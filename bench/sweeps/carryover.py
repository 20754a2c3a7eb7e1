"""Do steps to target carry over from 2 nodes to 8?  Each covered configuration runs its
first evaluation seeds again on a local 8 x 2 (per-worker batch and step budget held); where
its steps ratio (8 over 2, by seed) differs from dense's by more than :data:`TOLERANCE`, the
projections take its steps (and dense's) from the 8-node runs.  Rules: docs/protocol.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bench import methods
from bench.sweeps import intervals as iv
from bench.sweeps import protocol as pr
from bench.sweeps.common import compose

CARRY = "carry"  # the protocol role of the 8-node runs
NODES, BASE_NODES = 8, 2  # nodes of the carry-over runs, and of the runs they are paired with

TOLERANCE = 0.15  # |ratio / dense's ratio - 1| above which the projection uses NODES' steps
# the key of the global batch per workload (None: the batch is per worker already)
GLOBAL_BATCH = {"classification": "data.batch_size", "translation": None}


def jobs(plan: pr.Plan, picked: Mapping[str, Mapping[str, str]],
         leading: Mapping[str, Sequence[str]]) -> list[pr.Job]:  # fmt: skip
    """Each covered configuration on the first ``plan.carry_seeds`` evaluation seeds."""
    seeds = list(plan.eval_seeds)[: plan.carry_seeds]
    pairs = covered(plan.workload(), picked, leading)
    return [pr.Job(CARRY, c, t, s) for s in seeds for c, t in pairs]


def overrides(plan: pr.Plan, job: pr.Job) -> list[str]:
    """``job``'s evaluation run's overrides, at NODES."""
    base = plan.overrides(pr.Job(pr.EVAL, job.comm, job.trial, job.seed))
    base = [o for o in base if not o.startswith(("results.protocol_role=",
                                                  "results.protocol_selected="))]  # fmt: skip
    wl = plan.workload()
    recipe = compose([f"experiment={plan.experiment}"])
    batch = int(recipe.data.batch_size) if GLOBAL_BATCH[wl] else 0
    warmup = float(recipe.optim.get("warmup_epochs") or 0.0)
    out = scale(base, wl, batch, pr.BUDGET_STEPS[wl], pr.STEPS_PER_EPOCH[wl], warmup)
    return [*out, f"results.protocol_role={CARRY}", "results.protocol_selected=true"]


def runs(plan: pr.Plan, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The stage's runs and the evaluation runs they pair with (any cluster: steps do not
    depend on the link)."""
    out = []
    for r in pr.recorded(records).values():
        j = pr.job_of(r)
        if (
            j is None
            or j.role not in (CARRY, pr.EVAL)
            or r.get("status") not in ("ok", "target_missed")
        ):
            continue
        if (run := pr.run_of(plan, r)) is None:
            continue
        nodes = NODES if j.role == CARRY else BASE_NODES
        out.append({"comm": j.comm, "trial": j.trial, "seed": j.seed, "nodes": nodes,
                    "steps": run.steps, "reached": run.reached})  # fmt: skip
    # one 2-node run per (configuration, seed): a configuration evaluated on two clusters
    df = pd.DataFrame(out, columns=["comm", "trial", "seed", "nodes", "steps", "reached"])
    return df.drop_duplicates(["comm", "trial", "seed", "nodes"]).to_dict("records")


def covered(workload: str, picked: Mapping[str, Mapping[str, str]],
            leading: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:  # fmt: skip
    """(method, trial) of each configuration selected for any cluster; on translation only
    the baseline's and the leaders' at any cluster (``leading``: cluster -> methods)."""
    pairs = sorted({(c, t) for sel in picked.values() for c, t in sel.items()})
    if workload == "classification":
        return pairs
    keep = {methods.baseline()} | {m for group in leading.values() for m in group}
    return [(c, t) for c, t in pairs if c in keep]


def scale(
    overrides: Sequence[str], workload: str, batch: int, budget: int, per_epoch: int,
    warmup: float = 0.0,
) -> list[str]:  # fmt: skip
    """A 2-node run's ``overrides`` at NODES: a global ``batch`` scaled up, epochs enough for
    ``budget`` optimizer steps (``per_epoch`` at 2 nodes), the warm-up (epochs) stretched to
    the same optimizer steps."""
    k = NODES // BASE_NODES
    key = GLOBAL_BATCH[workload]
    wu = "optim.warmup_epochs="
    given = [float(o.removeprefix(wu)) for o in overrides if o.startswith(wu)]
    drop = ("cluster.nnodes=", "train.epochs=", wu, *((f"{key}=",) if key else ()))
    out = [o for o in overrides if not o.startswith(drop)]
    short = max(1, per_epoch // k)  # steps per epoch at NODES
    out += [f"cluster.nnodes={NODES}", f"train.epochs={math.ceil(budget / short)}"]
    out.append(f"{wu}{(given[-1] if given else warmup) * per_epoch / short:.6g}")
    return out + ([f"{key}={batch * k}"] if key else [])


def table(runs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per configuration: its mean steps at both node counts over the paired seeds,
    their ratio and that against the baseline's seed by seed (geometric mean, t interval),
    and whether the projection uses the NODES-node steps."""
    df = pd.DataFrame(list(runs), columns=["comm", "trial", "seed", "nodes", "steps", "reached"])
    base = methods.baseline()
    rows, ratio_of = [], {}
    for (comm, trial), g in df.groupby(["comm", "trial"], sort=True):
        by = {n: dict(zip(h["seed"], h["steps"], strict=True)) for n, h in g.groupby("nodes")}
        seeds = sorted(set(by.get(NODES, {})) & set(by.get(BASE_NODES, {})))
        per_seed = {s: by[NODES][s] / by[BASE_NODES][s] for s in seeds}
        ratio_of[(comm, trial)] = per_seed
        rows.append(
            {
                "comm": comm,
                "trial": trial,
                "seeds": " ".join(str(s) for s in seeds),
                "n_missed": int((~g["reached"].astype(bool)).sum()),
                f"steps_{BASE_NODES}_nodes": np.mean([by[BASE_NODES][s] for s in seeds])
                if seeds
                else math.nan,
                f"steps_{NODES}_nodes": np.mean([by[NODES][s] for s in seeds])
                if seeds
                else math.nan,
                **dict(
                    zip(
                        ("ratio", "ratio_ci_low", "ratio_ci_high"),
                        iv.log_mean_interval([v for v in per_seed.values() if v > 0]),
                        strict=True,
                    )
                ),  # fmt: skip
            }
        )
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    ref = next((v for (c, _), v in ratio_of.items() if c == base), {})
    vs = []
    for (comm, trial), per_seed in ratio_of.items():
        q = [per_seed[s] / ref[s] for s in per_seed if s in ref]
        vs.append((comm, trial, *iv.log_mean_interval([v for v in q if v > 0])))
    vs_df = pd.DataFrame(vs, columns=["comm", "trial", "vs_dense", "vs_dense_ci_low",
                                      "vs_dense_ci_high"])  # fmt: skip
    out = out.merge(vs_df, on=["comm", "trial"], how="left")
    out["use_8_node_steps"] = (out["vs_dense"] - 1).abs() > TOLERANCE
    return out


def step_factors(tab: pd.DataFrame) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(method, trial) -> the factor its projected times take, with its 95 % interval: its
    steps ratio (8 over 2 nodes) over the baseline's, where that differs by more than
    :data:`TOLERANCE`.  Every other configuration, the baseline's included, keeps its 2-node
    steps: a comparison is then between steps at one node count for both sides, over all
    the evaluation seeds."""
    if tab.empty or "use_8_node_steps" not in tab:
        return {}
    hit = tab[tab["use_8_node_steps"].fillna(False).astype(bool)]
    return {
        (str(r.comm), str(r.trial)): (
            float(r.vs_dense),
            float(r.vs_dense_ci_low),
            float(r.vs_dense_ci_high),
        )
        for r in hit.itertuples()
    }
