"""The worker side of a run (``python -m bench.train --config run.json``); the package imports
none of its modules, so importing one loads only what it needs."""
