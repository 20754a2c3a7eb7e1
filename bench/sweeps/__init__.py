"""Sweeps of ordinary training runs and the tables built from their records.

``ablation`` (:mod:`bench.sweeps.ablation`) runs training jobs over communication,
cache and update mode with several seeds and aggregates time to target per
configuration; ``scaling`` (:mod:`bench.sweeps.scaling`) measures throughput against the
number of workers and nodes beside the performance model's projection.  Every job is a
normal run of ``python -m reproduce train``: it writes its own record, tagged with
``results.sweep_id``, and the tables are rebuilt from those records alone
(:mod:`bench.sweeps.common`).
"""
