"""``python -m reproduce gpucheck``: every CUDA path of the suite in one timed command.

``check`` (the probe, the steps and their budget), ``hooks`` (every DDP hook on CUDA
tensors, torch only), ``perf`` (selection, update and ResNet-50 compute against their memory
floors, torch only), ``summary`` (one line of numbers per step, read from what the step
recorded).
"""
