"""The report of recorded results (REPORT.md, its figures, README's answer block), from a
results directory alone; run by ``python -m reproduce figures``."""
