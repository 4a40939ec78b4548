"""GLUE in one command, beside the way users run it today: `bert-kit glue` and its `transformers`
reference (benchmarks/glue_hf.py), same model, recipe, seeds and GPUs, each timed from launch to exit.

    python benchmarks/glue.py --model sentence-transformers/all-MiniLM-L6-v2 --data ../shared/data/glue
    python benchmarks/glue.py --model MINILM --data DATA/glue --gpus 0,1,2,3 --lrs 1e-4,5e-5 --seeds 1,2,3

Each side runs as its own process, as a user launches it: `python -m bert_kit glue ...` into a new
output folder, and `python benchmarks/glue_hf.py ...`. Both write glue_results.json in one format;
this prints both tables, then one table of the two side by side: each task's dev figures, their
difference, each side's seconds, the GLUE score (with and without WNLI) and its difference, and
the wall-time ratio (transformers / bert-kit). `--out FILE` appends the comparison as one JSON line.
With `--keep DIR` the two sides may run in two calls (`--sides bert-kit`, then `--sides transformers`):
a side that is not run is read from DIR, where an earlier call left it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bert_kit.tasks.glue import TASKS, markdown_table  # noqa: E402


def timed(cmd: list[str], log: Path) -> tuple[float, int]:
    """Wall seconds from launch to exit, and the exit code; the output goes to `log`."""
    t0 = time.time()
    with open(log, "w") as f:
        code = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    return time.time() - t0, code


def figures(report: dict, name: str) -> str:
    s = report["tasks"].get(name)
    return "/".join(f"{s['metrics'][k]:.1f}" for k in TASKS[name].metric_keys) if s else "-"


def side_by_side(ours: dict, ref: dict, wall: dict[str, float]) -> str:
    """The two reports in one markdown table, with the differences and the wall-time ratio."""
    lines = ["| task | metric | bert-kit | transformers | diff (score) | bert-kit s | transformers s |",
             "|---|---|---|---|---|---|---|"]
    for name in [n for n in TASKS if n in ours["tasks"] or n in ref["tasks"]]:
        a, b = ours["tasks"].get(name), ref["tasks"].get(name)
        diff = f"{a['score'] - b['score']:+.1f}" if a and b else "-"
        seconds = [f"{s['seconds']:.1f}" if s else "-" for s in (a, b)]
        lines.append(f"| {TASKS[name].title} | {TASKS[name].shown} | {figures(ours, name)} | {figures(ref, name)} | "
                     f"{diff} | {seconds[0]} | {seconds[1]} |")
    wnli = "wnli" in ours["tasks"] or "wnli" in ref["tasks"]
    for key, label in (("score", "GLUE score"), ("score_without_wnli", "without WNLI")):
        a, b = ours.get(key), ref.get(key)
        if a is not None and b is not None and (wnli or key == "score"):
            lines.append(f"| **{label}** | | **{a:.1f}** | **{b:.1f}** | **{a - b:+.1f}** | | |")
    ratio = wall["transformers"] / wall["bert-kit"]
    lines.append(f"| wall time, launch to exit | | {wall['bert-kit']:.1f} s | {wall['transformers']:.1f} s | "
                 f"**{ratio:.2f}x** | | |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--data", type=Path, required=True, help="the GLUE folder (glue_data layout)")
    p.add_argument("--tasks", default=None)
    p.add_argument("--gpus", default=None, help="e.g. 0,1,2,3 or cpu (default: every visible GPU)")
    p.add_argument("--lrs", default="auto")
    p.add_argument("--seeds", default="42")
    p.add_argument("--epochs", type=float, default=None, help="every task's epochs, both sides (quick checks)")
    p.add_argument("--max-train-examples", type=int, default=None, help="both sides (quick checks)")
    p.add_argument("--sides", default="bert-kit,transformers", help="the sides to run now")
    p.add_argument("--keep", type=Path, default=None, help="keep the runs and logs here (default: a temporary folder)")
    p.add_argument("--out", type=Path, default=None, help="append the comparison as one JSON line here")
    args = p.parse_args()

    common = ["--model", args.model, "--data", str(args.data), "--lrs", args.lrs, "--seeds", args.seeds]
    common += ["--tasks", args.tasks] if args.tasks else []
    common += ["--gpus", args.gpus] if args.gpus else []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        settings = ([f"epochs={args.epochs:g}"] if args.epochs else []) + \
                   ([f"max_train_examples={args.max_train_examples}"] if args.max_train_examples else [])
        flags = (["--epochs", f"{args.epochs:g}"] if args.epochs else []) + \
                (["--max-train-examples", str(args.max_train_examples)] if args.max_train_examples else [])
        commands = {
            "bert-kit": [sys.executable, "-m", "bert_kit", "glue", *common, "--output-dir", str(work / "bert-kit"),
                         *settings],
            "transformers": [sys.executable, str(ROOT / "benchmarks" / "glue_hf.py"), *common,
                             "--output-dir", str(work / "transformers"), *flags]}
        reports, wall = {}, {}
        for side in commands:
            if side not in args.sides.split(","):  # run by an earlier call into --keep DIR, if any
                if (work / f"{side}.wall").is_file():
                    wall[side] = float((work / f"{side}.wall").read_text())
                    reports[side] = json.loads((work / side / "glue_results.json").read_text())
                continue
            if (work / side).exists():
                raise SystemExit(f"{work / side} exists: --keep a new folder (bert-kit glue would keep its runs)")
            print(f"{side}: {' '.join(commands[side])}", flush=True)
            wall[side], code = timed(commands[side], work / f"{side}.log")
            if code != 0:
                raise SystemExit(f"{side} failed (exit {code}):\n" + (work / f"{side}.log").read_text()[-3000:])
            (work / f"{side}.wall").write_text(f"{wall[side]:.3f}\n")
            reports[side] = json.loads((work / side / "glue_results.json").read_text())
            print(f"\n{side} ({wall[side]:.1f} s, launch to exit):\n{markdown_table(reports[side])}\n", flush=True)
    if len(reports) == 2:
        print(side_by_side(reports["bert-kit"], reports["transformers"], wall))
    if args.out:
        device = next((r.get("device") for rep in reports.values() for s in rep["tasks"].values()
                       for r in s["runs"] if r.get("device")), None)
        row = {"model": args.model, "device": device, "date": time.strftime("%Y-%m-%d"), "wall_s": wall,
               **{f"{side}_score": rep["score"] for side, rep in reports.items()},
               **{f"{side}_score_without_wnli": rep["score_without_wnli"] for side, rep in reports.items()},
               "tasks": {side: {n: s["metrics"] for n, s in rep["tasks"].items()} for side, rep in reports.items()}}
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
