"""The method spec: one registered object per comparison method, which every analysis
module asks instead of deciding a method from its name.  It owns the overrides that select
the method and how a record is recognised as it, its typed knobs and search space, its bytes
and step time on a cluster, and its display name, colour and group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bench.cluster import perfmodel as pm
from bench.comm import cost
from bench.registry import ConfigError, Registry

#: one option of a knob: (label part, Hydra overrides keyed in full, e.g. comm.density)
Option = tuple[str, dict[str, Any]]
#: a method's search space: knob name -> its options (crossed with the learning rate)
Space = dict[str, tuple[Option, ...]]

#: the groups a method belongs to, in the order the report lists them
GROUPS = ("baseline", "paper", "peer 2020", "peer 2026", "variant", "reference")


def key(path: str, default: Any, learns: bool = True) -> Any:
    """A knob field read from the run config's dotted ``path``; ``learns=False``: it only
    changes how the same bytes are sent (two trials apart in it alone are one trial)."""
    return field(default=default, metadata={"key": path, "learns": learns})


@dataclass(frozen=True)
class Knobs:
    """What a run's config says of its method, typed: each field names its config key."""

    bucket_mb: float = key("comm.bucket_cap_mb", 25.0, learns=False)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Knobs:
        """The knobs from flat ``values`` (``{"comm.density": 0.01}``) or from a run's nested
        config; a key not given keeps its default."""
        out = {}
        for f in dataclasses.fields(cls):
            path = f.metadata["key"]
            v = values.get(path, _nested(values, path))
            if v is None:
                continue
            d = f.default
            if isinstance(d, bool):
                v = bool(v)
            elif isinstance(d, (int, float)) and not isinstance(v, (list, tuple)):
                v = type(d)(v)
            elif isinstance(d, tuple):
                v = tuple(v)
            out[f.name] = v
        return cls(**out)

    def overrides(self, *only: str) -> dict[str, Any]:
        """The Hydra overrides that set these knobs (``only``: those fields)."""
        keys = {f.name: f.metadata["key"] for f in dataclasses.fields(self)}
        return {keys[n]: getattr(self, n) for n in only or keys}


def _nested(cfg: Mapping[str, Any], path: str) -> Any:
    cur: Any = cfg
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


@dataclass(frozen=True)
class MethodSpec:
    """One comparison method.  The base prices a per-step DDP comm hook (``hook``) by its
    bucket formula; subclasses override what differs (:mod:`bench.methods.kinds`)."""

    name: str
    label: str  # display name in tables and legends
    colour: str  # one colour per method, in every figure
    group: str  # one of GROUPS
    order: int = 0  # where it stands in tables, legends and the default sweep
    doc: str = ""  # one line: what it sends
    hook: str = ""  # the DDP comm hook it runs every step ("" = its own name)
    default: bool = False  # in the protocol sweep's default methods
    min_nodes: int = 1  # nodes it needs (an inter-node stage, an outer synchronisation)
    wire_bytes: int = 4  # bytes per element its dense exchange sends
    # the knobs' type and the method's own search space: workload -> knob -> options, as a
    # function of the workload's reference steps (dense's steps to target)
    knob_type: type[Knobs] = Knobs
    spaces: Callable[[str, int], Space] | None = None
    lr_centre: Mapping[str, float] = field(default_factory=dict)  # workload -> its own rate
    extra_overrides: tuple[str, ...] = ()  # Hydra overrides beyond comm=<hook>
    width: float = 1.4  # line width in figures (the paper's methods are drawn thicker)
    one_node: tuple[str, ...] = ()  # overrides that run it on one node (each worker a node)
    benched: bool = False  # in the benchmarks' and the scaling study's default methods
    not_modelled: str = ""  # why the model's ranking (``advise``) leaves it out
    shapes_why: str = ""  # why its price needs the parameters' shapes ("" = it does not)

    kind: ClassVar[str] = "hook"  # "hook" | "optimizer" | "sync" | "reference"
    sparse: ClassVar[bool] = False  # sends a density (dense in its warm-up)
    lossy: ClassVar[bool] = False  # differs from dense's all-reduce even at density 1
    exchange_in_update: ClassVar[bool] = False  # exchanges in its optimizer step, not a hook
    # what a run's label names beside the method: (tag, key), the key read from the record
    # (dots as underscores) or else its config: ("r", "comm.powersgd_rank") -> "powersgd r=4"
    label_keys: ClassVar[tuple[tuple[str, str], ...]] = ()
    # what a timing run of one of its phases sets, in order: (knob, its prefix in the run's
    # label); a knob without a prefix is held at its default (a sparse run's schedule)
    timed: ClassVar[tuple[tuple[str, str], ...]] = (("bucket_mb", "b"),)

    @property
    def comm(self) -> str:
        """The comm hook its runs record."""
        return self.hook or self.name

    def overrides(self) -> list[str]:
        return [f"comm={self.comm}", *self.extra_overrides]

    def matches(self, rec: Mapping[str, Any]) -> bool:
        """Whether ``rec`` ran this method (an optimizer's or a sync strategy's spec is
        asked before the hook's)."""
        return str(rec.get("comm")) == self.comm

    def knobs_of(self, values: Mapping[str, Any]) -> Knobs:
        return self.knob_type.of(values)

    def space(self, workload: str, ref_steps: int) -> Space:
        """Its own knobs on ``workload`` (crossed with the learning rate by the protocol);
        a method with none tunes the optimizer's warm-up, which shapes every early step's
        rate on both workloads, so that its trials learn apart."""
        if self.spaces:
            return self.spaces(workload, ref_steps)
        opts = WARMUP_EPOCHS.get(workload, WARMUP_EPOCHS["classification"])
        return {"warmup": tuple((f"wu{e:g}ep", {"optim.warmup_epochs": e}) for e in opts)}

    def check(self, workload: str, optim: str) -> None:
        """ConfigError when the method cannot train ``workload`` with ``optim``."""

    def timing_knobs(self, k: Knobs) -> Knobs:
        """The knobs of the timing run that times a step sent with ``k`` (its key)."""
        return self.knob_type(**{f: getattr(k, f) for f, p in self.timed if p})

    def timing_label(self, k: Knobs) -> str:
        """That run's label, its records' protocol trial: ``time hitopk d0.01 b25``."""
        return " ".join(["time", self.name, *(f"{p}{getattr(k, f):g}" for f, p in self.timed if p)])

    def timing_overrides(self, k: Knobs) -> dict[str, Any]:
        return k.overrides(*(f for f, _ in self.timed))

    def period(self, k: Knobs) -> int:
        """Optimizer steps from one exchange to the next (a timing run spans whole ones)."""
        return 1

    def bucket_traffic(
        self, numel: int, n: int, m: int, k: Knobs, shapes: Any = None
    ) -> cost.Traffic:
        """The bytes of one bucket of ``numel`` elements on ``n`` x ``m`` workers."""
        return cost.allreduce(numel, n, m, self.wire_bytes)

    def traffic(
        self, buckets: Iterable[int], n: int, m: int, k: Knobs, shapes: Sequence[Any] | None = None
    ) -> cost.Traffic:
        """All buckets of one step (``shapes``: each bucket's parameter shapes)."""
        out = cost.Traffic(())
        for i, d in enumerate(buckets):
            out = out + self.bucket_traffic(d, n, m, k, shapes[i] if shapes else None)
        return out

    def bucket_time(self, d: int, c: pm.Cluster, costs: pm.Costs, k: Knobs, shapes: Any) -> float:
        """One bucket's aggregation time (s): a dense all-reduce, then the division."""
        extra = 3 if self.wire_bytes < 4 else 1  # a cast to the wire dtype and back
        return pm.dense_allreduce(d, c, costs, self.wire_bytes) + extra * d * costs.dense_s

    def aggregation_time(
        self, buckets: Sequence[int], c: pm.Cluster, costs: pm.Costs, k: Knobs, shapes: Any = None
    ) -> float:
        return sum(
            self.bucket_time(d, c, costs, k, shapes[i] if shapes else None)
            for i, d in enumerate(buckets)
        )

    def step_time(self, wl: pm.Workload, c: pm.Cluster, costs: pm.Costs, k: Knobs) -> float:
        """One training step on ``c`` (s): :meth:`price` as the workload runs there."""
        return self.price(*pm.on_cluster(wl, c, costs), k)

    def price(self, wl: pm.Workload, c: pm.Cluster, costs: pm.Costs, k: Knobs) -> float:
        """One training step (s): compute, the exposed aggregation, the update."""
        times = [
            self.bucket_time(d, c, costs, k, wl.shapes[i] if wl.shapes else None)
            for i, d in enumerate(wl.buckets)
        ]
        return wl.compute_s + pm.exposed(times, wl, self.name) + wl.update_s

    def phases(self, k: Knobs, steps: Sequence[int]) -> list[tuple[str, Knobs]]:
        """(method, knobs) each optimizer step of ``steps`` sends (a warm-up: dense)."""
        return [(self.name, k) for _ in steps]


#: the optimizer's linear warm-up (epochs): each workload's recipe's and half of it
WARMUP_EPOCHS = {"classification": (1.0, 0.5), "translation": (0.5, 0.25)}


METHODS: Registry[MethodSpec] = Registry("method")


def register(spec: MethodSpec) -> MethodSpec:
    if spec.group not in GROUPS:
        raise ConfigError(f"method {spec.name}: group {spec.group!r} is not one of {GROUPS}")
    return METHODS.register(spec.name)(spec)
