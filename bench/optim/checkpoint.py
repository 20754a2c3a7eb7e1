"""Checkpoints of flat optimizers in the standard torch format (per-parameter tensors
keyed by index), interchangeable with torch's own optimizers' (see bench.optim.flat)."""

from __future__ import annotations

from typing import Any

import torch

from bench.optim.spec import keep_mode_keys


class FlatCheckpoint:
    """``state_dict``/``load_state_dict`` of ``FlatOptimizer`` (a mixin before
    ``torch.optim.Optimizer``)."""

    buckets: list
    param_groups: list[dict[str, Any]]
    state: Any

    def _expose_state(self, bi: int, k: int) -> None:
        """Per-parameter views of the flat state, as torch.optim keeps ``self.state``."""
        b = self.buckets[bi]
        st: dict[str, Any] = {name: b.view(buf, k) for name, buf in b.state.items()}
        st.update(self._extra_state(bi, k))
        if b.has_master:
            st["master_param"] = b.view(b.master, k)
        if st:
            self.state[b.params[k]] = st

    def _extra_state(self, bi: int, k: int) -> dict[str, Any]:
        return {}

    def _reset_state(self) -> None:
        """No optimizer state, as a new optimizer (before a load)."""
        self.state.clear()
        for b in self.buckets:
            b.initialized = [False] * len(b.params)
            for buf in b.state.values():
                buf.zero_()

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        # a torch optimizer increments each "step" tensor separately: never share them
        for st in sd["state"].values():
            if isinstance(st.get("step"), torch.Tensor):
                st["step"] = st["step"].clone()
        return sd

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # a master_param that another update mode carried through is stale: only a flat
        # optimizer keeps it in step with the weights
        saved_by_flat = all(g.get("flat") for g in state_dict["param_groups"])
        sd = keep_mode_keys(self, state_dict)
        index = self._match_groups(sd)
        where = {
            id(p): (bi, k) for bi, b in enumerate(self.buckets) for k, p in enumerate(b.params)
        }
        self._reset_state()
        for idx, st in sd["state"].items():
            bi, k = where[id(index[idx])]
            b = self.buckets[bi]
            for name, buf in b.state.items():
                v = st.get(name)
                if v is not None:
                    b.view(buf, k).copy_(v)
            if b.has_master:
                b.load_master(k, st.get("master_param") if saved_by_flat else None)
            self._load_extra_state(bi, k, st)
            b.initialized[k] = True
            self._expose_state(bi, k)
        self.sync_master_from_model()  # every other master follows the model

    def _match_groups(self, sd: dict[str, Any]) -> dict[int, torch.nn.Parameter]:
        """Take the saved groups' hyper-parameters; saved parameter index -> parameter."""
        if len(sd["param_groups"]) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        index: dict[int, torch.nn.Parameter] = {}
        for own, saved in zip(self.param_groups, sd["param_groups"], strict=True):
            if len(own["params"]) != len(saved["params"]):
                raise ValueError(
                    "loaded state dict contains a parameter group that doesn't match the size "
                    "of optimizer's group"
                )
            index.update(zip(saved["params"], own["params"], strict=True))
            own.update({k: v for k, v in saved.items() if k != "params"})
        return index

    def _load_extra_state(self, bi: int, k: int, st: dict[str, Any]) -> None:
        pass
