"""The launcher side of a run: ``run``, ``runqueue`` (several runs in one launch),
``profile`` (the emulated cluster's paper-scaled link), ``submit`` (through Hydra)."""
