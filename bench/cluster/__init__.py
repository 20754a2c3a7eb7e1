"""Where workers run: one machine or a real multi-node cluster (``torchrun``), an emulated
one (``emulated``, on ``netns``); ``linkcheck`` checks the emulated link, ``perfmodel``
and ``projection`` model a step's communication.  :mod:`bench.launch.run` picks the
launcher ``cluster.name`` names."""
