"""Training speed of the NumPy reference engine on the teaching configuration.

    .venv/bin/python benchmarks/numpy_ref_speed.py                # 4 layers, H 256, 4 heads, FF 1024
    .venv/bin/python benchmarks/numpy_ref_speed.py --threads 0    # BLAS default thread count

One step = forward, MLM + NSP losses, hand-written backward and the SGD update, exactly the loop of
``bert_kit.numpy_ref.runner.train_step``. Prints steps/s, tokens/s and the achieved GFLOP/s, then the
same figures for ``transformers.BertForPreTraining`` (torch autograd, CPU, same sizes and threads)
measured in the same run as the reference (skip it with --no-torch).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bert_kit.numpy_ref import BertModel, create_mlm_batch
from bert_kit.numpy_ref.runner import blas_threads, train_step


def train_flops(layers: int, hidden: int, ff: int, vocab: int, batch: int, seq: int, masked: int) -> float:
    """Matmul FLOPs of one training step (backward = 2x forward); masked = MLM positions in the batch."""
    tokens = batch * seq
    per_token = layers * (2 * 4 * hidden * hidden + 2 * 2 * hidden * ff + 2 * 2 * seq * hidden)
    head = masked * 2 * (hidden * hidden + hidden * vocab)
    return 3.0 * (tokens * per_token + head)


def time_steps(step, warmup: int, steps: int) -> float:
    """Seconds per step, median of ``steps`` timed calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def report(name: str, seconds: float, tokens: int, flops: float) -> None:
    print(f"{name:<34s} {1 / seconds:8.2f} steps/s {tokens / seconds:10.0f} tokens/s "
          f"{flops / seconds / 1e9:7.1f} GFLOP/s  ({seconds * 1e3:.0f} ms/step)")


def torch_reference(args, batch) -> float:
    """Seconds per step of HF BertForPreTraining with torch autograd and torch.optim.SGD."""
    import torch
    import transformers

    torch.set_num_threads(max(args.threads, 1) if args.threads else torch.get_num_threads())
    config = transformers.BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                     num_attention_heads=args.heads, intermediate_size=args.ff,
                                     max_position_embeddings=args.seq, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    config._attn_implementation = "eager"  # same maths as the NumPy engine, no fused kernel
    model = transformers.BertForPreTraining(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    input_ids = torch.tensor(batch.input_ids)
    valid = batch.mlm_labels >= 0
    labels = np.full(batch.input_ids.shape, -100)
    rows = np.nonzero(valid)[0]
    labels[rows, batch.masked_positions[valid]] = batch.mlm_labels[valid]
    labels, nsp = torch.tensor(labels), torch.tensor(batch.nsp_labels)

    def step() -> None:
        optimizer.zero_grad()
        model(input_ids=input_ids, labels=labels, next_sentence_label=nsp).loss.backward()
        optimizer.step()

    return time_steps(step, args.warmup, args.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--ff", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--threads", type=int, default=1, help="BLAS / torch threads (0 = library default)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-torch", action="store_true", help="skip the transformers reference")
    args = parser.parse_args()

    model = BertModel(args.vocab, args.hidden, args.heads, args.ff, args.layers, args.seq, dtype=args.dtype)
    batch = create_mlm_batch(args.batch, args.seq, args.vocab, mask_prob=0.15, random_seed=0)
    masked = int((batch.masked_positions >= 0).sum())
    tokens = args.batch * args.seq
    flops = train_flops(args.layers, args.hidden, args.ff, args.vocab, args.batch, args.seq, masked)
    print(f"config: {args.layers} layers, hidden {args.hidden}, {args.heads} heads, ff {args.ff}, "
          f"seq {args.seq}, batch {args.batch}, vocab {args.vocab}, {args.dtype}, threads {args.threads or 'default'}; "
          f"{model.num_parameters() / 1e6:.2f}M parameters, {masked} masked tokens, {flops / 1e9:.2f} GFLOP/step")
    with blas_threads(args.threads):
        seconds = time_steps(lambda: train_step(model, batch, 1e-3), args.warmup, args.steps)
    report(f"numpy_ref ({args.dtype})", seconds, tokens, flops)
    if not args.no_torch:
        try:
            report("transformers reference (float32)", torch_reference(args, batch), tokens, flops)
        except ImportError as err:
            print(f"transformers reference skipped: {err}")


if __name__ == "__main__":
    main()
