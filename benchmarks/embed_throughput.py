"""Embedding a file of sentences, launch to exit: `bert-kit embed` against SentenceTransformer.encode.

The input is the issue's 134,698 SST-2 sentences: the sentence column of sst2/train.tsv and of
glue/SST-2/train.tsv under BERT_KIT_DATA (the 67,349 training sentences twice), one a line in a
text file this script writes (`--limit N`: the first N). Each side runs in a fresh process, timed
from launch to exit, and writes a float32 .npy of the vectors:

- bert-kit: `bert-kit embed --model M --input FILE --output bk.npy` (token-budget batches, bf16
  autocast on a GPU by default; `--bk-args` adds flags, e.g. "--precision fp32");
- sentence-transformers: import, `SentenceTransformer(M)`, read the file, `encode(sentences,
  batch_size=256)` (its default fp32), np.save.

Both sides first run once on the first 1,000 sentences, untimed (`--no-warm-up`: not), so that the
first process launched does not alone pay the reads of torch's and CUDA's libraries and of the
weights from a cold disk; then the timed runs alternate, `--repeats` of each, and the fastest of
each side counts (every run is printed).

Printed: both wall times, the speed-up, sentences/s, and the agreement of the vectors (row-wise
cosine: min and mean; largest absolute difference). `--profile` adds, for the fastest bert-kit
run, when each phase of `bert-kit embed --profile` ran (start, read, tokenize, import torch, load
the model, encode, save) and the time from its last phase to the process's exit.

    python benchmarks/embed_throughput.py --limit 2000      # a check that it runs, on the CPU
    python benchmarks/embed_throughput.py --device cuda --profile   # issue 50's figure on one H200: target >= 8x
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

from finetune_cli import PYCACHE_HELP, keep_bytecode  # beside this script

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


ENV = {**os.environ, "PYTHONPATH": str(REPO)}  # both sides' environment (--pycache changes it)


def timed(command: list[str]) -> tuple[float, str, str]:
    """(seconds from launch to exit, stdout, stderr without progress bars)."""
    t0 = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    seconds = time.perf_counter() - t0
    err = "\n".join(line for line in done.stderr.replace("\r", "\n").splitlines() if "it/s]" not in line
                    and "text/s]" not in line and not line.startswith(("embed:", "Batches:")))
    if done.returncode:
        sys.exit(f"{' '.join(command[:4])} ... failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, done.stdout, err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = Path(os.environ.get("BERT_KIT_DATA", REPO.parent / "shared" / "data"))
    parser.add_argument("--data", type=Path, default=root, help="the data root (default BERT_KIT_DATA)")
    parser.add_argument("--limit", type=int, default=None, help="the first N sentences only")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--device", default="", help="cpu, cuda (default: cuda if available)")
    parser.add_argument("--bk-args", default="", help='more `bert-kit embed` flags, e.g. "--precision fp32"')
    parser.add_argument("--skip-st", action="store_true", help="time bert-kit only")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each side, alternating (default 2)")
    parser.add_argument("--no-warm-up", action="store_true", help="time the first launches too (cold caches)")
    parser.add_argument("--profile", action="store_true", help="print the phases of the fastest bert-kit run")
    parser.add_argument("--pycache", type=Path, default=None, help=PYCACHE_HELP)
    args = parser.parse_args()
    keep_bytecode(ENV, args.pycache)  # the warm-up runs write it
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")

    texts = sentences(args.data, args.limit)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        path, few = tmp / "sentences.txt", tmp / "warm-up.txt"
        path.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        few.write_text("".join(t + "\n" for t in texts[:1000]), encoding="utf-8")
        device = ["--device", args.device] if args.device else []

        def bert_kit(source: Path) -> tuple[float, str, str]:
            return timed([sys.executable, "-m", "bert_kit", "embed", "--model", args.model, "--input", str(source),
                          "--output", str(tmp / "bk.npy"), *device, *shlex.split(args.bk_args),
                          *(["--profile"] if args.profile else [])])

        def sentence_transformers(source: Path) -> tuple[float, str, str]:
            return timed([sys.executable, "-c", ST_SCRIPT, args.model, str(source), str(tmp / "st.npy"), args.device])

        sides = [("bert-kit", bert_kit)] + ([] if args.skip_st else [("st", sentence_transformers)])
        if not args.no_warm_up:
            for name, run in sides:
                print(f"warm-up, {name}, 1,000 sentences: {run(few)[0]:.2f} s", flush=True)
        runs: dict[str, list[tuple[float, str, str]]] = {name: [] for name, _ in sides}
        for i in range(args.repeats):
            for name, run in sides if i % 2 == 0 else sides[::-1]:  # alternating: a load change hits both
                runs[name].append(run(path))
                print(f"run {i + 1}, {name}: {runs[name][-1][0]:.2f} s launch to exit", flush=True)
        bk_seconds, bk_out, bk_err = min(runs["bert-kit"])
        print(bk_out.strip())
        if bk_err.strip():  # warnings, the truncation report, --profile's phases
            print(bk_err.strip())
        if args.profile:
            done = next((float(line.split()[-1]) for line in bk_err.splitlines() if line.startswith("done ")), None)
            if done is not None:
                print(f"{'exit (to the process end)':28s} {done:7.2f} {bk_seconds:7.2f} {bk_seconds - done:7.2f}")
        bk = np.load(tmp / "bk.npy")
        if args.skip_st:
            print(f"bert-kit embed: {len(texts)} sentences in {bk_seconds:.2f} s launch to exit "
                  f"({len(texts) / bk_seconds:.0f}/s)")
            return
        st_seconds = min(runs["st"])[0]
        st = np.load(tmp / "st.npy")
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # noqa: E731
    cosine = np.einsum("nh,nh->n", unit(bk.astype(np.float64)), unit(st.astype(np.float64)))
    print(f"\n{len(texts)} sentences, {args.model}, launch to exit, fastest of {args.repeats} run(s) each"
          f"{'' if args.no_warm_up else ' after a warm-up'}")
    print(f"  bert-kit embed                              {bk_seconds:8.2f} s  {len(texts) / bk_seconds:9.0f}/s")
    print(f"  SentenceTransformer.encode(batch_size=256)  {st_seconds:8.2f} s  {len(texts) / st_seconds:9.0f}/s")
    print(f"  speed-up {st_seconds / bk_seconds:.2f}x; cosine bert-kit vs sentence-transformers: "
          f"min {cosine.min():.6f}, mean {cosine.mean():.6f}; max |difference| {np.abs(bk - st).max():.2e}")


if __name__ == "__main__":
    main()
