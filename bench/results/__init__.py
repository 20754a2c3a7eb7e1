"""Result records, time-to-target bookkeeping, curves and plots.

- :mod:`bench.results.timing`: THE definition of training time and time-to-target;
- :mod:`bench.results.records`: the JSON-lines run records and per-epoch curve CSVs;
- :mod:`bench.results.plots`: figures drawn from records alone;
- :mod:`bench.results.env`: hardware, versions, git sha.
"""
