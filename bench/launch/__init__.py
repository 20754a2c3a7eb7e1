"""The launcher side of a run: what the ``python -m reproduce`` process does around the
workers.

``run`` (validate a config, write the run JSON, launch, make sure a record exists),
``runqueue`` (several runs in one launch of the workers), ``profile`` (the paper-scaled
link of the emulated cluster, set before launching).  The launchers themselves, which
start the worker processes, are in :mod:`bench.cluster`.
"""
