"""The report of recorded results, from a results directory alone: ``tables`` (inputs and
Markdown tables), ``figures`` (which figures, drawn how) and ``answer`` (REPORT.md, its
appendix and README's answer block).  Run by ``python -m reproduce figures``.
"""
