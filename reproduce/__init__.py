"""Command line of the suite: ``python -m reproduce <command>`` (thin; logic lives in ``bench``)."""
