"""Parallel text for translation (``data=translation``): ``<data.root>/{train,valid,test}.
{src,tgt}`` (or the embedded corpus), one sentencepiece model for both languages, and
batches of at most ``data.max_tokens`` tokens; see docs/internals/data.md."""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock

from bench.data.cache import default_cache_dir, inspecting
from bench.data.config import DataConfig
from bench.data.corpus import SRC, TGT, embedded_root, write_corpus
from bench.data.loaders import RANK_TOKENS, SAMPLES, DataBundle, epoch_indices, eval_indices
from bench.registry import ConfigError

PAD, UNK, BOS, EOS = 0, 1, 2, 3


@dataclass
class Tokens:
    """The model inputs of a batch: padded source, padded decoder input (bos + target),
    padded decoder output (target + eos) and each sentence's line number in its split.
    ``tokens[:n]`` is its first ``n`` sentences; ``tokens.to(device)`` moves it."""

    src: torch.Tensor  # (batch, source length), int64
    tgt_in: torch.Tensor  # (batch, target length + 1)
    tgt_out: torch.Tensor  # (batch, target length + 1)
    index: torch.Tensor  # (batch,), on the host

    def __getitem__(self, rows: slice) -> Tokens:
        return Tokens(self.src[rows], self.tgt_in[rows], self.tgt_out[rows], self.index[rows])

    def __len__(self) -> int:
        return len(self.index)

    def to(self, device: torch.device | str) -> Tokens:
        return Tokens(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device),
                      self.index)  # fmt: skip


@functools.cache  # once per process: the checks run once per sweep job
def _say_once(line: str) -> None:
    print(line, flush=True)


def corpus_root(cfg: DataConfig) -> Path:
    """``data.root``, or the embedded corpus (generated on first use)."""
    if cfg.root:
        return Path(cfg.root)
    root = embedded_root(default_cache_dir(), cfg.corpus_size, 0)
    return root if inspecting() else write_corpus(root, cfg.corpus_size)  # dry run: none made


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise ConfigError(f"data=translation: {path} does not exist (a split is missing)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"data=translation: cannot read {path} ({e})") from None
    lines = text.splitlines()
    if not any(s.strip() for s in lines):
        raise ConfigError(f"data=translation: {path} is empty")
    return lines


def read_split(cfg: DataConfig, root: Path, split: str) -> tuple[list[str], list[str]]:
    """(source lines, target lines) of a split: both there, non-empty, of equal length."""
    sp, tp = root / f"{split}.{cfg.src}", root / f"{split}.{cfg.tgt}"
    src, tgt = _lines(sp), _lines(tp)
    if len(src) != len(tgt):
        raise ConfigError(
            f"data=translation: {sp} has {len(src)} lines but {tp} has {len(tgt)}; "
            "line i of one must translate line i of the other"
        )
    return src, tgt


def check(cfg: DataConfig) -> None:
    """Configuration-time checks (before any worker): settings, files, tokenizer."""
    if cfg.src == cfg.tgt:
        raise ConfigError(f"data.src and data.tgt are both {cfg.src!r}: name two languages")
    if cfg.eval_split not in ("valid", "test"):
        raise ConfigError(f"data.eval_split must be valid or test, got {cfg.eval_split!r}")
    if cfg.max_tokens < 2 or cfg.max_len < 1 or cfg.beam_size < 1 or cfg.vocab_size < 8:
        raise ConfigError(
            "data.max_tokens >= 2, data.max_len >= 1, data.beam_size >= 1 and "
            f"data.vocab_size >= 8 needed, got {cfg.max_tokens}, {cfg.max_len}, "
            f"{cfg.beam_size}, {cfg.vocab_size}"
        )
    root = corpus_root(cfg)
    names = [f"{s}.{lang}" for s in ("train", "valid", "test") for lang in (SRC, TGT)]
    made = all((root / f).is_file() for f in names)
    if inspecting() and not cfg.root and (cfg.src, cfg.tgt) == (SRC, TGT) and not made:
        _say_once(f"data=translation: the embedded corpus and its tokenizer would be made in "
                  f"{root} by the first run (not by a dry run)")  # fmt: skip
        return
    if cfg.root and not root.is_dir():  # the embedded corpus's folder is made above
        raise ConfigError(f"data.root={cfg.root!r} is not a directory")
    for split in ("train", cfg.eval_split):
        read_split(cfg, root, split)
    tokenizer(cfg, root, verbose=True)


def tokenizer(cfg: DataConfig, root: Path, verbose: bool = False) -> Any:
    """The sentencepiece processor of the run: ``data.spm_model``, or one trained on the
    training text and cached in ``root`` (keyed by its settings)."""
    # deferred: sentencepiece only for the translation workload
    import sentencepiece as spm

    if cfg.spm_model:
        path = Path(cfg.spm_model)
        try:
            sp = spm.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as e:
            why = "does not exist" if not path.exists() else f"is not a sentencepiece model ({e})"
            raise ConfigError(f"data.spm_model={cfg.spm_model}: {why}") from None
        if sp.pad_id() != PAD or sp.bos_id() != BOS or sp.eos_id() != EOS:
            raise ConfigError(
                f"data.spm_model={cfg.spm_model}: ids pad/bos/eos are "
                f"{sp.pad_id()}/{sp.bos_id()}/{sp.eos_id()}, the model needs {PAD}/{BOS}/{EOS} "
                "(train it with --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3)"
            )
        return sp
    files = [root / f"train.{cfg.src}", root / f"train.{cfg.tgt}"]
    stamp = [(p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in files]
    settings = {"vocab_size": cfg.vocab_size, "split_digits": True, "model_type": "unigram",
                "files": stamp, "version": 1}  # fmt: skip
    key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    prefix = root / f"spm-{key}"
    model = prefix.with_suffix(".model")
    if not model.is_file() and inspecting():
        _say_once(f"data=translation: the sentencepiece model would be trained into {model} "
                  "by the first run (not by a dry run)")  # fmt: skip
        return None
    if not model.is_file():
        with FileLock(str(prefix) + ".lock"):
            if not model.is_file():
                _train_spm(files, cfg.vocab_size, prefix)
    sp = spm.SentencePieceProcessor(model_file=str(model))
    if verbose:  # once per process: a sweep checks every job's config
        _say_once(
            f"data=translation: sentencepiece vocabulary {sp.get_piece_size()} "
            f"(data.vocab_size={cfg.vocab_size}, a soft limit) in {model}"
        )
    return sp


def _train_spm(files: list[Path], vocab_size: int, prefix: Path) -> None:
    # deferred: sentencepiece only for the translation workload
    import sentencepiece as spm

    tmp = prefix.with_name(f".{prefix.name}.tmp")
    try:
        spm.SentencePieceTrainer.train(
            input=[str(f) for f in files],
            model_prefix=str(tmp),
            vocab_size=vocab_size,
            hard_vocab_limit=False,  # a small corpus gets a smaller vocabulary, no error
            model_type="unigram",
            split_digits=True,
            character_coverage=1.0,
            input_sentence_size=2_000_000,
            shuffle_input_sentence=True,
            pad_id=PAD,
            unk_id=UNK,
            bos_id=BOS,
            eos_id=EOS,
            minloglevel=2,
        )
    except (OSError, RuntimeError) as e:
        raise ConfigError(
            f"data=translation: sentencepiece training failed in {prefix.parent}: {e}"
        ) from None
    Path(str(tmp) + ".vocab").replace(prefix.with_suffix(".vocab"))
    Path(str(tmp) + ".model").replace(prefix.with_suffix(".model"))


def pack(lengths: np.ndarray, order: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Greedy batches of ``order``, in that order, whose padded size (sentences x longest
    source + target, ``lengths[i] = (source, target)``) stays within ``max_tokens`` (or
    holds one sentence)."""
    out, cur, ms, mt = [], [], 0, 0
    for i in order:
        s, t = int(lengths[i, 0]), int(lengths[i, 1])
        ns, nt = max(ms, s), max(mt, t)
        if cur and (len(cur) + 1) * (ns + nt) > max_tokens:
            out.append(np.array(cur))
            cur, ns, nt = [], s, t
        cur.append(i)
        ms, mt = ns, nt
    if cur:
        out.append(np.array(cur))
    return out


def _split(batches: list[np.ndarray], steps: int) -> list[np.ndarray]:
    """Exactly ``steps`` batches: drop the surplus, or halve the largest until enough."""
    batches = list(batches[:steps])
    while len(batches) < steps:
        big = max(range(len(batches)), key=lambda k: len(batches[k]))
        if len(batches[big]) < 2:
            raise RuntimeError("too few training sentences for the steps of an epoch")
        b = batches.pop(big)
        batches += [b[: len(b) // 2], b[len(b) // 2 :]]
    return batches


@dataclass
class TokenLoader:
    """Token-budget batches of (:class:`Tokens`, gold target tokens) on ``device``."""

    src: list[np.ndarray]  # token ids per sentence (eos appended)
    tgt: list[np.ndarray]
    rank: int
    world: int
    max_tokens: int
    device: torch.device
    train: bool
    seed: int = 0
    skipped: int = 0  # training pairs left out as too long
    epoch: int = 0
    _tokens: int = field(default=0, repr=False)
    _samples: int = field(default=0, repr=False)
    _t0: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.lengths = np.array(
            [(len(s), len(t)) for s, t in zip(self.src, self.tgt)], dtype=np.int64
        ).reshape(-1, 2)
        ranks = range(self.world) if self.train else [self.rank]  # training: the same steps
        self.steps = min(len(self._plan(0, r)) for r in ranks)

    def _plan(self, epoch: int, rank: int) -> list[np.ndarray]:
        n = len(self.src)
        if not self.train:
            mine = eval_indices(n, rank, self.world)
            return pack(self.lengths, mine[np.argsort(self.lengths[mine, 0], kind="stable")],
                        self.max_tokens)  # fmt: skip
        mine = epoch_indices(n, rank, self.world, self.seed, epoch)
        window = max(1, 64 * self.max_tokens // max(1, int(self.lengths.sum(1).mean())))
        chunks = np.array_split(mine, max(1, -(-len(mine) // window)))
        order = np.concatenate(
            [c[np.argsort(self.lengths[c].sum(1), kind="stable")] for c in chunks]
        )
        batches = pack(self.lengths, order, self.max_tokens)
        g = np.random.default_rng([self.seed, epoch, rank])
        return [batches[k] for k in g.permutation(len(batches))]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.steps

    def epoch_stats(self) -> dict[str, Any]:
        """This rank's sentences, source + target tokens (no padding) and their rate since
        the last call; the training pairs skipped as too long (the whole split's)."""
        dt = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        out = {
            SAMPLES: self._samples,
            RANK_TOKENS: self._tokens,
            "throughput/rank_tokens_per_s": self._tokens / dt if dt > 0 else 0.0,
            "data/skipped_long": self.skipped,
        }
        self._samples, self._tokens, self._t0 = 0, 0, None
        return out

    def batch(self, idx: np.ndarray) -> tuple[Tokens, torch.Tensor]:
        ls, lt = self.lengths[idx, 0], self.lengths[idx, 1]
        src = torch.full((len(idx), int(ls.max())), PAD, dtype=torch.long)
        tgt = torch.full((len(idx), int(lt.max()) + 1), PAD, dtype=torch.long)
        for j, i in enumerate(idx):
            src[j, : ls[j]] = torch.from_numpy(self.src[i])
            tgt[j, 0] = BOS
            tgt[j, 1 : lt[j] + 1] = torch.from_numpy(self.tgt[i])
        tgt_in = tgt[:, :-1].masked_fill(tgt[:, :-1] == EOS, PAD)  # eos is never an input
        x = Tokens(src, tgt_in, tgt[:, 1:], torch.from_numpy(idx)).to(self.device)
        return x, x.tgt_out[x.tgt_out != PAD]  # the labels: target + eos, row-major

    def __iter__(self) -> Iterator[tuple[Tokens, torch.Tensor]]:
        plan = self._plan(self.epoch, self.rank)
        if self.train:
            plan = _split(plan, self.steps)
        if self._t0 is None:
            self._t0 = time.perf_counter()
        for idx in plan:
            x, y = self.batch(idx)
            self._samples += len(idx)
            self._tokens += int(self.lengths[idx].sum())
            yield x, y


@dataclass
class TranslationBundle(DataBundle):
    """``num_classes`` = vocabulary size; the tokenizer and held-out lines for evaluation."""

    tokenizer: Any = None
    eval_src: list[str] = field(default_factory=list)
    eval_ref: list[str] = field(default_factory=list)


def encode(sp: Any, lines: list[str]) -> list[np.ndarray]:
    return [np.array(ids + [EOS], dtype=np.int64) for ids in sp.encode(lines)]


def build(
    cfg: DataConfig, cache: Any, rank: int, world: int, device: torch.device, seed: int
) -> TranslationBundle:
    root = corpus_root(cfg)
    sp = tokenizer(cfg, root)
    src, tgt = read_split(cfg, root, "train")
    s_ids, t_ids = encode(sp, src), encode(sp, tgt)
    keep = [
        i
        for i, (s, t) in enumerate(zip(s_ids, t_ids))
        if max(len(s), len(t)) <= cfg.max_len and len(s) + len(t) <= cfg.max_tokens
    ]
    skipped = len(s_ids) - len(keep)
    if skipped and rank == 0:
        print(
            f"data=translation: {skipped} of {len(s_ids)} training pairs skipped, longer than "
            f"data.max_len={cfg.max_len} tokens or than data.max_tokens={cfg.max_tokens} alone",
            flush=True,
        )
    train = TokenLoader([s_ids[i] for i in keep], [t_ids[i] for i in keep], rank, world,
                        cfg.max_tokens, device, True, seed, skipped)  # fmt: skip
    vs, vt = read_split(cfg, root, cfg.eval_split)
    ev_src = [ids[: cfg.max_len - 1] + [EOS] for ids in sp.encode(vs)]
    ev = TokenLoader([np.array(s, dtype=np.int64) for s in ev_src], encode(sp, vt), rank,
                     world, cfg.max_tokens, device, False, seed)  # fmt: skip
    return TranslationBundle(
        train, ev, sp.get_piece_size(), len(keep), 1, tokenizer=sp, eval_src=vs, eval_ref=vt
    )
