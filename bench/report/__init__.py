"""The report of recorded results, from a results directory alone: ``tables`` (inputs and
Markdown tables), ``figures`` and ``scaling`` (which figures, drawn how), ``claims`` (the
paper's claims beside ours), ``commands`` (the command behind a number) and ``answer``
(REPORT.md, its appendix and README's answer block).  Run by ``python -m reproduce figures``.
"""
