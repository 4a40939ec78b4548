"""How many in-batch negatives are known positives: a BEIR split's (query, relevant document) pairs
dealt into no-duplicates batches as `bert-kit finetune --task embedding` deals them, counting the
candidates of each query that the qrels call relevant to it (no model; a statistic of the data).

    python benchmarks/false_negatives.py --data DATA/nfcorpus --batch-size 64

Those candidates are what `embedding.exclude_known_positives` leaves out of the softmax.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = Path(os.environ.get("BERT_KIT_DATA", REPO.parent / "shared" / "data"))
    parser.add_argument("--data", type=Path, default=root / "nfcorpus", help="a BEIR folder (default: NFCorpus)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--limit", type=int, nargs="*", default=[12000],
                        help="also count over the first N pairs of a seeded shuffle (benchmarks/retrieval.py's)")
    args = parser.parse_args()
    from bert_kit.data.no_duplicates import NoDuplicatesSampler, text_keys
    from bert_kit.retrieval.beir import read_beir
    from bert_kit.retrieval.mining import pairs_from_beir

    anchors, positives = pairs_from_beir(read_beir(args.data, args.split, warn=False))
    rows = list(zip(anchors, positives))
    random.Random(0).shuffle(rows)  # benchmarks/retrieval.py's order
    keys = text_keys([[a for a, _ in rows], [p for _, p in rows]])
    relevant = collections.defaultdict(set)
    for anchor, positive in keys:
        relevant[anchor].add(positive)
    docs = collections.Counter(positive for _, positive in keys)
    print(f"{args.data.name} {args.split}: {len(keys)} pairs, {len(relevant)} queries, {len(docs)} documents; "
          f"a query's relevant documents {len(keys) / len(relevant):.1f} on average, a document's queries "
          f"{len(keys) / len(docs):.1f}")
    for limit in sorted({*(n for n in args.limit if n < len(keys)), len(keys)}):
        sampler = NoDuplicatesSampler(keys[:limit], args.batch_size, seed=42)
        known = negatives = batches = 0
        for batch in sampler.global_batches():
            batches += 1
            for i in batch:
                for j in batch:
                    if i != j:
                        negatives += 1
                        known += keys[j][1] in relevant[keys[i][0]]
        print(f"first {limit} pairs, {batches} batches of {args.batch_size}: {100 * known / negatives:.1f}% of the "
              f"in-batch negatives are relevant to their query ({known / (batches * args.batch_size):.2f} of a "
              f"query's {args.batch_size - 1})")


if __name__ == "__main__":
    main()
