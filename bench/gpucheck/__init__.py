"""``python -m reproduce gpucheck``: every CUDA path of the suite in one timed command
(:mod:`.check`), its torch-only steps (``hooks``, ``perf``, ``step``, ``calibrate``) and
the one line of numbers per step (:mod:`.summary`)."""
