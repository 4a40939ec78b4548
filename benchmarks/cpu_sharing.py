"""Two bert-kit commands on the same CPU cores: each one's wall time beside its time alone.

A command that shares the machine with a second one should take about twice its time alone on
cores split in two, not many times it. Each case runs its command alone, then two copies at once
(each into its own output folder), every process timed from launch to exit; the ratio is each
copy's time over the time alone. `--policy` chooses how the commands use the cores: `bert-kit`
(as they do: waiting threads spin briefly, then sleep, and the training loop sizes torch's pool to
the cores other work leaves free, `bert_kit.threads`) and/or `before` (the reference: OpenMP's own
default wait, a long spin, and a fixed thread per core).

    python benchmarks/cpu_sharing.py                               # demo and finetune, bert-kit's policy
    python benchmarks/cpu_sharing.py --cases finetune --policy bert-kit,before
    taskset -c 0,1 python benchmarks/cpu_sharing.py --json results.jsonl

The finetune case fine-tunes all-MiniLM-L6-v2 on the first 1,000 SST-2 phrases for one epoch
(its data root as the shipped configs read it: BERT_KIT_DATA, else ../shared/data).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    found = os.environ.get("BERT_KIT_DATA")
    return Path(found) if found else ROOT.parent / "shared" / "data"


CASES = {
    "demo": lambda out, model: ["demo", "--output", str(out), "--device", "cpu"],
    "finetune": lambda out, model: ["finetune", "--config", "configs/finetune_sst2.yaml", f"output_dir={out}",
                                    *([f"model={model}"] if model else []),
                             f"train_file={data_root() / 'glue/SST-2/train.tsv'}",
                             f"validation_file={data_root() / 'glue/SST-2/dev.tsv'}", "max_train_examples=1000",
                             "max_eval_examples=200", "epochs=1", "eval_every=0", "device=cpu"],
}
CORES = len(os.sched_getaffinity(0))
# the environment of each policy: "before" spins as GNU OpenMP does by default, and a fixed BERT_KIT_THREADS
# turns the pool's sizing off
POLICIES = {"bert-kit": {}, "before": {"GOMP_SPINCOUNT": "300000", "BERT_KIT_THREADS": str(CORES)}}


def launch(case: str, out: Path, policy: str, log: Path, model: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "BERT_KIT_THREADS", "OMP_NUM_THREADS")}
    env.update(POLICIES[policy])
    cmd = [sys.executable, "-m", "bert_kit", *CASES[case](out, model)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def run_together(case: str, policy: str, copies: int, work: Path, model: str | None = None) -> list[float]:
    """Wall seconds of each of `copies` processes of the case started at once."""
    t0 = time.time()
    procs = [launch(case, work / f"{case}-{policy}-{copies}-{i}", policy, work / f"{case}-{policy}-{copies}-{i}.log",
                    model) for i in range(copies)]
    seconds = [0.0] * copies
    pending = set(range(copies))
    while pending:
        for i in list(pending):
            if procs[i].poll() is not None:
                seconds[i] = time.time() - t0
                pending.discard(i)
                if procs[i].returncode != 0:
                    log = (work / f"{case}-{policy}-{copies}-{i}.log").read_text()[-2000:]
                    raise SystemExit(f"{case} ({policy}) failed with exit {procs[i].returncode}:\n{log}")
        time.sleep(0.05)
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="demo,finetune", help=f"of {', '.join(CASES)}")
    p.add_argument("--policy", default="bert-kit", help="bert-kit and/or before (the reference)")
    p.add_argument("--model", default=None, help="the finetune case's model (default: its config's, all-MiniLM-L6-v2)")
    p.add_argument("--json", type=Path, help="append one JSON line per case and policy")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for case in args.cases.split(","):
            for policy in args.policy.split(","):
                alone = run_together(case, policy, 1, work, args.model)[0]
                pair = run_together(case, policy, 2, work, args.model)
                row = {"case": case, "policy": policy, "cores": CORES, "alone_s": alone,
                       "together_s": pair, "ratio": max(pair) / alone, "date": time.strftime("%Y-%m-%d")}
                rows.append(row)
                print(f"{case:9s} {policy:9s} alone {alone:7.1f} s   two at once {pair[0]:7.1f} s, {pair[1]:7.1f} s"
                      f"   ratio {row['ratio']:.2f}x", flush=True)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(row) + "\n")
    return None


if __name__ == "__main__":
    main()
