"""Embedding a file of sentences, launch to exit: `bert-kit embed` against SentenceTransformer.encode.

The input is the issue's 134,698 SST-2 sentences: the sentence column of sst2/train.tsv and of
glue/SST-2/train.tsv under BERT_KIT_DATA (the 67,349 training sentences twice), one a line in a
text file this script writes (`--limit N`: the first N). Each side runs in a fresh process, timed
from launch to exit, and writes a float32 .npy of the vectors:

- bert-kit: `bert-kit embed --model M --input FILE --output bk.npy` (token-budget batches, bf16
  autocast on a GPU by default; `--bk-args` adds flags, e.g. "--precision fp32");
- sentence-transformers: import, `SentenceTransformer(M)`, read the file, `encode(sentences,
  batch_size=256)` (its default fp32), np.save.

Printed: both wall times, the speed-up, sentences/s, and the agreement of the vectors (row-wise
cosine: min and mean; largest absolute difference).

    python benchmarks/embed_throughput.py --limit 2000      # a check that it runs, on the CPU
    python benchmarks/embed_throughput.py --device cuda      # issue 50's figure on one H200: target >= 8x
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
SOURCES = ("sst2/train.tsv", "glue/SST-2/train.tsv")

ST_SCRIPT = """
import sys, numpy as np
from sentence_transformers import SentenceTransformer
from bert_kit.model_folder import resolve_model
model_name, path, out, device = sys.argv[1:5]
model = SentenceTransformer(str(resolve_model(model_name)), device=device or None)
with open(path, encoding="utf-8") as f:
    sentences = f.read().split("\\n")[:-1]
np.save(out, model.encode(sentences, batch_size=256, convert_to_numpy=True))
"""


def sentences(root: Path, limit: int | None) -> list[str]:
    """The sentence column of each SST-2 training file, in order."""
    out = []
    for name in SOURCES:
        lines = (root / name).read_text(encoding="utf-8").split("\n")
        column = lines[0].split("\t").index("sentence")
        out += [line.split("\t")[column] for line in lines[1:] if line.strip()]
    return out[:limit]


def timed(command: list[str]) -> tuple[float, str]:
    """(seconds from launch to exit, stdout); stderr (progress bars) passes through."""
    t0 = time.perf_counter()
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return time.perf_counter() - t0, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = Path(os.environ.get("BERT_KIT_DATA", REPO.parent / "shared" / "data"))
    parser.add_argument("--data", type=Path, default=root, help="the data root (default BERT_KIT_DATA)")
    parser.add_argument("--limit", type=int, default=None, help="the first N sentences only")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--device", default="", help="cpu, cuda (default: cuda if available)")
    parser.add_argument("--bk-args", default="", help='more `bert-kit embed` flags, e.g. "--precision fp32"')
    parser.add_argument("--skip-st", action="store_true", help="time bert-kit only")
    args = parser.parse_args()

    texts = sentences(args.data, args.limit)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        path = tmp / "sentences.txt"
        path.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        device = ["--device", args.device] if args.device else []
        bk_seconds, bk_out = timed([sys.executable, "-m", "bert_kit", "embed", "--model", args.model,
                                    "--input", str(path), "--output", str(tmp / "bk.npy"), *device,
                                    *shlex.split(args.bk_args)])
        print(bk_out.strip())
        bk = np.load(tmp / "bk.npy")
        if args.skip_st:
            print(f"bert-kit embed: {len(texts)} sentences in {bk_seconds:.2f} s launch to exit "
                  f"({len(texts) / bk_seconds:.0f}/s)")
            return
        st_seconds, _ = timed([sys.executable, "-c", ST_SCRIPT, args.model, str(path), str(tmp / "st.npy"),
                               args.device])
        st = np.load(tmp / "st.npy")
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # noqa: E731
    cosine = np.einsum("nh,nh->n", unit(bk.astype(np.float64)), unit(st.astype(np.float64)))
    print(f"\n{len(texts)} sentences, {args.model}, launch to exit")
    print(f"  bert-kit embed                              {bk_seconds:8.2f} s  {len(texts) / bk_seconds:9.0f}/s")
    print(f"  SentenceTransformer.encode(batch_size=256)  {st_seconds:8.2f} s  {len(texts) / st_seconds:9.0f}/s")
    print(f"  speed-up {st_seconds / bk_seconds:.2f}x; cosine bert-kit vs sentence-transformers: "
          f"min {cosine.min():.6f}, mean {cosine.mean():.6f}; max |difference| {np.abs(bk - st).max():.2e}")


if __name__ == "__main__":
    main()
