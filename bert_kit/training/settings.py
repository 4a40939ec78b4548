"""`RunSettings`: the settings every training run shares, whatever the job.

`PretrainConfig` (tasks/pretraining.py) and `FinetuneConfig` (tasks/finetuning.py) extend it with
what their job needs and override a few defaults (fine-tuning takes a smaller lr, for instance).
The one training loop (`training/loop.py`) reads only these fields. A field's help text is its
same-line comment or attribute docstring (`bert-kit pretrain --help` lists them all).

Resuming a run (`--resume`) may change some settings and not others (`RESUMABLE_CHANGES`): the
learning rate, weight decay, length of the run and the logging/evaluation/checkpoint cadence take
effect and are reported; anything else that shapes the run (model, data, batch, seed, ...) stops
with an error naming the settings, unless `force_resume: true`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from bert_kit.training.distributed import DEFAULT_TIMEOUT_S

# settings a resumed run may change; every other difference is refused unless force_resume
RESUMABLE_CHANGES = frozenset({
    "lr", "weight_decay", "clip_grad", "max_steps", "grad_accum", "epochs", "time_budget", "warmup_steps", "schedule",
    "min_lr_ratio", "log_every", "eval_every", "eval_batches", "save_every", "save_minutes", "keep_last", "tensorboard",
    "num_workers", "dist_timeout_s", "device", "eval_batch_size", "max_eval_examples", "output_dir",
    "overwrite", "force_resume", "metric", "compile", "cuda_graphs", "compile_tuning", "n_best",
    "max_answer_length", "parallel", "precision",
})

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr)?\s*$")
_UNIT_SECONDS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}


def parse_duration(text: str | float | int | None) -> float | None:
    """'6m' -> 360.0, '90s' or 90 -> 90.0, '1.5h' -> 5400.0, None -> None."""
    if text is None:
        return None
    m = _DURATION.match(str(text))
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"time_budget: {text!r} is not a positive duration such as 90s, 6m or 1.5h")
    return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]


def check_range(owner: object, name: str, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False, allow_none: bool = False) -> None:
    """Raise ValueError naming `name`, its value and the allowed range unless low <= value <= high."""
    value = getattr(owner, name)
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: {value!r} is not a finite number")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        shown = f"{left}{low if low is not None else '-inf'}, {high if high is not None else 'inf'}{right}"
        raise ValueError(f"{name}: {value!r} is outside the allowed range {shown}")


@dataclass
class RunSettings:
    """Settings of any training run (YAML keys; `key=value` on the command line)."""

    # optimisation
    batch_size: int = 32  # sequences (examples) per micro-batch per process
    grad_accum: int = 1  # micro-batches per optimizer step
    max_steps: int | None = 1000  # optimizer steps in total
    optimizer: Literal["adamw", "lamb"] = "adamw"  # AdamW (fused on CUDA) or LAMB
    lr: float = 1e-4  # peak learning rate
    weight_decay: float = 0.01  # decoupled weight decay (not on biases and LayerNorm)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam/LAMB moment decay rates
    eps: float = 1e-6  # Adam/LAMB denominator epsilon
    warmup_steps: int | None = None  # linear warmup steps; default warmup_fraction of the run
    warmup_fraction: float = 0.01  # warmup share of the run when warmup_steps is unset
    schedule: Literal["linear", "cosine", "constant"] = "linear"  # decay after warmup
    min_lr_ratio: float = 0.0  # final lr as a share of the peak
    clip_grad: float = 1.0  # max global gradient norm (0: no clipping)
    time_budget: str | None = None
    """wall-clock budget of the whole run, e.g. 90s, 6m, 1.5h (start-up and compilation count):
    the run ends when it is spent, the lr schedule follows elapsed time instead of steps, and the
    final checkpoint and model are written inside it; max_steps (if set) still caps the steps"""
    # hardware
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 on capable GPUs, fp32 on CPU
    device: str = "auto"  # auto, cpu, cuda, cuda:1 ...
    num_workers: int = 0  # DataLoader worker processes
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """with several processes (torchrun): ddp replicates the model on every rank; fsdp shards
    weights, gradients and optimizer state over the ranks (FSDP2), for models too big for one GPU"""
    dist_timeout_s: float = DEFAULT_TIMEOUT_S  # seconds a rank waits for the others before failing
    # bookkeeping
    output_dir: str = "runs/run"  # run folder
    overwrite: bool = False  # start afresh in an output_dir that holds another run (its run files are deleted)
    force_resume: bool = False  # resume even if settings that shape the run (model, data, batch...) changed
    seed: int = 0  # seeds model init, data order, masks and dropout
    log_every: int = 10  # steps between metrics.jsonl train records
    eval_every: int = 500  # steps between evaluations (0: only at the end)
    save_every: int = 1000  # steps between checkpoints (one is always written at the end)
    save_minutes: float = 10.0  # also a checkpoint after this many minutes without one (0: steps only)
    keep_last: int = 3  # checkpoints kept (0: all)
    tensorboard: bool = False  # also log to OUTPUT_DIR/tensorboard (needs the tensorboard package)

    def __post_init__(self) -> None:
        for name in ("batch_size", "grad_accum", "log_every"):
            check_range(self, name, low=1)
        check_range(self, "max_steps", low=1, allow_none=True)
        check_range(self, "warmup_steps", low=0, allow_none=True)
        for name in ("eval_every", "save_every", "save_minutes", "keep_last", "num_workers", "weight_decay", "clip_grad"):
            check_range(self, name, low=0)
        check_range(self, "lr", low=0, low_open=True)
        check_range(self, "eps", low=0, low_open=True)
        check_range(self, "dist_timeout_s", low=0, low_open=True)
        check_range(self, "warmup_fraction", low=0, high=1, high_open=True)
        check_range(self, "min_lr_ratio", low=0, high=1)
        if self.betas is not None:
            if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas):
                raise ValueError(f"betas: {self.betas!r} must be two numbers in [0, 1)")
        self.time_budget_s = parse_duration(self.time_budget)
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", str(self.device).strip()):
            raise ValueError(f"device: {self.device!r} is not one of auto, cpu, cuda, cuda:N, mps")
