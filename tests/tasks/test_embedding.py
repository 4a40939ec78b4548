"""Fine-tuning an embedding model (task: embedding) end to end on the CPU: train, save, reload, resume.

* NLI triplets (AllNLI's layout, from SNLI dev) scored on STS-B dev at two Matryoshka widths:
  best/ loads in sentence-transformers with the vectors bert-kit computes, and a run resumed from
  a checkpoint reaches the weights of the uninterrupted one.
* GradCache through the whole job: `embedding.cached` with mini-batches of 5 texts trains to the
  weights of the uncached run (dropout off, 1e-5), padded and packed; a learned scale included.
* A BEIR folder's qrels train, its dev split scores (nDCG@10 picks best/), in batches without a
  repeated text.

Run: .venv/bin/python -m pytest tests/tasks/test_embedding.py -q
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file
from torch.testing import assert_close

from bert_kit.checks import ConfigError
from bert_kit.config import BertConfig
from bert_kit.data.no_duplicates import NoDuplicatesSampler
from bert_kit.model import BERTModel
from bert_kit.model_folder import read_model_metadata
from bert_kit.tasks.finetuning import FinetuneConfig, finetune
from bert_kit.tokenizer import get_tokenizer
from tests.retrieval.beir_files import DOCS, QRELS, QUERIES, write_beir

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def still_encoder(tmp_path_factory, minilm_path):
    """A random tiny encoder (width 32) with MiniLM's tokenizer and dropout off."""
    folder = tmp_path_factory.mktemp("still")
    torch.manual_seed(0)
    BERTModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)).save_pretrained(folder)
    get_tokenizer(minilm_path).save(folder)
    return folder


@pytest.fixture(scope="module")
def nli(data_dir, tmp_path_factory):
    """SNLI dev's first 300 pairs (96 triplets) and STS-B dev's first 40 pairs."""
    folder = tmp_path_factory.mktemp("nli")
    lines = (data_dir / "nli" / "snli-dev.jsonl").read_text().splitlines()[:300]
    (folder / "nli.jsonl").write_text("\n".join(lines) + "\n")
    sts = (data_dir / "stsb" / "sts-dev.csv").read_text().splitlines()[:40]
    (folder / "sts-dev.csv").write_text("\n".join(sts) + "\n")
    return folder / "nli.jsonl", folder / "sts-dev.csv"


def config(model, out, **kw) -> FinetuneConfig:
    settings = dict(task="embedding", model=str(model), output_dir=str(out), batch_size=8, lr=1e-3, log_every=1,
                    precision="fp32", device="cpu", seed=3, max_length=32)
    return FinetuneConfig(**{**settings, **kw})


def test_train_save_reload_resume(tiny_encoder, nli, tmp_path):
    train, dev = nli
    cfg = config(tiny_encoder, tmp_path / "a", train_file=str(train), validation_file=str(dev), max_steps=6,
                 eval_every=3, save_every=2, keep_last=0, embedding={"matryoshka_dims": [32, 16]})
    results = finetune(cfg)
    assert results["metric"] == "spearman" and [h["step"] for h in results["history"]] == [3, 6]
    assert {"spearman", "pearson", "spearman_dim16", "pearson_dim16"} <= set(results["history"][-1])
    best = tmp_path / "a" / "best"
    meta = read_model_metadata(best)
    assert meta["task"] == "embedding" and meta["pooling"] == "mean" and meta["matryoshka_dims"] == [32, 16]
    assert "logit_scale" not in load_file(best / "model.safetensors")  # the encoder alone, a plain BertModel
    st = pytest.importorskip("sentence_transformers")
    from bert_kit.embeddings import SentenceEncoder

    texts = ["A man is playing a guitar.", "Two dogs run in the snow.", "Nobody is here."]
    want = st.SentenceTransformer(str(best), device="cpu").encode(texts)
    assert_close(torch.tensor(SentenceEncoder.from_pretrained(best).encode(texts)), torch.tensor(want),
                 rtol=1e-5, atol=1e-5)
    # lose the steps after 4 (as a crash would), resume from the newest checkpoint: the same weights
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for step in ("step-0000006",):
        shutil.rmtree(tmp_path / "b" / "checkpoints" / step)
    (tmp_path / "b" / "results.json").unlink()
    resumed = finetune(config(tiny_encoder, tmp_path / "b", train_file=str(train), validation_file=str(dev),
                              max_steps=6, eval_every=3, save_every=2, keep_last=0,
                              embedding={"matryoshka_dims": [32, 16]}), resume="latest")
    assert resumed["steps"] == 6 and resumed["best_value"] == results["best_value"]
    a = load_file(tmp_path / "a" / "checkpoints" / "step-0000006" / "model.safetensors")
    b = load_file(tmp_path / "b" / "checkpoints" / "step-0000006" / "model.safetensors")
    for k in a:
        assert_close(b[k], a[k], rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("unpadded", [True, False])
def test_cached_training_reaches_the_weights_of_the_uncached_run(still_encoder, nli, tmp_path, unpadded):
    train, _ = nli
    runs = {}
    for name, group in (("plain", {}), ("cached", {"cached": True, "mini_batch_size": 5})):
        cfg = config(still_encoder, tmp_path / name, train_file=str(train), max_steps=3, unpadded=unpadded,
                     end_checkpoint=True, embedding={"scale": "learned", "loss": "symmetric", **group})
        runs[name] = finetune(cfg)
    plain = load_file(tmp_path / "plain" / "checkpoints" / "step-0000003" / "model.safetensors")
    cached = load_file(tmp_path / "cached" / "checkpoints" / "step-0000003" / "model.safetensors")
    assert plain["logit_scale"] != pytest.approx(math.log(20.0))  # the scale learned something
    for k in plain:
        assert_close(cached[k], plain[k], rtol=1e-5, atol=1e-5, msg=k)
    assert runs["cached"]["train_loss"] == pytest.approx(runs["plain"]["train_loss"], rel=1e-5)


def test_beir_qrels_train_and_a_beir_split_scores(tiny_encoder, tmp_path, monkeypatch):
    folder = write_beir(tmp_path / "beir", split="train")
    # the dev split: two of the queries (the qrels of every query of the test fixture, as dev)
    dev = {q: QRELS[q] for q in ("q1", "q3")}
    write_beir(folder, DOCS, QUERIES, dev, split="dev")
    samplers = []
    original = NoDuplicatesSampler.__init__

    def record(self, *args, **kwargs):
        original(self, *args, **kwargs)
        samplers.append(self)

    monkeypatch.setattr(NoDuplicatesSampler, "__init__", record)
    cfg = config(tiny_encoder, tmp_path / "run", train_file=str(folder), validation_file=str(folder), batch_size=4,
                 max_steps=2, eval_every=1)
    results = finetune(cfg)
    assert results["metric"] == "ndcg@10" and results["num_eval_examples"] == 2 + len(DOCS)
    assert results["history"][-1]["num_queries"] == 2 and results["best_step"] in (1, 2)
    sampler = samplers[0]  # 8 pairs, q1 q2 q3 twice each: no batch of 4 holds a query twice
    for batch in sampler.global_batches():
        keys = [k for i in batch for k in sampler.keys[i]]
        assert len(keys) == len(set(keys))


def test_known_positives_of_a_beir_folder_are_no_negatives(tiny_encoder, tmp_path, monkeypatch):
    """embedding.exclude_known_positives: a document relevant to two queries of a batch is left out
    of each one's negatives, and only such documents (whatever the batch), by every pair of the
    training data, those past max_train_examples too."""
    import bert_kit.tasks.embedding as embedding

    shared = {"q1": {"d1": 1, "d3": 1}, "q3": {"d1": 1, "d11": 1}, "q2": {"d4": 1, "d6": 1}, "q4": {"d5": 1, "d3": 1}}
    folder = write_beir(tmp_path / "beir", DOCS, QUERIES, shared, split="train")
    seen = []
    original = embedding.known_positives

    def spy(anchor_keys, candidate_keys, pairs, texts):
        out = original(anchor_keys, candidate_keys, pairs, texts)
        seen.append((anchor_keys.tolist(), candidate_keys.tolist(), out.tolist()))
        return out

    monkeypatch.setattr(embedding, "known_positives", spy)
    cfg = config(tiny_encoder, tmp_path / "run", train_file=str(folder), batch_size=4, max_steps=6,
                 max_train_examples=7, embedding={"exclude_known_positives": True})  # the 8th pair is known too
    finetune(cfg)
    assert len(seen) == 6  # one mask a step
    from bert_kit.retrieval.beir import read_beir
    from bert_kit.retrieval.mining import pairs_from_beir

    anchors, positives = pairs_from_beir(read_beir(folder, "train"))
    text = list(dict.fromkeys([*anchors, *positives]))  # text ids: in order of first appearance, column by column
    relevant = set(zip(anchors, positives))
    left_out = 0
    for anchor_keys, candidate_keys, mask in seen:
        for i, a in enumerate(anchor_keys):
            for j, c in enumerate(candidate_keys):
                assert mask[i][j] == ((text[a], text[c]) in relevant), (text[a], text[c])
                left_out += mask[i][j] and j != i
    assert left_out > 0  # the shared documents met another of their queries at least once


def test_the_settings_are_checked(tiny_encoder, nli):
    train, _ = nli
    ok = dict(model=str(tiny_encoder), task="embedding", train_file=str(train))
    FinetuneConfig(**ok, metric="ndcg@10_dim16", embedding={"matryoshka_dims": [32, 16]})
    with pytest.raises(ConfigError, match="metric='ndcg@10_dim16' is not a validation metric of task embedding"):
        FinetuneConfig(**ok, metric="ndcg@10_dim16")
    with pytest.raises(ConfigError, match="matryoshka_dims must be distinct positive integers"):
        FinetuneConfig(**ok, embedding={"matryoshka_dims": [32, 32]})
    with pytest.raises(ConfigError, match="matryoshka_weights needs one weight per matryoshka_dims"):
        FinetuneConfig(**ok, embedding={"matryoshka_dims": [32, 16], "matryoshka_weights": [1.0]})
    with pytest.raises(ConfigError, match="embedding.scale"):
        FinetuneConfig(**ok, embedding={"scale": 0})
    with pytest.raises(ConfigError, match="embedding.loss='infonce' is not a valid choice"):
        FinetuneConfig(**ok, embedding={"loss": "infonce"})
    weights = FinetuneConfig(**ok, embedding={"matryoshka_dims": [16, 32], "matryoshka_weights": [0.5, 1.0]}).embedding
    assert weights.matryoshka_dims == [32, 16] and weights.matryoshka_weights == [1.0, 0.5]  # widest first, in step


def test_matryoshka_wider_than_the_model_is_refused(tiny_encoder, nli, tmp_path):
    train, _ = nli
    with pytest.raises(ValueError, match=r"matryoshka_dims \[64, 16\] exceeds the model's width 32"):
        finetune(config(tiny_encoder, tmp_path / "run", train_file=str(train), max_steps=1,
                        embedding={"matryoshka_dims": [64, 16]}))


def test_the_command_line_trains_from_mined_negatives(tiny_encoder, tmp_path, capsys):
    from bert_kit.cli import main

    mined = tmp_path / "hard.jsonl"
    rows = [{"anchor": f"question {i}", "positive": f"answer {i}", "negative_1": f"other {i}", "scores": [0.9, 0.2]}
            for i in range(12)]
    mined.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = main(["finetune", "--task", "embedding", f"model={tiny_encoder}", f"train_file={mined}", "max_steps=2",
               "batch_size=4", "device=cpu", f"output_dir={tmp_path / 'run'}"])
    assert rc == 0
    assert "hard.jsonl: 12 rows of 3 texts (anchor, positive, negative_1)" in capsys.readouterr().out
    assert (tmp_path / "run" / "best" / "modules.json").is_file()


def test_max_train_examples_tokenizes_and_counts_only_the_tuples_that_train(tiny_encoder, nli, tmp_path, capsys):
    """A quick check on a large file reads its first tuples only: the cut ones are counted among them."""
    train, sts = nli
    results = finetune(config(tiny_encoder, tmp_path / "run", train_file=str(train), validation_file=str(sts),
                              max_length=8, max_train_examples=6, max_steps=1, batch_size=2))
    assert results["num_train_examples"] == 6
    assert "nli.jsonl: 6 of 6 tuples were longer than max_length 8" in capsys.readouterr().err
