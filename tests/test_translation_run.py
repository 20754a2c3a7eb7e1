"""The translation workload end to end: a 2-worker run records BLEU and its translations
file (and the BLEU is sacrebleu's score of that file); greedy decoding of a model trained to
copy returns its input; the embedded experiment reaches its BLEU target (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from bench.data.corpus import write_corpus
from bench.results.records import RECORD_FIELDS
from tests.conftest import run_cli

RUN = [
    "experiment=transformer_embedded",
    "train.progress=false",
    "results.plot=false",
    "data.max_tokens=512",
    "train.max_steps_per_epoch=3",
]


def _record(results: Path) -> dict:
    lines = (results / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def _check_bleu(rec: dict, corpus: Path) -> None:
    import sacrebleu

    hyps = Path(rec["translations"]).read_text().splitlines()
    refs = (corpus / "valid.sym").read_text().splitlines()
    assert len(hyps) == len(refs)  # one line per source line, in order
    curve = pd.read_csv(rec["curve"])
    last = curve["eval/bleu"].dropna().iloc[-1]
    assert last == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score / 100, abs=1e-9)
    assert rec["best_value"] == pytest.approx(curve["eval/bleu"].max())
    assert (curve["eval/ppl"] > 1).all() and (curve["data/rank_tokens"] > 0).all()


def test_two_worker_run_records_bleu_and_translations(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus", train=400, valid=40, test=40)
    res = tmp_path / "res"
    p = run_cli(
        "train",
        *RUN,
        f"data.root={corpus}",
        f"results.dir={res}",
        "train.epochs=1",
        "comm=hitopk",
        "comm.procs_per_node=1",  # each worker a node: the sparse inter-node path
        "optim.update=flat",
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = _record(res)
    assert set(RECORD_FIELDS) <= set(rec)
    assert rec["status"] == "target_missed" and rec["target_metric"] == "bleu"
    assert rec["model"] == "transformer_tiny" and rec["data"] == "translation"
    assert rec["comm"] == "hitopk" and rec["update"] == "flat" and rec["world_size"] == 2
    assert rec["translations"] == str(res / "translations" / f"{rec['run_id']}.txt")
    assert rec["comm_bytes_per_step"] > 0 and rec["throughput_samples_per_s"] > 0
    _check_bleu(rec, corpus)
    # source + target tokens of both workers: more than rank 0's own, more than the
    # target tokens alone (the loop's "samples"), and the record's rate is theirs
    curve = pd.read_csv(res / "curves" / f"{rec['run_id']}.csv")
    tokens, mine = curve["data/tokens"], curve["data/rank_tokens"]
    assert (tokens > 1.5 * mine).all() and (tokens < 2.5 * mine).all()
    assert (tokens > curve["data/samples"]).all()
    assert curve["throughput/tokens_per_s"].iloc[0] == pytest.approx(
        tokens.iloc[0] / curve["clock/epoch_s"].iloc[0]
    )
    assert rec["throughput_tokens_per_s"] == pytest.approx(tokens.sum() / rec["train_time_s"])


def test_greedy_decoding_of_a_model_trained_to_copy_returns_its_input() -> None:
    from bench.models.transformer import BOS, EOS, PAD, Transformer, beam_search, greedy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small model: more threads only contend on a shared machine
    torch.manual_seed(0)
    model = Transformer(10, layers=1, d_model=32, heads=4, ffn=64, dropout=0.0, pre_norm=True)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sources of 2..6 symbols (ids 4..9) + eos; the decoder input is bos + source."""
        lens = torch.randint(2, 7, (n, 1))
        pos = torch.arange(7)[None]
        src = (
            torch.randint(4, 10, (n, 7)).masked_fill(pos > lens, PAD).masked_fill(pos == lens, EOS)
        )
        tgt_in = torch.cat([torch.full((n, 1), BOS), src[:, :-1]], 1)
        return src, tgt_in.masked_fill(tgt_in == EOS, PAD)

    try:
        for _ in range(300):
            src, tgt_in = batch(32)
            logits = model(src, tgt_in)
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), src, ignore_index=PAD)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        src, _ = batch(50)
        want = [[t for t in row if t > EOS] for row in src.tolist()]
        assert greedy(model, src) == want
        assert beam_search(model, src, beam=3) == want
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_embedded_experiment_reaches_its_bleu_target(tmp_path: Path) -> None:
    p = run_cli("dawnbench", "data=translation", f"results.dir={tmp_path}", "train.progress=false")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = _record(tmp_path)
    assert rec["status"] == "ok" and rec["best_value"] >= rec["target_value"]
    assert rec["time_to_target_s"] < 300  # the 2-worker CPU budget of the recipe
