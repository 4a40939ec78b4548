"""The speed a user gets: `bert-kit finetune` beside a plain `transformers` loop and `Trainer`,
and bert-kit's JAX engine beside its PyTorch one.

Each side runs as its own process on one GPU, launched the way a user launches it, and is timed
from launch to exit (start-up, data, compilation, evaluation and checkpoints included):
* bert-kit: `python -m bert_kit finetune --config configs/finetune_<task>.yaml` (the shipped
  config; only model, data paths and output_dir are set on the command line);
* hf-loop / hf-trainer: `benchmarks/hf_finetune.py` with the same recipe (bf16, batch, lr,
  linear warmup, epochs, evaluation every epoch).
Reported per case: wall time, steady steps/s (between 20% and 90% of the steps), the metric,
the ratio of the faster HF wall time to bert-kit's, and where bert-kit's wall time goes (its
results.json "timings": launch to the first step, the first step, the other steps, evaluations,
checkpoints, the end; then the exit). rte and mrpc are the small cases (2,490 and 3,668 pairs).
Each side's modules are imported once before the timed runs (a first launch reads them from disk).

`--impls bertkit,bertkit-jax` runs the case with `engine=torch`, then twice with `engine=jax`:
first with an empty compilation cache (a fresh folder: a machine's first run), then again with
the cache the first run filled (`jax_cache=`; `--warm-runs N`: N times). Each JAX run reports the
programs it compiled or loaded from the cache and their seconds (JAX_LOG_COMPILES' log lines), and
the summary the ratios to PyTorch's wall time (the targets: first run <= 2x, warm cache <= 1.3x).

    python benchmarks/finetune_cli.py --model MINILM --data-dir DATA --cases sst2,stsb,conll,sst2-base
    python benchmarks/finetune_cli.py --model MINILM --data-dir DATA --cases rte,mrpc --impls bertkit,hf-loop
    python benchmarks/finetune_cli.py --model MINILM --data-dir DATA --cases rte --impls bertkit,bertkit-jax
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# case -> (bert-kit config, HF task, epochs, HF flags matching the config, random init)
CASES = {
    "sst2": ("finetune_sst2.yaml", "sst2", 3, ["--lr", "1e-4", "--warmup-fraction", "0.06"], False),
    "stsb": ("finetune_stsb.yaml", "stsb", 3, ["--lr", "1e-4", "--warmup-fraction", "0.1"], False),
    "conll": ("finetune_conll.yaml", "conll", 3, ["--lr", "1e-4", "--warmup-fraction", "0.1", "--batch-size", "16",
                                                  "--max-length", "256"], False),
    "sst2-base": ("finetune_sst2.yaml", "sst2", 1, ["--lr", "1e-4", "--warmup-fraction", "0.06"], True),
    # small pair data sets (GLUE files as released), the shipped SST-2 config with the task's columns
    "rte": ("finetune_sst2.yaml", "rte", 3, ["--lr", "1e-4", "--warmup-fraction", "0.06"], False),
    "mrpc": ("finetune_sst2.yaml", "mrpc", 3, ["--lr", "1e-4", "--warmup-fraction", "0.06"], False),
}
COLUMNS = {  # bert-kit settings that read a case's files
    "rte": ["text_column=sentence1", "text_pair_column=sentence2", "label_column=label",
            "label_names=[entailment,not_entailment]"],
    "mrpc": ["text_column=#1 String", "text_pair_column=#2 String", "label_column=Quality",
             "label_names=[not_equivalent,equivalent]"],
}
DATA = {"sst2": ("sst2/train.tsv", "sst2/dev.tsv"), "stsb": ("stsb/sts-train.csv", "stsb/sts-dev.csv"),
        "conll": ("conll2003/train.txt", "conll2003/valid.txt"),
        "rte": ("glue/RTE/train.tsv", "glue/RTE/dev.tsv"), "mrpc": ("glue/MRPC/train.tsv", "glue/MRPC/dev.tsv")}


ENV = dict(os.environ)  # every side's environment (--pycache changes it)
# what each side imports: launched once before the timed runs, so that no side pays for the first
# reading of its files (or, with --pycache, the compiling of its modules) and the other does not
WARM_UP = {"bert-kit": "import bert_kit.cli.finetune, bert_kit.tasks.finetuning, bert_kit.training.loop"
                        + ("; import bert_kit.jax.engine" if importlib.util.find_spec("jax") else ""),
           "hf": "import torch, transformers; transformers.AutoModelForSequenceClassification; transformers.AutoTokenizer"}


PYCACHE_HELP = ("Python's bytecode caches here, for both sides (PYTHONPYCACHEPREFIX), where the environment "
                "disables them (PYTHONDONTWRITEBYTECODE): an install by pip has them")


def keep_bytecode(env: dict[str, str], pycache: Path | None) -> None:
    """--pycache: every side launched with `env` keeps its bytecode in `pycache` (the first launches
    write it), where the environment disables bytecode; without it, a note says what each launch pays."""
    if pycache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache.resolve())
    elif env.get("PYTHONDONTWRITEBYTECODE"):
        print("note: PYTHONDONTWRITEBYTECODE is set: every launch compiles every module it imports (seconds for "
              "torch and transformers); --pycache DIR measures as a pip install runs", file=sys.stderr)


def timed(cmd: list[str], log: Path) -> tuple[float, int]:
    t0 = time.time()
    with open(log, "w") as f:
        code = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=ENV).returncode
    return time.time() - t0, code


def warm_up(impls: list[str]) -> None:
    """Import each side's modules once, untimed (see WARM_UP)."""
    for side in {"bert-kit" if impl.startswith("bertkit") else "hf" for impl in impls}:
        subprocess.run([sys.executable, "-c", WARM_UP[side]], cwd=ROOT, env=ENV, check=True)


def train_records(run_dir: Path) -> list[dict]:
    """The train records of a run's metrics.jsonl."""
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return [r for r in records if r.get("type") == "train"]


def steady_rate(train: list[dict]) -> float | None:
    """Steps/s between 20% and 90% of the run, from its train records."""
    last = train[-1]["step"] if train else 0
    window = [r for r in train if 0.2 * last < r["step"] <= 0.9 * last]
    if len(window) < 2:
        return None
    steps = window[-1]["step"] - window[0]["step"]
    seconds = sum(r["seconds"] for r in window[1:])
    return steps / seconds if seconds else None


def compilations(log: str) -> dict:
    """Programs a JAX run compiled and loaded from its cache, and the seconds (JAX_LOG_COMPILES)."""
    finished = [float(x) for x in re.findall(r"Finished XLA compilation of .* in ([0-9.]+) sec", log)]
    return {"programs": len(finished), "cache_hits": log.count("Persistent compilation cache hit"),
            "compile_s": round(sum(finished), 2)}


def run_bertkit(case: str, args: argparse.Namespace, tmp: Path, impl: str = "bert-kit",
                extra: tuple[str, ...] = ()) -> dict:
    config, task, epochs, _, random_init = CASES[case]
    epochs = args.epochs or epochs
    train, dev = DATA[task]
    name = f"{impl}-{case}"
    out = tmp / name
    model = ["model=bert-base", f"tokenizer={args.model}"] if random_init else [f"model={args.model}"]
    cmd = [sys.executable, "-m", "bert_kit", "finetune", "--config", str(ROOT / "configs" / config), *model,
           f"train_file={args.data_dir / train}", f"validation_file={args.data_dir / dev}", f"epochs={epochs}",
           f"output_dir={out}", "overwrite=true", "--output", str(tmp / f"{name}.json"), *COLUMNS.get(case, []),
           *args.bertkit_set, *extra]
    wall, code = timed(cmd, tmp / f"{name}.log")
    log = (tmp / f"{name}.log").read_text(errors="replace")
    if code != 0:
        return {"impl": impl, "case": case, "error": log[-3000:]}
    results = json.loads((tmp / f"{name}.json").read_text())
    train = train_records(out)
    # where the wall time goes: the run's own timings (launch to the first step, the first step, the
    # other steps, evaluations, checkpoints, the end) and the exit after results.json
    timings = dict(results.get("timings") or {})
    timings["exit_s"] = round(wall - results["wall_time_s"], 3)
    return {"impl": impl, "case": case, "wall_s": wall, "steps": results["steps"],
            "steady_steps_per_s": steady_rate(train), "best": results["best_value"],
            "final": (results.get("final_metrics") or {}).get(results["metric"]), "timings": timings,
            "train_time_s": results.get("train_time_s"), "fast_path": results.get("fast_path"),
            **(compilations(log) if "jax" in impl else {})}


def run_bertkit_jax(case: str, args: argparse.Namespace, tmp: Path) -> list[dict]:
    """engine=jax twice: with an empty compilation cache (a fresh folder), then with what it kept."""
    cache = tmp / f"jax-cache-{case}"
    extra = ("engine=jax", f"jax_cache={cache}")
    warm = ["warm"] + [f"warm{i}" for i in range(2, args.warm_runs + 1)]
    return [run_bertkit(case, args, tmp, f"jax-{run}", extra) for run in ("first", *warm)]


def run_hf(case: str, impl: str, args: argparse.Namespace, tmp: Path) -> dict:
    _, task, epochs, flags, random_init = CASES[case]
    epochs = args.epochs or epochs
    cmd = [sys.executable, str(ROOT / "benchmarks" / "hf_finetune.py"), "--impl", impl, "--task", task,
           "--model", str(args.model), "--data-dir", str(args.data_dir), "--epochs", str(epochs), *flags]
    if random_init:
        cmd.append("--random-init")
    log = tmp / f"hf-{impl}-{case}.log"
    wall, code = timed(cmd, log)
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("{")]
    if code != 0 or not lines:
        return {"impl": f"hf-{impl}", "case": case, "error": log.read_text()[-3000:]}
    return {**json.loads(lines[-1]), "case": case, "wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="all-MiniLM-L6-v2 folder (its tokenizer for bert-base)")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--cases", default="sst2,stsb,conll,sst2-base")
    p.add_argument("--impls", default="bertkit,hf-loop,hf-trainer",
                   help="bertkit (engine=torch), bertkit-jax (engine=jax: first run, warm cache), hf-loop, hf-trainer")
    p.add_argument("--epochs", type=float, default=None, help="override every case's epochs (quick checks)")
    p.add_argument("--bertkit-set", nargs="*", default=[], help="extra key=value settings for bert-kit")
    p.add_argument("--warm-runs", type=int, default=1, help="engine=jax runs with the cache the first one filled")
    p.add_argument("--out", type=Path, default=None, help="append one JSON line per run here")
    p.add_argument("--pycache", type=Path, default=None, help=PYCACHE_HELP)
    p.add_argument("--logs", type=Path, default=None, help="keep each run's log here (a JAX run's compilations)")
    args = p.parse_args()
    keep_bytecode(ENV, args.pycache)
    warm_up(args.impls.split(","))
    if "bertkit-jax" in args.impls.split(","):
        ENV["JAX_LOG_COMPILES"] = "1"  # each compilation and cache hit logged: counted per run
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for case in args.cases.split(","):
            for impl in args.impls.split(","):
                if impl == "bertkit":
                    done = [run_bertkit(case, args, tmp)]
                elif impl == "bertkit-jax":
                    done = run_bertkit_jax(case, args, tmp)
                else:
                    done = [run_hf(case, impl[3:], args, tmp)]
                if args.logs:
                    args.logs.mkdir(parents=True, exist_ok=True)
                    for log in tmp.glob("*.log"):
                        shutil.copy(log, args.logs / log.name)
                for row in done:
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.out:
                        with open(args.out, "a") as f:
                            f.write(json.dumps(row) + "\n")
    print(f"\n{'case':<10} {'impl':<11} {'wall s':>8} {'steps/s':>8} {'best':>7}  ratio (faster HF / bert-kit)")
    for case in args.cases.split(","):
        mine = [r for r in rows if r["case"] == case]
        ours = next((r for r in mine if r["impl"] == "bert-kit" and "wall_s" in r), None)
        hf = [r["wall_s"] for r in mine if r["impl"].startswith("hf") and "wall_s" in r]
        for r in mine:
            if "error" in r:
                print(f"{case:<10} {r['impl']:<11} failed: {r['error'][-300:]}")
                continue
            rate = f"{r['steady_steps_per_s']:.1f}" if r.get("steady_steps_per_s") else "-"
            best = f"{r['best']:.4f}" if isinstance(r.get("best"), float) else "-"
            ratio = f"{min(hf) / ours['wall_s']:.2f}x" if r is ours and hf else ""
            print(f"{case:<10} {r['impl']:<11} {r['wall_s']:>8.1f} {rate:>8} {best:>7}  {ratio}")
    for case in args.cases.split(","):
        torch_run = next((r for r in rows if r["case"] == case and r["impl"] == "bert-kit" and "wall_s" in r), None)
        for r in rows:
            if r["case"] == case and r["impl"].startswith("jax-") and "wall_s" in r:
                run, target = r["impl"], 2.0 if r["impl"] == "jax-first" else 1.3
                ratio = (f", {r['wall_s'] / torch_run['wall_s']:.2f}x PyTorch's (target <= {target}x)"
                         if torch_run else "")
                print(f"{case} {run}: {r['wall_s']:.1f} s{ratio}; {r['programs']} programs compiled or loaded "
                      f"({r['cache_hits']} from the cache) in {r['compile_s']:.1f} s; best {r['best']}")
    timed = [r for r in rows if r.get("timings")]
    if timed:
        keys = ["start_s", "first_step_s", "train_s", "eval_s", "save_s", "end_s", "exit_s"]
        print(f"\nbert-kit, where the wall time goes (s): {'case':<10} {'run':<10} "
              + " ".join(f"{k[:-2]:>10}" for k in keys))
        for r in timed:
            print(f"{'':<40}{r['case']:<10} {r['impl']:<10} "
                  + " ".join(f"{r['timings'].get(k, 0):>10.2f}" for k in keys))


if __name__ == "__main__":
    main()
