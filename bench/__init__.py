"""Top-k sparsified data-parallel training, input caching and fused updates: the library.

Sub-packages import only those on lower floors (``LAYERS`` in ``tests/test_layout.py``);
docs/layout.md describes them."""

__version__ = "0.1.0"
