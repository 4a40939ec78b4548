"""Every command README.md (and docs/demo.md, which goes on from `make demo`) shows runs as written.

The commands are read from the ```bash blocks of README.md, then of docs/demo.md (so the pages
and the test cannot drift), and run in order, in a scratch working directory holding the shipped
configs, as a fresh clone would after `make demo`: `export BERT_KIT_DATA=...` points at a tiny
data root written here, and the hub model the configs name (sentence-transformers/all-MiniLM-L6-v2)
is a tiny stand-in in a Hugging Face cache layout. Only the settings that make them slow are
changed: the demo gets fewer steps, and pretrain/finetune get `key=value` overrides appended
(after their options, which the command line accepts in any order). The README's ```console
blocks (pip, glue, serve, torchrun) are not run, nor are the other docs pages' commands: each
`bert-kit` command among them must parse, with the configs it names.

Run: .venv/bin/python -m pytest tests/test_readme.py -q
"""

import importlib.util
import json
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
# what a config's own lengths need beside max_length=32 (SQuAD's windows: a question and a stride that fit)
TINY_CONFIG = {"configs/finetune_squad.yaml": ["qa.max_query_length=8", "qa.doc_stride=8"]}
# lines that need an optional extra (the dev extras install them all): skipped without it
EXTRAS = {"engine=jax": "jax", "bert-kit export": "onnxruntime", "--model sst2-onnx": "onnxruntime"}


def block_lines(page: str, kind: str = "bash") -> list[str]:
    """The lines of a page's ```{kind} blocks, comments and blank lines dropped."""
    blocks = re.findall(rf"```{kind}\n(.*?)```", (REPO / page).read_text(), flags=re.DOTALL)
    lines = [line.split(" #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def readme_commands() -> list[str]:
    """The lines of README.md's ```bash blocks."""
    return block_lines("README.md")


def write_data_root(root: Path) -> None:
    """The files the README's configs read, in their released layouts, a few rows each."""
    from bert_kit.data.toy_world import NAMES, biography
    from tests.retrieval.beir_files import write_beir

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
    (root / "conll2003").mkdir()  # token POS chunk NER, IOB2, a blank line between sentences
    people = {name for names in NAMES.values() for name in names}
    tagged = [f"{w} NN B-NP {'B-PER' if w in people else 'O'}" for s in sentences[:16] for w in s.split()[:8]]
    for split in ("train", "valid"):
        (root / "conll2003" / f"{split}.txt").write_text("\n\n".join("\n".join(tagged[i:i + 8])
                                                                     for i in range(0, len(tagged), 8)) + "\n")
    articles = [{"title": f"article {i}", "paragraphs": [{"context": sentences[i], "qas": [
        {"id": f"q{i}", "question": "where?", "answers": [{"text": sentences[i].split()[0], "answer_start": 0}]}]}]}
        for i in range(40)]  # configs/finetune_squad.yaml trains on the first 38 and evaluates on the rest
    (root / "squad-v1.1").mkdir()
    (root / "squad-v1.1" / "dev-v1.1.json").write_text(json.dumps({"version": "1.1", "data": articles}))
    (root / "goemotions").mkdir()  # no header; text, emotion ids, comment id; emotions.txt names the ids
    (root / "goemotions" / "emotions.txt").write_text("admiration\nanger\njoy\nneutral\n")
    for split in ("train", "dev"):
        rows = [f"{s}\t{i % 4}{',2' if i % 3 == 0 else ''}\tc{i}" for i, s in enumerate(sentences[:24])]
        (root / "goemotions" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    for split in ("train", "dev", "test"):  # a BEIR folder as nfcorpus is distributed
        write_beir(root / "nfcorpus", split=split)


def write_hub_model(cache: Path) -> None:
    """A tiny BERT with its tokenizer where `hf download HUB_MODEL` would put the real one."""
    import torch

    from bert_kit.config import BertConfig
    from bert_kit.data.toy_world import NAMES, biography
    from bert_kit.model import BERTModel
    from bert_kit.tokenizer_training import train_tokenizer

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


def shown_commands() -> list[str]:
    """The `bert-kit` commands of README.md's ```console blocks and of every docs page's ```bash and
    ```console blocks (continued lines joined, `torchrun ... -m bert_kit` and `VAR=x` prefixes dropped)."""
    blocks = re.findall(r"```console\n(.*?)```", (REPO / "README.md").read_text(), flags=re.DOTALL)
    for page in sorted((REPO / "docs").glob("*.md")):
        blocks += re.findall(r"```(?:bash|console)\n(.*?)```", page.read_text(), flags=re.DOTALL)
    commands = []
    for line in "\n".join(blocks).replace("\\\n", " ").splitlines():
        line = line.split(" #")[0].strip()
        line = "bert-kit " + line.split(" -m bert_kit ", 1)[1] if " -m bert_kit " in line else line
        line = re.sub(r"^(\w+=\S+ +)+", "", line)
        if line.startswith("bert-kit "):
            commands.append(line)
    return commands


def test_the_commands_shown_parse():
    """The commands shown but not run here (a server, torchrun, a GPU sweep, the docs' examples)
    name commands and flags that exist, and configs that are there."""
    from bert_kit.cli import build_parser, parse_arguments

    commands = shown_commands()
    assert len(commands) >= 30 and any(c.startswith("bert-kit serve ") for c in commands)
    for line in commands:
        words = shlex.split(line.removeprefix("bert-kit "))
        try:
            parse_arguments(build_parser(only=words[0]), words)
        except SystemExit as e:  # argparse's exit: 0 for --version or --help, 2 for a wrong flag
            assert e.code == 0, line
        for config in re.findall(r"configs/[\w.-]+\.yaml", line):
            assert (REPO / config).is_file(), line


@pytest.mark.slow
def test_every_readme_command_runs(fresh_clone, monkeypatch, capsys):
    ran = []
    for line in readme_commands() + block_lines("docs/demo.md"):
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
        if any(key in line and importlib.util.find_spec(extra) is None for key, extra in EXTRAS.items()):
            continue  # an optional extra this environment lacks
        tiny = TINY.get(words[1], []) + [w for config, more in TINY_CONFIG.items() if config in words for w in more]
        argv = [os.path.expandvars(w) for w in words[1:]] + tiny
        assert main(argv) == 0, f"{line}\n{capsys.readouterr().err[-2000:]}"
        ran.append(words[1])
    # what the commands left behind, where the pages say
    work = Path.cwd()
    produced = ["runs/demo/demo_results.json", "results.json", "runs/pretrain_tiny/final/config.json",
                "runs/finetune_sst2/best/config.json", "runs/finetune_conll/best/config.json",
                "runs/finetune_squad/best/config.json", "runs/finetune_stsb_biencoder/best/config.json",
                "eval_classification_dev.json", "eval_similarity_sts-test.json", "eval_retrieval_nfcorpus_test.json",
                "predictions.jsonl", "minilm.npy", "hard.jsonl", "attention.png", "embeddings.npy",
                "runs/tokenizer/vocab.txt"]
    if importlib.util.find_spec("onnxruntime") is not None:
        produced += ["sst2-onnx/model.onnx", "onnx_predictions.jsonl"]
    if importlib.util.find_spec("jax") is not None:
        produced += ["runs/finetune_sst2_jax/best/config.json"]
    for path in produced:
        assert (work / path).is_file(), path
    assert len(list(work.glob("eval_classification_dev*.json"))) == 2  # the SST-2 model's and the demo's
    assert {"demo", "fill-mask", "predict", "evaluate", "attention", "embed", "pretrain", "finetune", "models",
            "mine-negatives", "plot", "tokenizer"} <= set(ran)
