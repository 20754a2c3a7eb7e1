"""Where workers run: one machine, a real multi-node cluster, or an emulated one.

``launch`` (the LAUNCHERS registry: ``local``, ``multinode``, ``emulated``), ``netns``
(the emulated cluster: namespaces, bridge, tc shaping), ``linkcheck`` (is the emulated
link what it claims), ``emulated`` (the emulated launcher), ``perfmodel`` (the
alpha-beta model of one training step's communication).
"""
