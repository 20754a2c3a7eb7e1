"""The worker side of a run: ``__main__`` (the entry, ``python -m bench.train --config
run.json``), ``loop`` (training), ``state`` (:class:`~bench.train.state.TrainState`),
``workload``, ``runtime`` (process group, device, precision) and ``checkpoint``.  The
package imports none of its modules, so importing one loads only what it needs."""
