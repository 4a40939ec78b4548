"""Long documents: `long_text: chunks` against truncation, same model and settings, on texts past 512 tokens.

There is no long-document classification set among the shared data, so this builds one whose label
depends on the whole document: each document is a run of SST-2 sentences (an odd number, until it
holds at least `--min-tokens` WordPieces, 520 by default: past BERT's 512 positions), drawn so that
about 70% of them share one sentiment, in random order; its label is the majority sentiment of its
sentences (their own SST-2 labels). Truncated to max_length (128), a model reads the first 4-5
sentences and must guess the rest; in windows (chunks) it reads every sentence and pools the
windows' logits. Training documents come from SST-2's training phrases (those of 8 words or
more), test documents from its dev sentences only, so no sentence is in both.

Both runs fine-tune all-MiniLM-L6-v2 with the same settings (max_length, batch, lr, epochs, seed),
each evaluated once, at its end, on the test documents (no model selection on them). Printed:
test accuracy and macro F1 of each, the documents' lengths and windows, the training time, and
the first window's ceiling: the share of test documents whose label the sentences wholly inside
the first max_length tokens give by majority (a tie counts half), the best truncation could reach
even knowing each sentence's sentiment.

    python benchmarks/long_documents.py --model MINILM --data-dir DATA                       # CPU, small
    python benchmarks/long_documents.py --model MINILM --data-dir DATA --train-docs 4000 --test-docs 800
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bert_kit.tasks.finetuning import FinetuneConfig, finetune  # noqa: E402
from bert_kit.tokenizer import get_tokenizer  # noqa: E402


def sentences(path: Path, min_words: int = 0) -> list[tuple[str, int]]:
    """(sentence, label) rows of an SST-2 TSV, of `min_words` words or more."""
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    return [(s.strip(), int(y)) for s, y in rows if len(s.split()) >= min_words]


def documents(pool: list[tuple[str, int]], n: int, min_tokens: int, share: float, tokenizer, rng: random.Random
              ) -> list[tuple[str, int, int, list[tuple[int, int]]]]:
    """n documents (text, label, tokens, (label, tokens) of each sentence): sentences drawn with
    `share` of one sentiment (which one: a coin flip), until the document holds min_tokens tokens
    and an odd number of sentences; the label is their majority sentiment."""
    by_label = {y: [s for s, label in pool if label == y] for y in (0, 1)}
    out = []
    while len(out) < n:
        leaning = rng.randint(0, 1)
        picked, tokens = [], 0
        while tokens < min_tokens or len(picked) % 2 == 0:
            y = leaning if rng.random() < share else 1 - leaning
            sentence = rng.choice(by_label[y])
            picked.append((sentence, y, len(tokenizer.tokenize(sentence))))
            tokens += picked[-1][2]
        label = int(2 * sum(y for _, y, _ in picked) > len(picked))
        out.append((" ".join(s for s, _, _ in picked), label, tokens + 2, [(y, k) for _, y, k in picked]))
    return out


def first_window_ceiling(docs: list, window: int) -> float:
    """The share of documents whose label the majority of the sentences wholly inside their first
    `window` tokens gives (a tie: half): what a reader of the first window could reach at best,
    knowing every sentence's sentiment."""
    right = 0.0
    for _, label, _, parts in docs:
        seen, used = [], 0
        for y, n in parts:
            if used + n > window:
                break
            seen.append(y)
            used += n
        votes = 2 * sum(seen) - len(seen)  # positive minus negative
        right += 0.5 if votes == 0 else float((votes > 0) == bool(label))
    return right / len(docs)


def write(path: Path, docs: list) -> None:
    path.write_text("sentence\tlabel\n" + "".join(f"{doc[0]}\t{doc[1]}\n" for doc in docs), encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="all-MiniLM-L6-v2 folder")
    p.add_argument("--data-dir", type=Path, required=True, help="the data root (holding sst2/)")
    p.add_argument("--train-docs", type=int, default=400)
    p.add_argument("--test-docs", type=int, default=200)
    p.add_argument("--min-tokens", type=int, default=520, help="each document holds at least this many tokens")
    p.add_argument("--share", type=float, default=0.7, help="share of a document's sentences of its leaning")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--chunk-stride", type=int, default=32)
    p.add_argument("--pooling", default="mean", choices=("mean", "max"))
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", default="auto")
    p.add_argument("--variants", default="truncate,chunks")
    p.add_argument("--keep", type=Path, default=None, help="write the documents and runs here (default: a temp folder)")
    p.add_argument("--out", type=Path, default=None, help="append one JSON line per variant here")
    args = p.parse_args()

    tokenizer = get_tokenizer(args.model)
    rng = random.Random(args.seed)
    train = documents(sentences(args.data_dir / "sst2" / "train.tsv", min_words=8), args.train_docs,
                      args.min_tokens, args.share, tokenizer, rng)
    test = documents(sentences(args.data_dir / "sst2" / "dev.tsv"), args.test_docs, args.min_tokens, args.share,
                     tokenizer, rng)
    lengths = [doc[2] for doc in test]
    window = args.max_length - 2
    print(f"documents: {len(train)} train, {len(test)} test; test tokens median {statistics.median(lengths):.0f} "
          f"(min {min(lengths)}, max {max(lengths)}), all past 512: {all(n > 512 for n in lengths)}; truncation "
          f"to {args.max_length} reads {100 * statistics.mean(min(1, window / n) for n in lengths):.0f}% of a "
          f"test document; positive: {sum(doc[1] for doc in test)} of {len(test)}; the sentences wholly in the "
          f"first window give the label of {100 * first_window_ceiling(test, window):.1f}% of the test documents",
          flush=True)

    rows = []
    with tempfile.TemporaryDirectory() as d:
        root = args.keep or Path(d)
        root.mkdir(parents=True, exist_ok=True)
        write(root / "train.tsv", train)
        write(root / "test.tsv", test)
        for variant in args.variants.split(","):
            classification = {"long_text": variant, "chunk_pooling": args.pooling}
            if variant == "chunks":
                classification["chunk_stride"] = args.chunk_stride
            cfg = FinetuneConfig(model=args.model, train_file=str(root / "train.tsv"),
                                 validation_file=str(root / "test.tsv"), output_dir=str(root / f"run-{variant}"),
                                 overwrite=True, max_length=args.max_length, batch_size=args.batch_size, lr=args.lr,
                                 epochs=args.epochs, seed=args.seed, device=args.device, eval_every=10**9,
                                 label_names=["negative", "positive"], classification=classification, log_every=20)
            t0 = time.time()
            results = finetune(cfg)
            final = results["final_metrics"]
            row = {"variant": variant, "accuracy": final["accuracy"], "f1": final["f1"],
                   "train_items": results["num_train_examples"], "steps": results["steps"],
                   "seconds": round(time.time() - t0, 1), "train_docs": len(train), "test_docs": len(test),
                   "max_length": args.max_length, "chunk_stride": args.chunk_stride if variant == "chunks" else None,
                   "pooling": args.pooling if variant == "chunks" else None, "epochs": args.epochs, "lr": args.lr,
                   "batch_size": args.batch_size, "seed": args.seed}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    print(f"\n{'variant':<10} {'test accuracy':>14} {'macro F1':>9} {'train items':>12} {'steps':>6} {'seconds':>8}")
    for row in rows:
        print(f"{row['variant']:<10} {100 * row['accuracy']:>14.2f} {100 * row['f1']:>9.2f} {row['train_items']:>12} "
              f"{row['steps']:>6} {row['seconds']:>8.1f}")


if __name__ == "__main__":
    main()
