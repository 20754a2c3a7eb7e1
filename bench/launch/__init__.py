"""The launcher side of a run: ``run`` (validate, launch, make sure a record exists),
``runqueue`` (several runs in one launch) and ``profile`` (the emulated cluster's
paper-scaled link)."""
