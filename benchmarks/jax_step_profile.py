"""Where the JAX engine's fine-tuning steps spend the GPU's time: a diagnostic, not a speed claim.

Runs `bert-kit finetune engine=jax` in this process on GLUE's RTE files (the shipped SST-2 config
with RTE's columns, as `finetune_cli.py`'s case "rte"), records steps `--steps A:B` with
`jax.profiler`, and prints the GPU's time per step, kernel by kernel (the `--top` longest), beside
the wall time of those steps. `--blocks` picks how the encoder's blocks run:
* scanned: as a short fine-tune runs them (`SHORT_MAX_STEPS`): one block traced, `jax.lax.scan`
  over the stacked weights;
* in-turn: called one after the other, as a longer run calls them, the rest of the run as a short
  fine-tune's (gradients and update as two programs, not autotuned, no add & norm kernel).
Each run compiles into an empty cache of its own (its programs are those a warm run would load);
the kernels' names are XLA's fusions', cuBLAS's and the Pallas kernels'.

    python benchmarks/jax_step_profile.py --model MINILM --data-dir DATA --blocks scanned
    python benchmarks/jax_step_profile.py --model MINILM --data-dir DATA --blocks in-turn --top 40
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bert_kit from this checkout, installed or not
DERIVED = ("XLA Modules", "Steps", "XLA Ops", "Source", "Framework Ops")  # a GPU plane's summaries of its streams


def kernel_times(folder: Path, steps: int, grouped: bool = False) -> tuple[float, dict[str, tuple[float, int]]]:
    """(GPU milliseconds a step, {kernel: (milliseconds a step, calls a step)}) of the profiles in
    `folder` that recorded `steps` steps: every event of the GPUs' streams, not of the lines XLA
    derives from them (its modules and ops would count the same time twice). grouped: names
    without their numeric suffixes (`loop_add_fusion.3` -> `loop_add_fusion`)."""
    from jax.profiler import ProfileData

    kernels: dict[str, list[float]] = {}
    for path in folder.rglob("*.xplane.pb"):
        for plane in ProfileData.from_file(str(path)).planes:
            if not plane.name.startswith("/device:GPU"):
                continue
            for line in (line for line in plane.lines if line.name not in DERIVED):
                for event in line.events:
                    name = re.sub(r"([._]\d+)+$", "", event.name) if grouped else event.name
                    ms, calls = kernels.get(name, (0.0, 0))
                    kernels[name] = [ms + event.duration_ns / 1e6, calls + 1]
    per_step = {name: (ms / steps, round(calls / steps)) for name, (ms, calls) in kernels.items()}
    return sum(ms for ms, _ in per_step.values()), per_step


def table(total: float, per_step: dict[str, tuple[float, int]], top: int) -> str:
    """The `top` longest kernels, one line each, under their total."""
    lines = [f"GPU: {total:.3f} ms a step in {sum(calls for _, calls in per_step.values())} kernels",
             "   ms/step  calls/step  kernel"]
    for name, (ms, calls) in sorted(per_step.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {ms:8.3f}  {calls:10d}  {name[:140]}")
    return "\n".join(lines)


def blocks_in_turn(layers: list, x, mask, rngs):
    """`model.scan_blocks`'s result, from the blocks called in turn."""
    for layer in layers:
        x = layer(x, mask, rngs)
    return x


def profile_run(settings: list[str], first: int, end: int, folder: Path) -> float:
    """Run `bert-kit finetune` with `settings` (engine=jax) in this process, recording steps
    first..end-1 into `folder` (the device waited for before and after); their wall time in ms."""
    import jax

    import bert_kit.jax.engine as engine
    from bert_kit.cli import main as bert_kit

    calls, wall = [0], {}
    step = engine.JaxEngine.step

    def recorded(self, micro_batches, lr):
        calls[0] += 1
        if calls[0] == first:
            jax.block_until_ready(self.leaves)
            jax.profiler.start_trace(str(folder))
            wall["start"] = time.perf_counter()
        step(self, micro_batches, lr)
        if calls[0] == end - 1:
            jax.block_until_ready(self.leaves)
            wall["end"] = time.perf_counter()
            jax.profiler.stop_trace()

    engine.JaxEngine.step = recorded
    try:
        code = bert_kit(["finetune", *settings])
    finally:
        engine.JaxEngine.step = step
    if code != 0 or "end" not in wall:
        raise SystemExit(f"the run ended (status {code}) after {calls[0]} steps, before step {end - 1}")
    return (wall["end"] - wall["start"]) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="all-MiniLM-L6-v2 folder")
    p.add_argument("--data-dir", type=Path, required=True, help="data root holding glue/RTE/")
    p.add_argument("--blocks", choices=["scanned", "in-turn"], default="scanned")
    p.add_argument("--steps", default="60:110", help="the steps recorded, A:B (1-based, B excluded)")
    p.add_argument("--top", type=int, default=25, help="kernels listed")
    args = p.parse_args()
    first, end = (int(x) for x in args.steps.split(":"))
    if not 1 < first < end:
        p.error(f"--steps {args.steps}: want A:B with 1 < A < B (the first step compiles)")

    import jax

    if jax.default_backend() != "gpu":
        p.error(f"no GPU here (JAX's backend is {jax.default_backend()}): the GPU's kernels are what this times")
    import bert_kit.jax.model as model
    from finetune_cli import COLUMNS  # the settings that read RTE's columns

    if args.blocks == "in-turn":  # what BertEncoder runs where a short fine-tune scans its blocks
        model.scan_blocks = blocks_in_turn
    work, rte = Path(tempfile.mkdtemp(prefix="jax_step_profile-")), args.data_dir / "glue" / "RTE"
    settings = ["--config", str(ROOT / "configs" / "finetune_sst2.yaml"), f"model={args.model}",
                f"train_file={rte / 'train.tsv'}", f"validation_file={rte / 'dev.tsv'}", *COLUMNS["rte"], "engine=jax",
                f"output_dir={work / 'run'}", f"jax_cache={work / 'cache'}", "epochs=3"]
    ms = profile_run(settings, first, end, work / "profile")
    print(f"RTE, 3 epochs, blocks {args.blocks}: steps {first}-{end - 1} took {ms:.1f} ms of wall time, "
          f"profiler on ({ms / (end - first):.2f} ms a step)")
    print(table(*kernel_times(work / "profile", end - first), args.top))


if __name__ == "__main__":
    main()
