"""The training loop's pause at each epoch's start (diagnostic): the next epoch's workers started
early (`start_next_epoch_early`, what `bert-kit pretrain` and `finetune` do) beside started when
the epoch begins.

Builds the pretraining train loader of `bert-kit pretrain` (MLM + NSP, batch 256, seq 128) on
WikiText-2 with `--workers` DataLoader workers, and consumes three epochs as a training loop
would, sleeping `--step-ms` per batch as if the GPU were busy (the workers prefetch meanwhile).
Prints, per epoch, the wait for its first batch and the longest wait inside it (where the early
start forks the next epoch's workers), both ways in the same process.

    python benchmarks/epoch_start.py --data ../shared/data/wikitext-2 --tokenizer MINILM --workers 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_kit.tasks.pretraining_config import PretrainConfig, plan_phases  # noqa: E402
from bert_kit.tasks.pretraining_data import forever, load_corpus, phase_loaders, prepare_tokenizer  # noqa: E402


def waits(loader, epochs: int, step_s: float) -> list[list[float]]:
    """Seconds waited for each batch, per epoch, with `step_s` of other work after each."""
    batches, out = forever(loader), []
    for _ in range(epochs):
        epoch = []
        for _ in range(len(loader)):
            t = time.perf_counter()
            next(batches)
            epoch.append(time.perf_counter() - t)
            time.sleep(step_s)
        out.append(epoch)
    batches.close()  # stops the workers of the epoch started early, too
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="folder with train.txt and valid.txt (WikiText-2)")
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--step-ms", type=float, default=44.0, help="the GPU's time per step (BERT-base, one H200)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as out:
        cfg = PretrainConfig(model="bert-base-uncased", train_tokenizer=None, tokenizer=str(args.tokenizer),
                             corpus_format="wikitext", nsp=True, train_files=[str(args.data / "train.txt")],
                             eval_files=[str(args.data / "valid.txt")], batch_size=256, max_length=128,
                             num_workers=args.workers, compile=True, output_dir=out)
        tokenizer = prepare_tokenizer(cfg, Path(out), None)
        corpus = load_corpus(cfg, tokenizer, Path(out))
        phase = plan_phases(cfg, 1000)[0]
        print(f"{args.workers} workers, {args.step_ms:.0f} ms a step", flush=True)
        for early in (False, True):
            loader, _, about = phase_loaders(cfg, corpus, tokenizer, phase, torch.device("cpu"))
            loader.start_next_epoch_early = early
            result = waits(loader, args.epochs, args.step_ms / 1e3)
            print(f"next epoch's workers started {'early' if early else 'at its start'} ({about}, "
                  f"{len(loader)} batches an epoch):")
            for e, epoch in enumerate(result):
                print(f"  epoch {e}: first batch {1e3 * epoch[0]:6.0f} ms, longest other wait "
                      f"{1e3 * max(epoch[1:]):4.0f} ms, median {1e3 * statistics.median(epoch[1:]):4.1f} ms", flush=True)


if __name__ == "__main__":
    main()
