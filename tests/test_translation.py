"""The translation workload's parts: the generated corpus, token batches, the tokenizer,
decoding, and every bad input refused with one line naming it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bench.data.config import DataConfig
from bench.data.corpus import SRC, TGT, write_corpus
from bench.data.translation import EOS, PAD, TokenLoader, build, check, pack
from bench.registry import ConfigError

SPLITS = ("train", "valid", "test")


def _lines(root: Path, split: str, lang: str) -> list[str]:
    return (root / f"{split}.{lang}").read_text().splitlines()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"), train=600, valid=60, test=60)


def test_corpus_is_deterministic_disjoint_and_not_a_copy(corpus: Path, tmp_path: Path) -> None:
    import sacrebleu

    again = write_corpus(tmp_path / "again", train=600, valid=60, test=60)
    for split in SPLITS:
        for lang in (SRC, TGT):
            assert (corpus / f"{split}.{lang}").read_bytes() == (
                again / f"{split}.{lang}"
            ).read_bytes()
    src = {s: set(_lines(corpus, s, SRC)) for s in SPLITS}
    assert [len(src[s]) for s in SPLITS] == [600, 60, 60]  # no repeated sentence either
    assert not src["train"] & src["valid"] and not src["train"] & src["test"]
    assert not src["valid"] & src["test"]
    assert "hundred" in " ".join(src["train"]) and not any(c.isdigit() for c in str(src))
    assert any(c.isdigit() for c in "".join(_lines(corpus, "test", TGT)))
    other = write_corpus(tmp_path / "seed1", train=600, valid=60, test=60, seed=1)
    assert _lines(other, "train", SRC) != _lines(corpus, "train", SRC)
    # copying the source scores almost nothing: the target must be translated
    refs, srcs = _lines(corpus, "valid", TGT), _lines(corpus, "valid", SRC)
    assert sacrebleu.corpus_bleu(srcs, [refs]).score < 2.0
    assert sacrebleu.corpus_bleu(refs, [refs]).score == pytest.approx(100.0)


def test_pack_keeps_every_padded_batch_within_max_tokens() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=(500, 2))
    lengths[7] = (90, 30)  # alone larger than the budget: a batch of one
    order = rng.permutation(500)
    batches = pack(lengths, order, 100)
    assert sorted(np.concatenate(batches).tolist()) == list(range(500))
    for b in batches:
        padded = len(b) * (lengths[b, 0].max() + lengths[b, 1].max())
        assert padded <= 100 or len(b) == 1


def _loader(rank: int, n: int = 300, max_tokens: int = 64, train: bool = True) -> TokenLoader:
    rng = np.random.default_rng(1)
    src, tgt = (
        [np.append(rng.integers(4, 20, size=int(k)), EOS) for k in rng.integers(0, 12, size=n)]
        for _ in range(2)
    )
    return TokenLoader(src, tgt, rank, 2, max_tokens, torch.device("cpu"), train, seed=3)


def test_token_batches_shard_reshuffle_and_respect_max_tokens() -> None:
    loaders = [_loader(0), _loader(1)]
    assert len(loaders[0]) == len(loaders[1]) > 1  # every rank takes the same steps
    seen = {}
    for epoch in (0, 1):
        per_rank = []
        for ld in loaders:
            ld.set_epoch(epoch)
            got = list(ld)
            assert len(got) == len(ld)
            for x, y in got:
                assert x.src.numel() + x.tgt_in.numel() <= 64
                # the labels are the non-pad target tokens, eos included, one per input
                assert len(y) == int((x.tgt_in != PAD).sum()) and int((y == EOS).sum()) == len(
                    x.index
                )
            per_rank.append(np.concatenate([x.index.numpy() for x, _ in got]))
            assert ld.epoch_stats()["data/rank_samples"] == len(per_rank[-1])
        assert not set(per_rank[0]) & set(per_rank[1])  # ranks read disjoint shards
        seen[epoch] = per_rank[0]
    assert seen[0].tolist() != seen[1].tolist()  # reshuffled every epoch
    ev = [_loader(r, train=False) for r in (0, 1)]
    scored = np.concatenate([x.index.numpy() for ld in ev for x, _ in ld])
    assert sorted(scored.tolist()) == list(range(300))  # every held-out line exactly once


def _cfg(root: Path, **kw) -> DataConfig:
    return DataConfig(name="translation", root=str(root), **{"vocab_size": 200, **kw})


def test_vocabulary_adapts_to_a_small_corpus_and_long_pairs_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = write_corpus(tmp_path, train=80, valid=10, test=10)
    check(_cfg(root, vocab_size=8000))  # far more than 80 lines support: no crash
    out = capsys.readouterr().out
    assert "sentencepiece vocabulary" in out and "soft limit" in out
    b = build(_cfg(root, vocab_size=8000, max_len=12), None, 0, 1, torch.device("cpu"), 0)
    assert 8 < b.num_classes < 8000
    assert b.train.skipped > 0 and "training pairs skipped" in capsys.readouterr().out
    assert b.train.epoch_stats()["data/skipped_long"] == b.train.skipped
    assert len(b.train.src) == 80 - b.train.skipped and len(b.eval_ref) == 10
    assert all(len(s) <= 12 and len(t) <= 12 for s, t in zip(b.train.src, b.train.tgt))


def test_bad_input_is_refused_with_one_line_naming_it(tmp_path: Path) -> None:
    root = write_corpus(tmp_path / "c", train=80, valid=10, test=10)
    with pytest.raises(ConfigError, match="data.src and data.tgt are both 'en'"):
        check(_cfg(root, tgt="en"))
    (root / "valid.sym").write_text("only one line\n")
    with pytest.raises(ConfigError, match=r"valid\.en has 10 lines but .*valid\.sym has 1"):
        check(_cfg(root))
    (root / "valid.sym").unlink()
    with pytest.raises(ConfigError, match=r"valid\.sym does not exist \(a split is missing\)"):
        check(_cfg(root))
    with pytest.raises(ConfigError, match=r"train\.fr does not exist"):
        check(_cfg(root, tgt="fr", eval_split="test"))
    (root / "test.sym").write_text("\n\n")
    with pytest.raises(ConfigError, match=r"test\.sym is empty"):
        check(_cfg(root, eval_split="test"))
    with pytest.raises(ConfigError, match="data.eval_split must be valid or test"):
        check(_cfg(root, eval_split="dev"))
    good = write_corpus(tmp_path / "good", train=80, valid=10, test=10)
    with pytest.raises(ConfigError, match=r"data.spm_model=.*nope.model: does not exist"):
        check(_cfg(good, spm_model=str(tmp_path / "nope.model")))
    (tmp_path / "bad.model").write_text("not a model")
    with pytest.raises(ConfigError, match="is not a sentencepiece model"):
        check(_cfg(good, spm_model=str(tmp_path / "bad.model")))
    with pytest.raises(ConfigError, match="data.max_tokens >= 2"):
        check(_cfg(good, max_tokens=0))


def test_bench_comm_uses_transformer_base_real_buckets() -> None:
    from bench.benchmarks.comm import MODELS, model_buckets

    assert "transformer_base" in MODELS
    buckets = model_buckets("transformer_base", vocab=32000)
    shapes = [s for b in buckets for s in b]
    # every parameter once; the shared embedding/output projection is one 32000 x 512 matrix
    from bench.models import build_model
    from bench.models.config import ModelConfig

    model = build_model(ModelConfig(name="transformer_base"), 32000)
    assert sorted(shapes) == sorted(p.shape for p in model.parameters())
    assert shapes.count(torch.Size([32000, 512])) == 1 and len(buckets) > 2
