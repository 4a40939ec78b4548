"""Streaming pretraining (`streaming: true`) on tiny configs (CPU): the stream never reads the
whole corpus nor builds a token cache, yields the examples of the map-style datasets, shards
each example to one rank and worker, reshuffles per epoch, and resumes exactly where it stopped.

Run: .venv/bin/python -m pytest tests/tasks/test_pretraining_streaming.py -q
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.tasks.test_pretraining import SignalAtStep, tiny_config, train_losses, write_corpus

import bert_kit.data.corpus
import bert_kit.data.token_cache
import bert_kit.tasks.pretraining
import bert_kit.training.loop
import bert_kit.tasks.pretraining_data
from bert_kit.training.checkpoint import latest_checkpoint, load_trainer_state
from bert_kit.cli import main as cli
from bert_kit.data.corpus import StreamingTextDataset, plain_backend
from bert_kit.data.token_cache import TokenCache
from bert_kit.data.masking import DataCollatorForMLM
from bert_kit.data.pretraining import MLMDataset, PackedDataset, StreamingDataLoader
from bert_kit.tasks.pretraining import PretrainConfig, pretrain
from bert_kit.training.progress import ProgressLogger, read_metrics
from bert_kit.tokenizer import get_tokenizer

torch.set_num_threads(1)  # tiny models: threads only add contention on a shared machine
REPO = Path(__file__).resolve().parents[2]


def streaming_config(tmp_path: Path, name: str = "run", **overrides) -> PretrainConfig:
    """The tiny MLM-only run of test_pretrain, streamed; held-out text in its own file."""
    eval_file = tmp_path / "eval.txt"
    if not eval_file.exists():
        write_corpus(eval_file, n_docs=6, seed=1)
    settings = dict(nsp=False, streaming=True, shuffle_buffer=8, eval_files=[str(eval_file)])
    settings.update(overrides)
    return tiny_config(tmp_path, name, **settings)


def no_full_read(monkeypatch) -> None:
    """Make every whole-corpus path fail: reading all documents, or tokenising into a cache."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the streaming run read the whole corpus")

    for module in (bert_kit.data.corpus, bert_kit.data.token_cache, bert_kit.tasks.pretraining_data,
                   bert_kit.tasks.pretraining):
        for name in ("read_documents", "tokenize_to_cache"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, forbidden)


def test_streaming_run_reads_lazily_and_evaluates_on_eval_files(tmp_path, monkeypatch):
    no_full_read(monkeypatch)
    # count the documents the stream hands out, to see it is what feeds training
    served = Counter()
    original = StreamingTextDataset._shard_items

    def counting(self, shard, num_shards):
        for text in original(self, shard, num_shards):
            served[self.shuffle] += 1
            yield text

    monkeypatch.setattr(StreamingTextDataset, "_shard_items", counting)
    cfg = streaming_config(tmp_path, max_steps=12, eval_every=6, packing=False)
    results = pretrain(cfg)
    out = Path(cfg.output_dir)
    assert results["steps"] == 12 and results["train_nsp_loss"] is None
    assert results["test_mlm_loss"] is not None and results["test_mlm_loss"] < results["initial_train_mlm_loss"]
    assert not (out / "token_cache").exists()
    # 12 steps x 4 sequences of 30 documents: the training stream ran 2 epochs (restarted once)
    train = [r for r in read_metrics(out) if r["type"] == "train"]
    assert train[-1]["epoch"] == 1 and served[True] >= 48
    # the eval stream is unshuffled: 6 documents, each evaluation (steps 6 and 12) reads them all
    assert served[False] == 2 * 6
    assert json.loads((out / "final" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    # the checkpoint holds each rank's position: examples consumed in the current epoch
    state = load_trainer_state(latest_checkpoint(out))["data"]
    assert state["world_size"] == 1 and len(state["stream"]) == 1
    assert state["stream"][0]["epoch"] == 1 and state["stream"][0]["examples"] == (12 - 8) * 4  # epoch 0: 8 batches


def test_streaming_config_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"streaming: true trains MLM only.*nsp: false"):
        PretrainConfig(streaming=True, eval_files=["held_out.txt"])
    with pytest.raises(ValueError, match=r"streaming: true needs eval_files"):
        PretrainConfig(streaming=True, nsp=False)
    with pytest.raises(ValueError, match=r"shuffle_buffer=0 is out of range: expected an integer >= 1"):
        PretrainConfig(shuffle_buffer=0)
    config = tmp_path / "run.yaml"
    config.write_text("streaming: true\nnsp: false\n")
    assert cli(["pretrain", "--config", str(config)]) == 2  # a usage error
    assert "streaming: true needs eval_files" in capsys.readouterr().err
    # a file that is not text fails with its name when the stream reaches it
    bad = tmp_path / "binary.txt"
    bad.write_bytes(b"\xff\xfebad" * 10)
    with pytest.raises(ValueError, match=r"binary\.txt:1: not UTF-8 text \(byte 0xff at column 1\)"):
        list(StreamingTextDataset(bad))


def test_stream_examples_match_the_map_style_datasets(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", n_docs=12)
    tok = tmp_path / "tok"
    from bert_kit.tokenizer_training import train_tokenizer

    train_tokenizer([str(corpus)], vocab_size=120, min_frequency=1).save(tok)
    tokenizer = get_tokenizer(tok)
    docs = bert_kit.data.corpus.read_documents(corpus, "blank_line")
    ids = [e.ids for e in plain_backend(tokenizer).encode_batch(docs, add_special_tokens=False)]
    # packed: the blocks of PackedDataset over the same documents, sequence ids included
    packed = PackedDataset(TokenCache.from_documents(ids, tokenizer.vocab_size), 16, tokenizer=tokenizer)
    stream = list(StreamingTextDataset(corpus, tokenizer, 16, "blank_line", shuffle=False, packing=True))
    assert len(stream) == len(packed) > len(docs)
    for i, item in enumerate(stream):
        assert item["input_ids"] == packed[i]["input_ids"].tolist(), i
        assert item["sequence_ids"] == packed[i]["sequence_ids"].tolist(), i
        assert (item["worker"], item["position"]) == (0, i + 1)
    # truncated: MLMDataset's [CLS] doc [SEP] examples
    truncated = MLMDataset(ids, tokenizer, 16)
    stream = list(StreamingTextDataset(corpus, tokenizer, 16, "blank_line", shuffle=False))
    assert [x["input_ids"] for x in stream] == [truncated[i]["input_ids"].tolist() for i in range(len(truncated))]
    # skipping (resume) leaves the rest of the shuffled stream as it was
    shuffled = StreamingTextDataset(corpus, tokenizer, 16, "blank_line", buffer_size=4, seed=5, packing=True)
    full = list(shuffled)
    shuffled.set_epoch(0, skip=7)
    assert list(shuffled) == full[7:]


def numbered_stream(tmp_path: Path, rank: int = 0, world_size: int = 1) -> StreamingTextDataset:
    """Lines "w<i>" over a tokenizer that knows each of them as one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from bert_kit.tokenizer import WordPieceTokenizer

    path = tmp_path / "numbered.txt"
    if not path.exists():
        path.write_text("".join(f"w{i}\n" for i in range(41)))
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(41)])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return StreamingTextDataset(path, WordPieceTokenizer(backend), 8, "line", buffer_size=5, seed=2,
                                rank=rank, world_size=world_size)


def loader_for(dataset: StreamingTextDataset, num_workers: int) -> StreamingDataLoader:
    collator = DataCollatorForMLM(dataset.tokenizer, 0.3, pad_to_multiple_of=4, seed=9)
    return StreamingDataLoader(dataset, collator, 3, num_workers=num_workers)


def line_ids(batch: dict) -> list[int]:
    """The line number of each row, read through the mask."""
    original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
    return (original[:, 1] - 5).tolist()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stream_loader_shards_reshuffles_and_resumes(tmp_path, num_workers):
    # 2 ranks x num_workers: every line once per epoch, in another order the next epoch
    epochs = []
    for epoch in range(2):
        seen = []
        for r in range(2):
            loader = loader_for(numbered_stream(tmp_path, r, 2), num_workers)
            loader.set_epoch(epoch)
            seen += [i for batch in loader for i in line_ids(batch)]
        assert sorted(seen) == list(range(41))
        epochs.append(seen)
    assert epochs[0] != epochs[1]
    # resume after 5 batches (the workers' batches interleaved): the same batches and masks follow
    loader = loader_for(numbered_stream(tmp_path), num_workers)
    straight = list(itertools.islice(_forever(loader), 30))  # 14 batches an epoch
    first = loader_for(numbered_stream(tmp_path), num_workers)
    batches = _forever(first)
    for _ in range(5):
        next(batches)
    state = first.state_dict()
    assert state["examples"] == 15 and sum(state["positions"]) == 15
    resumed = loader_for(numbered_stream(tmp_path), num_workers)
    resumed.load_state_dict(state)
    for want, got in zip(straight[5:], _forever(resumed), strict=False):  # an endless stream
        assert want.keys() == got.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)
    # rows are [CLS] w<i> [SEP] [PAD]: only the word can be masked, its label the word's id
    labels = torch.cat([b["labels"] for b in straight])
    assert (labels[:, [0, 2, 3]] == -100).all()
    assert 0 < (labels[:, 1] != -100).sum() < len(labels) and (labels[labels != -100] >= 5).all()


def _forever(loader):
    while True:
        yield from loader


@pytest.mark.parametrize("num_workers", [0, 2])
def test_streaming_resume_is_bit_exact(tmp_path, monkeypatch, num_workers):
    # packing, grad accumulation and dropout; 20 steps of 2 x 4 blocks run ~4 epochs of the stream,
    # so the resumed half also crosses epoch boundaries and reshuffles
    cfg = streaming_config(tmp_path, "straight", max_steps=20, grad_accum=2, eval_every=5, num_workers=num_workers)
    results_a = pretrain(cfg)
    assert results_a["steps"] == 20

    # the same run, stopped by SIGTERM after step 10 (exit code 143), then resumed
    interrupted = tmp_path / "interrupted"
    cfg_file = tmp_path / "straight" / "run_config.yaml"
    monkeypatch.setattr(bert_kit.training.loop, "ProgressLogger", SignalAtStep)
    assert cli(["pretrain", "--config", str(cfg_file), f"output_dir={interrupted}"]) == 143
    monkeypatch.setattr(bert_kit.training.loop, "ProgressLogger", ProgressLogger)
    assert latest_checkpoint(interrupted).name == "step-0000010"
    stream = load_trainer_state(latest_checkpoint(interrupted))["data"]["stream"][0]
    assert stream["batch_index"] > 0 and stream["examples"] == sum(stream["positions"])
    assert len(stream["positions"]) == max(1, num_workers)
    if num_workers == 0:  # one shard: every batch full but an epoch's last
        assert stream["examples"] == 4 * stream["batch_index"]
    assert cli(["pretrain", "--config", str(cfg_file), f"output_dir={interrupted}", "--resume", "latest"]) == 0

    a, b = train_losses(tmp_path / "straight"), train_losses(interrupted)
    assert sorted(a) == sorted(b) == list(range(1, 21))
    torch.testing.assert_close(torch.tensor([b[s] for s in range(1, 21)], dtype=torch.float64),
                               torch.tensor([a[s] for s in range(1, 21)], dtype=torch.float64), rtol=0, atol=0)
    epochs = {r["step"]: r["epoch"] for r in read_metrics(interrupted) if r["type"] == "train"}
    assert epochs[10] < epochs[20]  # an epoch boundary after the resume point
    wa = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    wb = load_file(interrupted / "final" / "model.safetensors")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=0, msg=k)
    results_b = json.loads((interrupted / "results.json").read_text())
    assert results_b["test_mlm_loss"] == results_a["test_mlm_loss"]
    if num_workers == 0:  # a stream position cannot continue a map-style run, nor the reverse
        mapped = dataclasses.replace(cfg, streaming=False, output_dir=str(tmp_path / "mapped"))
        with pytest.raises(ValueError, match=r"changed settings that shape the run \(streaming: True -> False\)"):
            pretrain(mapped, resume=str(interrupted / "checkpoints" / "step-0000010"))


@pytest.mark.slow
def test_two_ranks_resume_each_at_its_own_stream_position(tmp_path, capsys):
    # 2 processes over gloo (torchrun): each rank streams its own shard; a resumed run continues
    # every rank at its own position; one process can take over the 2-rank checkpoint
    from bert_kit.training.runconfig import save_config

    cfg = streaming_config(tmp_path, "straight", max_steps=8, grad_accum=2, save_every=4, eval_every=4)
    save_config(cfg, tmp_path / "run.yaml")
    torchrun = Path(sys.executable).with_name("torchrun")
    launcher = [str(torchrun)] if torchrun.is_file() else [sys.executable, "-m", "torch.distributed.run"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    checkpoint = tmp_path / "straight" / "checkpoints" / "step-0000004"
    for extra in ([], [f"output_dir={tmp_path / 'resumed'}", "--resume", str(checkpoint)]):
        proc = subprocess.run([*launcher, "--standalone", "--nproc_per_node=2", "-m", "bert_kit", "pretrain",
                               "--config", str(tmp_path / "run.yaml"), *extra],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = load_trainer_state(checkpoint)["data"]["stream"]
    assert len(ranks) == 2 and ranks[0]["examples"] == ranks[1]["examples"] == 4 * ranks[0]["batch_index"]
    a, b = train_losses(tmp_path / "straight"), train_losses(tmp_path / "resumed")
    assert sorted(b) == list(range(5, 9))
    torch.testing.assert_close(torch.tensor([b[s] for s in range(5, 9)], dtype=torch.float64),
                               torch.tensor([a[s] for s in range(5, 9)], dtype=torch.float64), rtol=0, atol=0)
    # 2 ranks -> 1 process: other shards, so the same point of the epoch, not the same examples
    capsys.readouterr()
    one = pretrain(streaming_config(tmp_path, "one", max_steps=8, grad_accum=2), resume=str(checkpoint))
    consumed = ranks[0]["examples"] + ranks[1]["examples"]
    assert one["steps"] == 8 and f"each shard skips {consumed} examples" in capsys.readouterr().err
