"""Every command README.md shows runs as written.

The commands are read from the README's ```bash blocks (so README and test cannot drift) and run
in order, in a scratch working directory holding the shipped configs, as a fresh clone would
after `make demo`: `export BERT_KIT_DATA=...` points at a tiny data root written here, and the
hub model the configs name (sentence-transformers/all-MiniLM-L6-v2) is a tiny stand-in in a
Hugging Face cache layout. Only the settings that make them slow are changed: the demo gets
fewer steps, and pretrain/finetune get `key=value` overrides appended (after their options,
which the command line accepts in any order).

Run: .venv/bin/python -m pytest tests/test_readme.py -q
"""

import os
import random
import re
import shlex
import shutil
from pathlib import Path

import pytest

from bert_kit.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # steady on a shared 2-core machine

REPO = Path(__file__).resolve().parents[1]
HUB_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# what makes each long-running command quick; everything else runs exactly as the README says
TINY = {
    "demo": ["--pretrain-steps", "12", "--finetune-epochs", "0.3"],
    "pretrain": ["max_steps=3", "batch_size=4", "max_length=32", "eval_every=0", "eval_batches=2", "save_every=2",
                 "log_every=1", "train_tokenizer.vocab_size=300", "num_workers=0", "shuffle_buffer=8"],
    "finetune": ["max_steps=2", "batch_size=4", "eval_batch_size=4", "max_train_examples=8",
                 "max_eval_examples=4", "max_length=32"],
}


def readme_commands() -> list[str]:
    """The lines of README.md's ```bash blocks, comments and blank lines dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.DOTALL)
    lines = [line.split(" #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def write_data_root(root: Path) -> None:
    """The files the README's configs read, in their released layouts, a few rows each."""
    from bert_kit.data.toy_world import NAMES, biography

    rng = random.Random(0)
    sentences = [s for _ in range(60) for _, s in biography(rng, NAMES)]
    (root / "wikitext-2").mkdir(parents=True)
    for split in ("train", "valid", "test"):
        articles = [f" = Article {i} = \n \n " + " ".join(sentences[i * 10: i * 10 + 10]) + " \n \n"
                    for i in range(split == "train" and 30 or 12)]
        (root / "wikitext-2" / f"{split}.txt").write_text(" \n" + "".join(articles))
    (root / "sst2").mkdir()
    for split in ("train", "dev"):
        rows = [f"{s}\t{i % 2}" for i, s in enumerate(sentences[:24])]
        (root / "sst2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (root / "stsb").mkdir()
    rows = [f"main-news\tfile\t2012\t{i}\t{i % 5}.0\t{a}\t{b}" for i, (a, b) in
            enumerate(zip(sentences[:12], sentences[12:24]))]
    for split in ("train", "dev", "test"):
        (root / "stsb" / f"sts-{split}.csv").write_text("\n".join(rows) + "\n")


def write_hub_model(cache: Path) -> None:
    """A tiny BERT with its tokenizer where `hf download HUB_MODEL` would put the real one."""
    import torch

    from bert_kit.config import BertConfig
    from bert_kit.data.toy_world import NAMES, biography
    from bert_kit.model import BERTModel
    from bert_kit.tokenizer import train_tokenizer

    snapshot = cache / ("models--" + HUB_MODEL.replace("/", "--")) / "snapshots" / "0123abc"
    rng = random.Random(1)
    tokenizer = train_tokenizer(texts=[s for _ in range(200) for _, s in biography(rng, NAMES)], vocab_size=400)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    BERTModel(config).save_pretrained(snapshot)
    tokenizer.save(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abc")


@pytest.fixture
def fresh_clone(tmp_path, monkeypatch):
    """A working directory with configs/, a data root and an HF cache holding the hub model."""
    work = tmp_path / "clone"
    shutil.copytree(REPO / "configs", work / "configs")
    write_data_root(tmp_path / "datasets")
    write_hub_model(tmp_path / "hub")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("BERT_KIT_DATA", raising=False)
    return tmp_path


def test_readme_shows_how_bert_kit_is_reached():
    commands = readme_commands()
    assert commands[:2] == ["make demo", "make test"]  # the two set-up commands come first
    assert "source .venv/bin/activate" in commands
    first_use = min(i for i, c in enumerate(commands) if c.startswith("bert-kit"))
    assert commands.index("source .venv/bin/activate") < first_use
    assert "`.venv/bin/bert-kit`" in (REPO / "README.md").read_text()


@pytest.mark.slow
def test_every_readme_command_runs(fresh_clone, monkeypatch, capsys):
    ran = []
    for line in readme_commands():
        words = shlex.split(line)
        if line == "make test" or line == "source .venv/bin/activate":
            continue  # the suite itself; PATH only
        if line == "make demo":  # the Makefile's demo target: `bert-kit demo --output runs/demo`
            assert "bert-kit demo --output runs/demo" in (REPO / "Makefile").read_text()
            words = ["bert-kit", "demo", "--output", "runs/demo"]
        if words[0] == "export":
            name, _, _ = words[1].partition("=")
            assert name == "BERT_KIT_DATA", line
            monkeypatch.setenv(name, str(fresh_clone / "datasets"))  # the user's own folder, here
            continue
        assert words[0] == "bert-kit", f"README command the test does not know how to run: {line}"
        argv = [os.path.expandvars(w) for w in words[1:]] + TINY.get(words[1], [])
        assert main(argv) == 0, f"{line}\n{capsys.readouterr().err[-2000:]}"
        ran.append(words[1])
    # what the commands left behind, where the README says
    work = Path.cwd()
    for produced in ("runs/demo/demo_results.json", "predictions.jsonl", "eval_classification_dev.json",
                     "attention.png", "embeddings.npy", "runs/tokenizer/vocab.txt", "results.json",
                     "runs/finetune_sst2/best/config.json", "eval_similarity_sts-test.json", "minilm.npy",
                     "streaming.json", "runs/minilm/model.safetensors"):
        assert (work / produced).is_file(), produced
    assert {"demo", "fill-mask", "predict", "evaluate", "attention", "embed", "pretrain", "finetune",
            "convert", "plot", "models", "tokenizer"} <= set(ran)
