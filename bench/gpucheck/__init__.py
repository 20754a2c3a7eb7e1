"""``python -m reproduce gpucheck``: every CUDA path of the suite in one timed command."""
