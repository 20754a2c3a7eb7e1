"""Sweeps of ordinary training runs (ablation grid, tuning protocol, scaling study) and the
tables built from their records alone (docs/internals/sweeps.md)."""
