"""Top-k sparsified data-parallel training, input caching and fused updates: the library.

Sub-packages: ``models`` (networks), ``data`` (data sets, loaders, caches), ``comm``
(compressors, error feedback, communicators, DDP hooks), ``optim`` (optimizers, update
modes, schedules), ``cluster`` (launch, network emulation, performance model),
``results`` (records, time-to-target, plots), ``benchmarks``; ``train`` is the loop.
"""

__version__ = "0.1.0"
