"""Numerics guard on the GPU: the fast path trains like the plain path at BERT-base size in bf16.

Plain: eager, padded batches, MLM logits at every position, -100 labels, and autocast's own float32
LayerNorm outputs (a float32 residual stream).
Fast: torch.compile, static prediction slots (`with_prediction_slots`), MLM decoder at masked positions only,
and the fast path `bert-kit pretrain` applies (`fast_path.apply`: bf16 LayerNorm outputs, the Triton kernels).
Same seed, same WikiText batches, dropout off (so both runs draw no random numbers); prints the
two loss curves' largest gap, averaged over 20-step windows, and exits 1 past the tolerance.

With --dropout (p = 0.1) the plain path draws its masks with `F.dropout` and the fast path with
`bert_kit.kernels.dropout`'s Triton kernel, so single curves differ by dropout noise: each path trains with
several mask seeds and the mean losses are compared against their standard error.

    python benchmarks/numerics_guard.py --text wikitext-2/train.txt --tokenizer MINILM_FOLDER [--dropout]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_throughput import real_batches  # noqa: E402

from bert_kit import BERTForPreTraining, create_model_config  # noqa: E402
from bert_kit.heads import with_prediction_slots  # noqa: E402
from bert_kit.kernels import fast_path  # noqa: E402
from bert_kit.training.losses import compute_mlm_loss  # noqa: E402


def train(batches: list[dict], fast: bool, steps: int, dropout: float = 0.0, dropout_seed: int = 0) -> list[float]:
    config = create_model_config("bert-base", hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    torch.manual_seed(0)
    model = BERTForPreTraining(config).cuda().train()
    fast_path.apply(model, "cuda", training=True, dtype=torch.bfloat16, compile=fast, low_precision_residual=fast)
    torch.manual_seed(dropout_seed)  # same weights, masks drawn from another stream
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def loss_fn(b):
        if fast:
            mlm, nsp = model(b["input_ids"], b["attention_mask"], b["token_type_ids"], masked_index=b["masked_index"])
            mlm_loss = compute_mlm_loss(mlm, b["masked_labels"])
        else:
            mlm, nsp = model(b["input_ids"], b["attention_mask"], b["token_type_ids"])
            mlm_loss = compute_mlm_loss(mlm, b["labels"])
        return mlm_loss + F.cross_entropy(nsp.float(), b["next_sentence_label"])

    step_fn = torch.compile(loss_fn, dynamic=False) if fast else loss_fn
    losses = []
    for i in range(steps):
        b = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(b)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return [float(x) for x in losses]


def compare_with_dropout(dev: list[dict], steps: int, seeds: int, tolerance: float) -> bool:
    """Dropout 0.1, `seeds` mask streams per path: each run's mean loss over its last two thirds
    of steps; the paths agree when their averages differ by at most 3 standard errors (or tolerance)."""
    tail = lambda xs: statistics.mean(xs[steps // 3:])  # noqa: E731
    runs = {name: [tail(train(dev, fast=name == "fast", steps=steps, dropout=0.1, dropout_seed=s))
                   for s in range(1, seeds + 1)] for name in ("plain", "fast")}
    for name, values in runs.items():
        print(f"{name}: mean loss over steps {steps // 3}-{steps} per mask seed: "
              + ", ".join(f"{v:.4f}" for v in values) + f"  (average {statistics.mean(values):.4f})")
    diff = statistics.mean(runs["fast"]) - statistics.mean(runs["plain"])
    se = math.sqrt(sum(statistics.variance(v) / len(v) for v in runs.values())) if seeds > 1 else 0.0
    limit = max(3 * se, tolerance)
    print(f"fast - plain: {diff:+.4f} (standard error {se:.4f}; limit {limit:.4f})")
    return abs(diff) <= limit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", type=Path, required=True)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tolerance", type=float, default=0.05, help="largest allowed gap of 20-step mean losses")
    p.add_argument("--dropout", action="store_true", help="train with dropout 0.1 (masks differ between runs)")
    p.add_argument("--seeds", type=int, default=3, help="--dropout: mask streams per path")
    args = p.parse_args()
    batches = real_batches(args.text, args.batch, 128, 50, args.tokenizer)
    dev = []
    for b in batches:  # pad every batch to 128 so the compiled fast path sees one shape
        pad = 128 - b["input_ids"].shape[1]
        b = {k: (F.pad(v, (0, pad), value=-100 if k == "labels" else 0) if v.dim() == 2 else v) for k, v in b.items()}
        b = with_prediction_slots(b, share=0.2, multiple=1)
        dev.append({k: v.cuda() for k, v in b.items()})
    if args.dropout:
        sys.exit(0 if compare_with_dropout(dev, args.steps, args.seeds, args.tolerance) else 1)
    plain = train(dev, fast=False, steps=args.steps)
    fast = train(dev, fast=True, steps=args.steps)
    window = lambda xs: [sum(xs[i:i + 20]) / 20 for i in range(0, len(xs) - 19, 20)]  # noqa: E731
    gaps = [abs(a - b) for a, b in zip(window(plain), window(fast))]
    print(f"plain: first {plain[0]:.3f} last-20 mean {sum(plain[-20:]) / 20:.3f}")
    print(f"fast:  first {fast[0]:.3f} last-20 mean {sum(fast[-20:]) / 20:.3f}")
    print(f"largest gap of 20-step mean losses: {max(gaps):.4f} (tolerance {args.tolerance})")
    sys.exit(0 if max(gaps) <= args.tolerance else 1)

if __name__ == "__main__":
    main()
