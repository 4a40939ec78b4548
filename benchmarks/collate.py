"""Host time to collate one training batch (diagnostic): `pad_collate` beside one tensor op per row.

With CUDA graphs a small model's training step is one graph replay, so the host's work per step,
collating the next batch above all, sets the step rate. This times `pad_collate` on real STS-B
train pairs (batches of 32, lengths padded to multiples of 16, as a graphed fine-tuning run cuts
them) against the per-row padding it replaced. Best of `--repeats` passes over the batches.

    python benchmarks/collate.py --data-dir ../shared/data --model MINILM
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_kit.data.classification import pad_collate  # noqa: E402
from bert_kit.data.sts import read_sts  # noqa: E402
from bert_kit.tokenizer import get_tokenizer  # noqa: E402


def per_row_collate(batch: list[dict], pad_token_id: int, multiple: int) -> dict[str, torch.Tensor]:
    """The reference: a padded tensor per key, filled one row at a time."""
    longest = max(len(item["input_ids"]) for item in batch)
    length = -(-longest // multiple) * multiple
    out = {}
    for key, pad in (("input_ids", pad_token_id), ("token_type_ids", 0), ("attention_mask", 0)):
        rows = torch.full((len(batch), length), pad, dtype=torch.long)
        for i, item in enumerate(batch):
            rows[i, : len(item[key])] = torch.as_tensor(item[key], dtype=torch.long)
        out[key] = rows
    out["labels"] = torch.tensor([float(item["labels"]) for item in batch])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2", help="its tokenizer")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    tokenizer = get_tokenizer(args.model)
    first, second, scores = read_sts(args.data_dir / "stsb" / "sts-train.csv")
    enc = tokenizer(first, second, max_length=128, padding=False, return_tensors=None)  # lists, as tasks keep them
    items = [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
              "attention_mask": enc["attention_mask"][i], "labels": float(scores[i])}
             for i in range(len(scores))]
    batches = [items[i: i + 32] for i in range(0, len(items), 32)]
    fns = {"pad_collate": lambda b: pad_collate(b, tokenizer.pad_token_id, 16),
           "per-row reference": lambda b: per_row_collate(b, tokenizer.pad_token_id, 16)}
    a, b = fns["pad_collate"](batches[0]), fns["per-row reference"](batches[0])
    assert all(torch.equal(a[k], b[k]) for k in b), "the two collates disagree"
    best = {}
    for name, fn in fns.items():
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for batch in batches:
                fn(batch)
            times.append((time.perf_counter() - t0) / len(batches))
        best[name] = min(times) * 1e3
    for name, ms in best.items():
        print(f"{name:<18} {ms:.3f} ms per batch of 32 ({len(batches)} batches)")
    print(f"ratio {best['per-row reference'] / best['pad_collate']:.2f}x")


if __name__ == "__main__":
    main()
