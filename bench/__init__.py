"""Top-k sparsified data-parallel training, input caching and fused updates: the library.

Sub-packages, from the ground floor up (each imports only those before it; the order is
``LAYERS`` in ``tests/test_layout.py``): ``models`` (networks), ``data`` (data sets,
loaders, caches), ``comm`` (compressors, error feedback, communicators, DDP hooks),
``optim`` (optimizers, update modes, schedules), ``results`` (records, curves, the event
log, time-to-target, plots), ``cluster`` (launchers, network emulation, performance
model), ``train`` (the worker side of a run: the loop), ``benchmarks``, ``launch`` (the
launcher side of a run), ``sweeps``, ``report`` (figures and the report) and
``gpucheck``; ``registry`` and ``config`` are the two loose modules.
"""

__version__ = "0.1.0"
