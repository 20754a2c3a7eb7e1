"""The suite's Hydra launcher plugin (Hydra finds plugins only in this namespace package):
``hydra/launcher=slurm`` is :class:`bench.launch.submit.SlurmLauncher`."""

from bench.launch.submit import SlurmLauncher


class BenchSlurmLauncher(SlurmLauncher):
    """hydra-submitit-launcher's Slurm launcher that fits the partition and sees every job
    end (see :class:`bench.launch.submit.SlurmLauncher`)."""
