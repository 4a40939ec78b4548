"""Sentence similarity: embeddings, semantic search and STS-B, zero-shot and fine-tuned.

    python examples/sentence_similarity.py                          # ~1-2 minutes on a CPU
    python examples/sentence_similarity.py --mode cross-encoder      # a regression head on the pair instead
    python examples/sentence_similarity.py --max-train 0 --epochs 4 --output runs/sts   # all 5,749 pairs (GPU)

1. `SentenceEncoder` turns sentences into mean-pooled, unit-length vectors; cosine similarity
   of two vectors scores the pair, and ranking a corpus by it is semantic search.
2. The STS Benchmark scores pairs 0-5; the Spearman correlation of cos(u, v) with the gold
   scores measures an encoder, here before fine-tuning.
3. Fine-tuning on STS-B train, as a bi-encoder (CosineSimilarityLoss: MSE(cos(u, v), score / 5))
   or a cross-encoder (regression on "[CLS] a [SEP] b [SEP]"), then the dev score again.
"""

from __future__ import annotations

import argparse

import numpy as np

from bert_kit.data.sts import read_sts
from bert_kit.embeddings import SentenceEncoder, cosine_similarity
from bert_kit.tasks.finetuning import FinetuneConfig, finetune
from bert_kit.metrics import spearman
from bert_kit.data.root import data_root

DATA = data_root()  # $BERT_KIT_DATA, else ./data (docs/data.md)
MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # a hub name: its local copy (docs/data.md)
CORPUS = ["A man is eating food.", "A man is riding a horse.", "A woman is playing the violin.",
          "Two men pushed carts through the woods.", "A monkey is playing drums.",
          "The new movie is awesome.", "The stock market fell sharply today."]
QUERIES = ["Someone is having a meal.", "A person plays a musical instrument.", "Shares dropped."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL, help="model folder, bert-kit run or hub name with a local copy")
    parser.add_argument("--mode", choices=("bi-encoder", "cross-encoder"), default="bi-encoder")
    parser.add_argument("--train", default=str(DATA / "stsb" / "sts-train.csv"))
    parser.add_argument("--dev", default=str(DATA / "stsb" / "sts-dev.csv"))
    parser.add_argument("--max-train", type=int, default=1000, help="training pairs (0: all)")
    parser.add_argument("--max-eval", type=int, default=500, help="dev pairs (0: all)")
    parser.add_argument("--epochs", type=float, default=1)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--output", default="runs/similarity_example")
    args = parser.parse_args()

    # 1. embeddings and semantic search
    encoder = SentenceEncoder.from_pretrained(args.model)  # mean pooling, normalised
    corpus = encoder.encode(CORPUS)  # (7, hidden)
    queries = encoder.encode(QUERIES)
    scores = cosine_similarity(queries, corpus)  # (3, 7)
    for query, row in zip(QUERIES, scores):
        best = np.argsort(-row)[:2]
        print(f"{query!r} -> " + "; ".join(f"{CORPUS[i]!r} ({row[i]:.3f})" for i in best))

    # 2. STS-B dev, zero-shot: Spearman of cosine similarities against the gold scores
    s1, s2, gold = (x[: args.max_eval or None] for x in read_sts(args.dev))
    before = spearman(encoder.similarity(s1, s2), gold)
    print(f"\nSTS-B dev ({len(gold)} pairs), before fine-tuning: Spearman {before:.4f}")

    # 3. fine-tune on STS-B train and score dev again
    config = FinetuneConfig(
        task="similarity", similarity={"mode": args.mode}, model=args.model, train_file=args.train,
        validation_file=args.dev, max_train_examples=args.max_train or None, max_eval_examples=args.max_eval or None,
        epochs=args.epochs, batch_size=16, lr=args.lr, unpadded=True, output_dir=args.output, log_every=10)
    results = finetune(config)
    print(f"after fine-tuning ({args.mode}, {results['steps']} steps): Spearman {results['best_value']:.4f}, "
          f"Pearson {results['best_metrics']['pearson']:.4f}; model in {results['best_model']}")
    if args.mode == "bi-encoder":
        tuned = SentenceEncoder.from_pretrained(results["best_model"])  # best/ embeds like any encoder
        a, b = tuned.encode([QUERIES[0], CORPUS[0]])
        print(f"{QUERIES[0]!r} vs {CORPUS[0]!r}: cosine {float(a @ b):.3f} (before: {scores[0, 0]:.3f})")


if __name__ == "__main__":
    main()
