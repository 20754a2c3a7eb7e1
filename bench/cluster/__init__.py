"""Where workers run: one machine, a real multi-node cluster, or an emulated one.

``registry`` (the LAUNCHERS registry of :class:`~bench.cluster.registry.LauncherSpec`),
``launch`` (the checks every launcher shares, and the dispatch by ``cluster.name``),
``torchrun`` (the ``local`` and ``multinode`` launchers), ``emulated`` (the ``emulated``
launcher), ``netns`` (the emulated cluster: namespaces, bridge, tc shaping), ``linkcheck``
(is the emulated link what it claims), ``perfmodel`` (the alpha-beta model of one
training step's communication).

The package imports its launcher modules, each of which registers its launcher; no
module of the package imports the package, so there is no cycle.  A new launcher is a
module that registers a spec, imported here.
"""

from bench.cluster import emulated, torchrun  # noqa: F401  (each registers its launcher)
