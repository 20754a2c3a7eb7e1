"""What a run leaves behind (records, curves, event log, MLPerf log, DAWNBench files), written
by the launcher and the workers alike; :mod:`bench.report` reads them back."""
