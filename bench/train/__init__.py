"""The worker side of a run: what each training process runs.

``loop`` (the training loop and its :class:`~bench.train.loop.TrainState`), ``workload``
(model, data, loss and metrics as one unit), ``runtime`` (process group, device, mixed
precision, step timer), ``checkpoint`` (save and restore a worker's state).  Started as
``python -m bench.train --config run.json`` by a launcher (:mod:`bench.cluster`).

The package imports none of its modules, so importing one loads only what it needs.
"""
