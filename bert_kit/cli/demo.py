"""`bert-kit demo`: the whole pipeline on text every machine has, with no download.

The corpus is the docstrings of Python's own standard library (the modules in `STDLIB`, read
with `inspect`): one document per module, its classes' and functions' docstrings in order.
1. a WordPiece vocabulary is trained on it;
2. a small BERT (2 layers, width 128) is pretrained with MLM + NSP;
3. it is fine-tuned on a task made from the same source: does a docstring sentence come from a
   networking module (socket, http, email, ...) or from another one? (balanced classes; dev
   accuracy is printed beside the 50% chance level);
4. metrics (demo_results.json) and loss curves (PNG) land in the output folder.
About 80 seconds on 2 idle CPU cores.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import random
import re
import time
import warnings
from pathlib import Path

STDLIB = [
    "abc", "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures",
    "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email",
    "enum", "fnmatch", "fractions", "ftplib", "functools", "gettext", "glob", "gzip", "hashlib", "heapq",
    "hmac", "html.parser", "http.client", "http.server", "imaplib", "inspect", "io", "ipaddress", "itertools",
    "json", "logging", "lzma", "mailbox", "math", "mimetypes", "multiprocessing", "netrc", "numbers",
    "operator", "optparse", "os", "pathlib", "pickle", "pkgutil", "platform", "plistlib", "poplib", "pprint",
    "queue", "random", "re", "sched", "secrets", "selectors", "shelve", "shlex", "shutil", "signal",
    "smtplib", "socket", "socketserver", "sqlite3", "ssl", "statistics", "string", "struct", "subprocess",
    "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "traceback", "turtle", "typing",
    "unittest", "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "weakref", "xml.dom.minidom",
    "xml.etree.ElementTree", "zipfile", "zoneinfo",
]


# modules whose docstrings make the positive class of the fine-tuning task
NETWORK = {"email", "ftplib", "http.client", "http.server", "imaplib", "ipaddress", "mailbox", "poplib",
           "selectors", "smtplib", "socket", "socketserver", "ssl", "urllib.parse", "urllib.request"}


def _clean(doc: str) -> str:
    return re.sub(r"\s+", " ", inspect.cleandoc(doc)).strip()


def harvest_docstrings() -> tuple[list[str], list[tuple[str, int]]]:
    """-> (documents, [(docstring sentence, 1 = networking module / 0 = other)]) from the stdlib."""
    documents, examples = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in STDLIB:
            try:
                module = importlib.import_module(name)
            except Exception:  # a module missing from this Python build: skip it
                continue
            parts = [_clean(module.__doc__)] if module.__doc__ else []
            for attr, obj in sorted(vars(module).items()):
                if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                    continue
                if not (inspect.isclass(obj) or inspect.isfunction(obj)) or not obj.__doc__:
                    continue
                text = _clean(obj.__doc__)
                parts.append(text)
                for sentence in re.split(r"(?<=[.!?])\s", text)[:3]:
                    if 4 <= len(sentence.split()) <= 50:
                        examples.append((sentence, int(name in NETWORK)))
            if len(parts) > 2:
                documents.append("\n".join(parts))
    return documents, sorted(set(examples))


def write_task(examples: list[tuple[str, int]], out: Path, seed: int = 0) -> tuple[Path, Path, float]:
    """Balance the classes, shuffle, split 80/20, write TSVs (sentence, label).

    Returns the two paths and the dev set's majority-class rate (the accuracy of guessing).
    """
    rng = random.Random(seed)
    positive = [e for e in examples if e[1] == 1]
    negative = rng.sample([e for e in examples if e[1] == 0], len(positive))
    examples = positive + negative
    rng.shuffle(examples)
    cut = int(0.8 * len(examples))
    paths = []
    for name, rows in (("train.tsv", examples[:cut]), ("dev.tsv", examples[cut:])):
        path = out / name
        lines = ["sentence\tlabel"] + [f"{s.replace(chr(9), ' ')}\t{y}" for s, y in rows]
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    dev = [y for _, y in examples[cut:]]
    majority = max(sum(dev), len(dev) - sum(dev)) / len(dev)
    return paths[0], paths[1], majority


def demo(output_dir: str | Path = "runs/demo", pretrain_steps: int = 1200, finetune_epochs: float = 3.0,
         seed: int = 0) -> dict:
    from bert_kit.tasks.finetuning import FinetuneConfig, finetune
    from bert_kit.tasks.pretraining import PretrainConfig, pretrain

    t0 = time.time()
    out = Path(output_dir)
    (out / "data").mkdir(parents=True, exist_ok=True)
    documents, examples = harvest_docstrings()
    corpus = out / "data" / "stdlib_docstrings.txt"
    corpus.write_text("\n\n".join(documents) + "\n")
    print(f"corpus: {len(documents)} stdlib modules, {sum(len(d.split()) for d in documents):,} words -> {corpus}")
    train_tsv, dev_tsv, majority = write_task(examples, out / "data", seed)
    print(f"task: docstring sentences, networking module (1) or not (0), balanced; dev majority {majority:.3f}")

    pre = pretrain(PretrainConfig(
        model={"preset": "bert-tiny", "max_position_embeddings": 128}, train_tokenizer={"vocab_size": 2000},
        train_files=[str(corpus)], eval_fraction=0.05, corpus_format="text", nsp=True, max_length=64,
        batch_size=32, max_steps=pretrain_steps, lr=1e-3, warmup_fraction=0.1, eval_every=300,
        eval_batches=10, save_every=600, keep_last=1, log_every=10, seed=seed,
        output_dir=str(out / "pretrain")))
    fin = finetune(FinetuneConfig(
        task="classification", model=str(out / "pretrain" / "final"), train_file=str(train_tsv),
        validation_file=str(dev_tsv), max_length=64, epochs=finetune_epochs, batch_size=16, lr=1e-3,
        seed=seed, log_every=10, output_dir=str(out / "finetune")))
    results = {
        "corpus_documents": len(documents), "task_examples": len(examples), "dev_majority_baseline": majority,
        "pretrain": {k: pre.get(k) for k in ("train_mlm_loss", "train_nsp_loss", "test_mlm_loss", "test_nsp_loss",
                                             "test_nsp_accuracy", "test_perplexity")},
        "finetune": {k: v for k, v in fin.items() if isinstance(v, (int, float, str)) or v is None},
        "plots": [str(p) for p in sorted(out.glob("*/loss_curve.png"))],
        "wall_time_s": time.time() - t0,
    }
    (out / "demo_results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", default="runs/demo", help="output folder (default runs/demo)")
    parser.add_argument("--pretrain-steps", type=int, default=1200)
    parser.add_argument("--finetune-epochs", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from bert_kit.cli.errors import check_output_dir

    check_output_dir(args.output, "--output")
    demo(args.output, args.pretrain_steps, args.finetune_epochs, args.seed)
    return 0
