"""Where a top-k of the whole gradient lands in the embedded Transformer, per parameter.

Issue 24 item 5 (docs/protocol.md reports the numbers): one process, no DDP, dense AdamW
training of ``transformer_embedded``; at a few steps of the first 150, the share of a
top-0.1 %, 1 % and 5 % selection taken by the tied embedding, and the share of the
gradient's squared norm the selection holds.  Run from the repository root:
``PYTHONPATH=$PWD python docs/investigations/topk_share.py`` (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import torch

from bench.config import to_object
from bench.optim import build_optimizer
from bench.sweeps.common import compose
from bench.train.workload import WORKLOADS

DENSITIES = (0.001, 0.01, 0.05)
REPORT_AT = {0, 1, 5, 20, 50, 60, 100, 120, 150}


def main() -> None:
    cfg = to_object(compose(["experiment=transformer_embedded", "train.device=cpu"]))
    torch.manual_seed(0)
    wl = WORKLOADS.get("translation")(cfg, 0, 1, torch.device("cpu"))
    model = wl.model
    opt = build_optimizer(model, cfg.optim)
    params = list(model.named_parameters())
    emb = torch.tensor(["embed" in n for n, _ in params])
    owner = torch.cat([torch.full((p.numel(),), i) for i, (_, p) in enumerate(params)])
    total = owner.numel()
    print(f"{total} parameters, embedding {int(sum(p.numel() for n, p in params if 'embed' in n))}")
    wl.data.train.set_epoch(0)
    for step, batch in enumerate(wl.data.train):
        loss, _ = wl.loss(model, batch)
        loss.backward()
        if step in REPORT_AT:
            g = torch.cat([p.grad.flatten() for _, p in params])
            parts = []
            for d in DENSITIES:
                idx = g.abs().topk(max(1, int(d * total))).indices
                share = emb[owner[idx]].float().mean().item()
                mass = (g[idx] ** 2).sum().item() / (g**2).sum().item()
                parts.append(f"top {100 * d:g} %: embedding {share:.2f}, norm^2 {mass:.2f}")
            print(f"step {step} loss {loss.item():.3f} | " + " | ".join(parts), flush=True)
        opt.step()
        opt.zero_grad()
        if step >= max(REPORT_AT):
            break


if __name__ == "__main__":
    main()
