"""The report of recorded results: figures and ``REPORT.md``, from ``results/`` alone.

``figures_data`` (records and CSVs read into one :class:`~bench.report.figures_data.Inputs`),
``figures`` and ``figures_plan`` (which figures, drawn how), ``figures_bench`` (each
benchmark's own figure of its newest run), ``report`` with ``report_tables``,
``report_claims`` (the cited numbers) and ``report_commands`` (the command of each run).
Run by ``python -m reproduce figures``; nothing here trains or measures.
"""
