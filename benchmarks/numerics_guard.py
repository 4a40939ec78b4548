"""Numerics guard on the GPU: the fast path trains like the plain path at BERT-base size in bf16.

Plain: eager, padded batches, MLM logits at every position, -100 labels, and autocast's own float32
LayerNorm outputs (a float32 residual stream).
Fast: torch.compile, static prediction slots (`pad_masked`), MLM decoder at masked positions only,
bf16 LayerNorm outputs (`set_low_precision_residual`, what `bert-kit pretrain` does).
Same seed, same WikiText batches, dropout off (so both runs draw no random numbers); prints the
two loss curves' largest gap, averaged over 20-step windows, and exits 1 past the tolerance.

With --dropout (p = 0.1) the plain path draws its masks with `F.dropout` and the fast path with
`bert_kit.dropout`'s Triton kernel, so the curves differ by dropout noise: a second plain run with
other masks gives the noise floor next to the plain-vs-fast gap.

    python benchmarks/numerics_guard.py --text wikitext-2/train.txt --tokenizer MINILM_FOLDER [--dropout]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_throughput import real_batches  # noqa: E402

from bert_kit import BERTForPreTraining, create_model_config  # noqa: E402
from bert_kit.heads import masked_index, pad_masked  # noqa: E402
from bert_kit.model import set_low_precision_residual  # noqa: E402
from bert_kit.training import compute_mlm_loss  # noqa: E402


def train(batches: list[dict], fast: bool, steps: int, dropout: float = 0.0, dropout_seed: int = 0) -> list[float]:
    config = create_model_config("bert-base", hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    torch.manual_seed(0)
    model = set_low_precision_residual(BERTForPreTraining(config).cuda().train(), fast)
    torch.manual_seed(dropout_seed)  # same weights, masks drawn from another stream
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def loss_fn(b):
        if fast:
            mlm, nsp = model(b["input_ids"], b["attention_mask"], b["token_type_ids"], masked_index=b["index"])
            mlm_loss = compute_mlm_loss(mlm, b["targets"])
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", type=Path, required=True)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tolerance", type=float, default=0.05, help="largest allowed gap of 20-step mean losses")
    p.add_argument("--dropout", action="store_true", help="train with dropout 0.1 (masks differ between runs)")
    args = p.parse_args()
    batches = real_batches(args.text, args.batch, 128, 50, args.tokenizer)
    dev = []
    for b in batches:  # pad every batch to 128 so the compiled fast path sees one shape
        pad = 128 - b["input_ids"].shape[1]
        b = {k: (F.pad(v, (0, pad), value=-100 if k == "labels" else 0) if v.dim() == 2 else v) for k, v in b.items()}
        index = masked_index(b["labels"])
        b["index"], b["targets"] = pad_masked(index, b["labels"].flatten()[index], capacity=args.batch * 128 // 5)
        dev.append({k: v.cuda() for k, v in b.items()})
    p_drop = 0.1 if args.dropout else 0.0
    plain = train(dev, fast=False, steps=args.steps, dropout=p_drop, dropout_seed=1)
    fast = train(dev, fast=True, steps=args.steps, dropout=p_drop, dropout_seed=1)
    window = lambda xs: [sum(xs[i:i + 20]) / 20 for i in range(0, len(xs) - 19, 20)]  # noqa: E731
    gaps = [abs(a - b) for a, b in zip(window(plain), window(fast))]
    print(f"plain: first {plain[0]:.3f} last-20 mean {sum(plain[-20:]) / 20:.3f}")
    if args.dropout:
        other = train(dev, fast=False, steps=args.steps, dropout=p_drop, dropout_seed=2)
        noise = max(abs(a - b) for a, b in zip(window(plain), window(other)))
        print(f"plain, other masks: last-20 mean {sum(other[-20:]) / 20:.3f}; largest gap to plain {noise:.4f} (noise floor)")
    print(f"fast:  first {fast[0]:.3f} last-20 mean {sum(fast[-20:]) / 20:.3f}")
    print(f"largest gap of 20-step mean losses: {max(gaps):.4f} (tolerance {args.tolerance})")
    sys.exit(0 if max(gaps) <= args.tolerance else 1)


if __name__ == "__main__":
    main()
