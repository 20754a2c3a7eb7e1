"""``python -m reproduce gpucheck``: every CUDA path of the suite in one timed command.

``check`` (the probe, the steps and their budget), ``summary`` (one line of numbers per
step, read from what the step recorded).
"""
