"""The paper's claims and the public records our numbers stand beside.

These are cited numbers, not measurements of this project: each names its source.  The
report prints them in their own column, never as ours.
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER = (
    "Shi et al., Towards Scalable Distributed Training of Deep Learning on Public Cloud "
    "Clusters, MLSys 2021 (arXiv 2010.10458), abstract"
)
DAWNBENCH = "DAWNBench leaderboard (Stanford), ImageNet and CIFAR-10 training-time tracks"


@dataclass(frozen=True)
class Claim:
    what: str
    value: str
    source: str


SPEEDUP_CLAIM = Claim(
    "faster than the state of the art",
    "25-40 % faster than the state-of-the-art systems of 2020 on CNNs and a Transformer "
    "(16 nodes x 8 V100-32GB, NVLink inside a node, 25 Gbit/s Ethernet between nodes)",
    PAPER,
)

# experiment -> the public records of its task
RECORDS: dict[str, tuple[Claim, ...]] = {
    "dawnbench_imagenet": (
        Claim(
            "DAWNBench ImageNet, ResNet-50 to 93 % top-5",
            "2 min 31 s on 128 V100 (16 x 8), 28 epochs: the paper's record",
            PAPER + "; the time as reported in later public accounts of the record",
        ),
        Claim(
            "previous DAWNBench ImageNet record",
            "2 min 38 s on 128 V100, Alibaba Cloud, March 2020",
            DAWNBENCH,
        ),
        Claim(
            "ImageNet on one machine",
            "93.2 % top-5 after 40 epochs in 35.6 min on 8 A100",
            "FFCV (Leclerc et al., 2022), published ResNet-50 configurations",
        ),
    ),
    "dawnbench_cifar10": (
        Claim(
            "DAWNBench CIFAR-10 to 94 %", "74 s on one V100 (ResNet-9)", DAWNBENCH + ", Myrtle.ai"
        ),
        Claim("DAWNBench CIFAR-10 to 94 %, best entry", "9.4 s on 8 V100", DAWNBENCH),
        Claim("CIFAR-10 to 94 % today", "3.29 s on one A100", "airbench94 (Jordan, 2024)"),
    ),
}

# the benchmarks' subjects: what the paper says of each (no number is known for two)
BENCH_CLAIMS = {
    "topk": Claim(
        "top-k selection: the paper's MSTopK threshold search and this project's exact "
        "variant (tiled), each against torch.topk",
        "GPU top-k is sort-based and slow for tens of millions of elements; MSTopK replaces it "
        "with a few streaming threshold passes (no timing known to us)",
        PAPER,
    ),
    "update": Claim(
        "parallel optimizer update",
        "a parallel tensor operator speeds up the update over a CNN's many small tensors "
        "(no number known to us)",
        PAPER,
    ),
    "input": Claim(
        "multi-level data cache",
        "remote storage -> local SSD -> memory -> pre-decoded images (no number known to us)",
        PAPER,
    ),
}
