"""Masked-language-model pretraining on any text file, then a look at what the model learnt.

    python examples/pretrain_mlm.py my_text.txt              # a few hundred steps on the CPU
    python examples/pretrain_mlm.py my_text.txt --steps 2000 --output runs/my_mlm

Steps: train a WordPiece vocabulary on the file, pack its lines into 64-token blocks, pretrain a
small 4-layer BERT (MLM only) and finally fill in masked words of a few lines of the file.
The same run from the command line is `bert-kit pretrain` with a YAML config (see configs/).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from bert_kit.tasks.fill_mask import fill_mask, load_mlm_model
from bert_kit.tasks.pretraining import PretrainConfig, pretrain
from bert_kit.tokenizer import get_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text_file", help="any UTF-8 text file; one or more lines")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--output", default="runs/pretrain_mlm_example", help="run folder")
    parser.add_argument("--vocab-size", type=int, default=4000, help="WordPiece vocabulary size")
    args = parser.parse_args()

    lines = [line.strip() for line in Path(args.text_file).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise SystemExit(f"{args.text_file} holds no text")

    config = PretrainConfig(
        # the 4-layer, 256-wide, 4-head teaching size; short positions keep it light
        model={"preset": "bert-teaching", "max_position_embeddings": 128},
        train_tokenizer={"vocab_size": args.vocab_size, "min_frequency": 1},
        train_files=[args.text_file],
        corpus_format="lines",  # one document per line
        nsp=False,  # MLM only: no sentence pairs needed, any text works
        packing=True,  # lines laid end to end in full 64-token blocks
        max_length=64,
        batch_size=16,
        max_steps=args.steps,
        lr=5e-4,
        warmup_fraction=0.1,
        eval_fraction=0.05 if len(lines) >= 40 else 0.0,
        eval_every=max(args.steps // 4, 1),
        save_every=args.steps,
        log_every=10,
        output_dir=args.output,
    )
    results = pretrain(config)
    print(f"MLM loss {results['initial_train_mlm_loss']:.3f} -> {results['train_mlm_loss']:.3f} "
          f"in {results['steps']} steps ({results['tokens_per_second']:.0f} tokens/s)")

    # mask one word in a few lines of the file and show the model's guesses
    final = Path(args.output) / "final"
    model, tokenizer = load_mlm_model(final), get_tokenizer(final)
    rng = random.Random(0)
    for line in rng.sample(lines, min(3, len(lines))):
        words = line.split()[:30]
        k = rng.randrange(len(words))
        masked = " ".join(words[:k] + ["[MASK]"] + words[k + 1:])
        guesses = ", ".join(f"{p['token']} ({p['score']:.2f})" for p in fill_mask(model, tokenizer, masked, 5)[0])
        print(f"\n{masked}\n  truth: {words[k]}  guesses: {guesses}")


if __name__ == "__main__":
    main()
