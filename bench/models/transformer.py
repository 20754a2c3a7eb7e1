"""Encoder-decoder Transformer (Vaswani et al., 2017) on torch's own encoder and decoder
layers, with sinusoidal positions and one shared embedding; base, big and tiny sizes
(docs/internals/models.md)."""

from __future__ import annotations

import math

import torch
from torch import nn

from bench.models.config import ModelConfig

PAD = 0

DIMS = {  # name -> (layers per stack, d_model, heads, FFN)
    "transformer_base": (6, 512, 8, 2048),
    "transformer_big": (6, 1024, 16, 4096),
    "transformer_tiny": (2, 128, 4, 512),
}


def sinusoids(length: int, d: int) -> torch.Tensor:
    """(length, d) sinusoidal positions: sin on even, cos on odd dimensions."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]
    inv = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(length, d)
    pe[:, 0::2] = torch.sin(pos * inv)
    pe[:, 1::2] = torch.cos(pos * inv)
    return pe


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean "ignore" mask as the additive float mask the causal mask is (one kind)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))


class Transformer(nn.Module):
    """``forward(src, tgt_in) -> logits`` of shape (batch, target length, vocabulary)."""

    def __init__(
        self,
        vocab: int,
        layers: int = 6,
        d_model: int = 512,
        heads: int = 8,
        ffn: int = 2048,
        dropout: float = 0.1,
        pre_norm: bool = False,
        max_positions: int = 1024,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, 0.0, d_model**-0.5)
        with torch.no_grad():
            self.embed.weight[PAD].zero_()
        self.register_buffer("positions", sinusoids(max_positions, d_model), persistent=False)
        self.drop = nn.Dropout(dropout)
        common = dict(d_model=d_model, nhead=heads, dim_feedforward=ffn, dropout=dropout)
        common.update(batch_first=True, norm_first=pre_norm)
        enc_norm, dec_norm = (nn.LayerNorm(d_model) if pre_norm else None for _ in range(2))
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**common), layers, enc_norm, enable_nested_tensor=False
        )
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**common), layers, dec_norm)
        for name, p in self.named_parameters():
            if p.dim() > 1 and not name.startswith("embed"):
                nn.init.xavier_uniform_(p)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) * math.sqrt(self.d_model)
        return self.drop(x + self.positions[: tokens.shape[1]].to(x.dtype))

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(memory, source padding mask)."""
        mask = src == PAD
        return self.encoder(self._embed(src), src_key_padding_mask=mask), mask

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor):
        """Logits for every position of ``tgt_in`` (causal self-attention)."""
        t = tgt_in.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(t, tgt_in.device, memory.dtype)
        h = self.decoder(
            self._embed(tgt_in),
            memory,
            tgt_mask=causal,
            tgt_key_padding_mask=_additive(tgt_in == PAD, memory.dtype),
            memory_key_padding_mask=_additive(src_mask, memory.dtype),
        )
        return h @ self.embed.weight.t()  # the output projection shares the embedding

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        memory, mask = self.encode(src)
        return self.decode(tgt_in, memory, mask)


def build(name: str, cfg: ModelConfig, vocab: int) -> Transformer:
    return Transformer(vocab, *DIMS[name], cfg.dropout, cfg.pre_norm, cfg.max_positions)


# --- decoding ------------------------------------------------------------------------

BOS, EOS = 2, 3


def _max_len(src: torch.Tensor, max_positions: int) -> int:
    return min(max_positions - 1, int((src != PAD).sum(1).max()) * 3 // 2 + 10)


@torch.no_grad()
def greedy(model: Transformer, src: torch.Tensor, max_positions: int = 1024) -> list[list[int]]:
    """The most likely next token, step by step, until eos: token ids per sentence."""
    memory, mask = model.encode(src)
    ys = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for _ in range(_max_len(src, max_positions)):
        nxt = model.decode(ys, memory, mask)[:, -1].argmax(-1).masked_fill(done, PAD)
        ys = torch.cat([ys, nxt[:, None]], 1)
        done |= nxt == EOS
        if bool(done.all()):
            break
    return [_strip(row) for row in ys[:, 1:].tolist()]


def _strip(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS)] if EOS in ids else [i for i in ids if i != PAD]


@torch.no_grad()
def beam_search(
    model: Transformer, src: torch.Tensor, beam: int, max_positions: int = 1024, alpha: float = 1.0
) -> list[list[int]]:
    """Beam search of width ``beam``; hypotheses ranked by log-probability / length**alpha."""
    b, k = src.shape[0], beam
    memory, mask = model.encode(src)
    memory, mask = memory.repeat_interleave(k, 0), mask.repeat_interleave(k, 0)
    ys = torch.full((b * k, 1), BOS, dtype=torch.long, device=src.device)
    scores = torch.full((b, k), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # one live hypothesis per sentence at first
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    steps = _max_len(src, max_positions)
    for step in range(steps):
        logp = torch.log_softmax(model.decode(ys, memory, mask)[:, -1].float(), -1)
        v = logp.shape[-1]
        top, idx = (scores.view(-1, 1) + logp).view(b, k * v).topk(2 * k, dim=1)
        rows = torch.arange(b * k, device=src.device)  # dead rows keep their place
        toks = torch.full((b * k,), PAD, dtype=torch.long, device=src.device)
        new = torch.full((b, k), float("-inf"), device=src.device)
        for i in range(b):
            n = 0
            for s, j in zip(top[i].tolist(), idx[i].tolist()):
                if s == float("-inf") or n == k or len(finished[i]) >= k:
                    break
                row, tok = i * k + j // v, j % v
                if tok == EOS or step == steps - 1:
                    finished[i].append((s / (step + 1) ** alpha, ys[row, 1:].tolist()))
                else:
                    rows[i * k + n], toks[i * k + n], new[i, n] = row, tok, s
                    n += 1
        if all(len(f) >= k for f in finished):
            break
        ys, scores = torch.cat([ys[rows], toks[:, None]], 1), new
    return [_strip(max(f)[1]) if f else [] for f in finished]


def translate(
    model: Transformer, src: torch.Tensor, beam: int = 1, max_positions: int = 1024
) -> list[list[int]]:
    """Token ids of the translation of each source row: greedy (``beam=1``) or beam search."""
    if beam <= 1:
        return greedy(model, src, max_positions)
    return beam_search(model, src, beam, max_positions)
