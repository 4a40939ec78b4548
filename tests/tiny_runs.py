"""A tiny, learnable fine-tuning setup built in a second on a CPU, for tests of what runs around
the training loop (trackers, search, LoRA, distillation).

`tiny_setup(root)` writes a 120-token WordPiece tokenizer, a random 2-layer (or `layers`) 32-wide
encoder folder with it, and train/dev TSVs whose label is whether the sentence's adjective is a
pleasant one: a model learns it in a few dozen steps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

GOOD, BAD = "happy new quick big".split(), "sad old slow small".split()
NOUNS = "cat dog bird fish horse mouse tree house".split()
VERBS = "sees likes chases finds eats hears".split()


@dataclass
class Tiny:
    encoder: Path  # BERTModel folder with its tokenizer
    train: Path  # sentence<TAB>label
    dev: Path


def sentences(n: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randrange(2)
        adj = rng.choice(GOOD if label else BAD)
        rows.append((f"the {adj} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {rng.choice(NOUNS)}", label))
    return rows


def tiny_setup(root: Path, layers: int = 2, n_train: int = 96, n_dev: int = 32) -> Tiny:
    import torch

    from bert_kit.config import BertConfig
    from bert_kit.model import BERTModel
    from bert_kit.tokenizer_training import train_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    train, dev = sentences(n_train, 0), sentences(n_dev, 1)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(s for s, _ in train + dev) + "\n")
    tok = train_tokenizer([str(corpus)], vocab_size=120, min_frequency=1)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    encoder = root / "encoder"
    BERTModel(config).save_pretrained(encoder)
    tok.save(encoder)
    for path, rows in ((root / "train.tsv", train), (root / "dev.tsv", dev)):
        path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    return Tiny(encoder, root / "train.tsv", root / "dev.tsv")


def tiny_settings(tiny: Tiny, output_dir: Path, **overrides) -> dict:
    """Settings of a short classification run on `tiny` (a FinetuneConfig's keyword arguments)."""
    settings = dict(task="classification", model=str(tiny.encoder), train_file=str(tiny.train),
                    validation_file=str(tiny.dev), max_length=16, batch_size=16, lr=1e-3, max_steps=12,
                    eval_every=6, log_every=2, device="cpu", output_dir=str(output_dir))
    return {**settings, **overrides}
