"""What a run leaves behind, written by the launcher and the workers alike.

- :mod:`bench.results.timing`: THE definition of training time and time-to-target;
- :mod:`bench.results.records`: the JSON-lines run records and per-epoch curve CSVs;
- :mod:`bench.results.columns`: the curve's column names;
- :mod:`bench.results.events`: the event log of a run (failures, resumes, errors);
- :mod:`bench.results.mllog`, :mod:`bench.results.dawnbench`: the MLPerf log and the
  DAWNBench submission files;
- :mod:`bench.results.plots`: a run's time-to-accuracy figure;
- :mod:`bench.results.paths`: where benchmark CSVs live;
- :mod:`bench.results.env`: hardware, versions, git sha.

Reading them back into figures and the report is :mod:`bench.report`.
"""
