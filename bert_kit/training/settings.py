"""`RunSettings`: the settings every training run shares, whatever the job.

`PretrainConfig` (tasks/pretraining.py) and `FinetuneConfig` (tasks/finetuning.py) extend it with
what their job needs and override a few defaults (fine-tuning takes a smaller lr, for instance).
The one training loop (`training/loop.py`) reads only these fields. A field's help text is its
same-line comment or attribute docstring (`bert-kit pretrain --help` lists them all).

Resuming a run (`--resume`) may change some settings and not others (`RESUMABLE`): the
learning rate, weight decay, length of the run and the logging/evaluation/checkpoint cadence take
effect and are reported; anything else that shapes the run (model, data, batch, seed, ...) stops
with an error naming the settings, unless `force_resume: true`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from bert_kit.checks import ConfigError, Range, check_settings, choice_error, fraction, non_negative, positive
from bert_kit.training.runconfig import build_group, check_run_settings

TRACKER_NAMES = ("tensorboard", "mlflow", "wandb")  # what report_to may name (training/trackers.py)
DEFAULT_TIMEOUT_S = 600.0  # a collective waiting longer than this fails instead of hanging

# settings a resumed run may change; every other difference is refused unless force_resume
RESUMABLE_CHANGES = frozenset({
    "lr", "weight_decay", "clip_grad", "max_steps", "grad_accum", "epochs", "time_budget", "warmup_steps", "schedule",
    "min_lr_ratio", "log_every", "eval_every", "eval_batches", "save_every", "save_minutes", "end_checkpoint",
    "keep_last", "tensorboard", "num_workers", "dist_timeout_s", "device", "eval_batch_size", "max_eval_examples",
    "output_dir", "overwrite", "force_resume", "metric", "compile", "cuda_graphs", "compile_tuning", "parallel",
    "precision", "jax_cache", "report_to", "tracking.project", "tracking.run_name", "tracking.mlflow_uri",
    "tracking.wandb_mode",
})

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr)?\s*$")
_UNIT_SECONDS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}


def tracker_names(cfg: RunSettings) -> list[str]:
    """The trackers a run reports to: `report_to`, and tensorboard for `tensorboard: true`."""
    return list(dict.fromkeys([*cfg.report_to, *(["tensorboard"] if cfg.tensorboard else [])]))


def parse_duration(text: str | float | int | None) -> float | None:
    """'6m' -> 360.0, '90s' or 90 -> 90.0, '1.5h' -> 5400.0, None -> None."""
    if text is None:
        return None
    m = _DURATION.match(str(text))
    if m is None or float(m.group(1)) <= 0:
        raise ConfigError(f"time_budget={text!r} is not a positive duration such as 90s, 6m or 1.5h")
    return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]


@dataclass
class TrackingSettings:
    """Where `report_to` trackers file the run (bert_kit/training/trackers.py)."""

    project: str | None = None  # MLflow experiment / W&B project (default bert-kit)
    run_name: str | None = None  # the run's name there (default: the run folder's name)
    mlflow_uri: str | None = None  # MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite in the run folder)
    wandb_mode: Literal["offline", "online"] = "offline"  # W&B: offline (RUN_DIR/wandb, `wandb sync` later) or online

    def __post_init__(self) -> None:
        check_settings(self, {}, prefix="tracking.")


@dataclass
class RunSettings:
    """Settings of any training run (YAML keys; `key=value` on the command line)."""

    RESUMABLE: ClassVar[frozenset[str]] = RESUMABLE_CHANGES  # what a resume may change (a subclass adds its own)

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
    engine: Literal["torch", "jax"] = "torch"
    """torch: PyTorch (DDP/FSDP2 under torchrun). jax: the same model in JAX (`pip install
    "bert-kit[jax]"`), one jitted step data parallel over every local device, each batch split
    over them; not with cuda_graphs=true or compile_tuning=true (docs/jax.md)"""
    jax_cache: str | bool | None = None
    """engine=jax: the folder that keeps compiled programs between runs (default $BERT_KIT_JAX_CACHE,
    else ~/.cache/bert-kit/jax); off (false): none"""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 on capable GPUs, fp32 on CPU
    device: str = "auto"  # auto, cpu, cuda, cuda:1 ...
    num_workers: int = 0  # DataLoader worker processes
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """with several processes (torchrun): ddp replicates the model on every rank; fsdp shards
    weights, gradients and optimizer state over the ranks (FSDP2), for models too big for one GPU;
    engine=jax: the same over the devices of its mesh"""
    dist_timeout_s: float = DEFAULT_TIMEOUT_S  # seconds a rank waits for the others before failing
    # bookkeeping
    output_dir: str = "runs/run"  # run folder
    overwrite: bool = False  # start afresh where another run was (deletes only what earlier runs recorded there)
    force_resume: bool = False  # resume even if settings that shape the run (model, data, batch...) changed
    seed: int = 0  # seeds model init, data order, masks and dropout
    log_every: int = 10  # steps between metrics.jsonl train records
    eval_every: int = 500  # steps between evaluations (0: only at the end)
    save_every: int = 1000  # steps between checkpoints
    end_checkpoint: bool = True
    """a checkpoint when the run ends (a stop signal's is always written): what `--resume` extends a
    finished run from (more steps or epochs); fine-tuning's default is false (its model is in best/)"""
    save_minutes: float = 10.0  # also a checkpoint after this many minutes without one (0: steps only)
    keep_last: int = 3  # checkpoints kept (0: all)
    tensorboard: bool = False  # also log to OUTPUT_DIR/tensorboard (the same as report_to: [tensorboard])
    report_to: list[str] = field(default_factory=list)
    """trackers that also get every record, each offline by default: tensorboard (OUTPUT_DIR/tensorboard),
    mlflow (sqlite in OUTPUT_DIR), wandb (offline, OUTPUT_DIR/wandb); pip install "bert-kit[tracking]" """
    tracking: TrackingSettings = field(default_factory=TrackingSettings)  # the trackers' project and run name

    def __post_init__(self) -> None:
        self.check({})

    def check(self, rules: dict[str, Range]) -> None:
        """Validate every setting: `RUN_RULES` plus a subclass's `rules` (which win), Literal
        choices and the device name. Errors name the key, the value and the allowed range."""
        self.tracking = build_group(TrackingSettings, self.tracking, "tracking")
        if isinstance(self.report_to, str):  # report_to="mlflow" from Python: one tracker
            self.report_to = [self.report_to]
        for name in self.report_to:
            if name not in TRACKER_NAMES:
                raise choice_error("report_to", name, TRACKER_NAMES)
        check_run_settings(self, {**RUN_RULES, **rules})
        self.time_budget_s = parse_duration(self.time_budget)
        if self.engine == "jax":
            check_jax_settings(self)


# what the JAX engine does not do: (setting, its value there, why); `compile`, `unpadded` and
# `low_precision_residual` are accepted: JAX always compiles its step, and masks padding itself
JAX_UNSUPPORTED = (
    ("cuda_graphs", True, "XLA schedules its own kernels"),
    ("compile_tuning", True, "a torch.compile option"),
)


def check_jax_settings(cfg: RunSettings) -> None:
    """engine=jax with a setting the JAX engine does not support: one ConfigError naming them all."""
    def holds(key: str, value: object) -> bool:  # True is not 1, nor "auto"
        current = getattr(cfg, key, None)
        return current is value if isinstance(value, bool) else current == value

    found = [(f"{key}={str(value).lower() if isinstance(value, bool) else value}", why)
             for key, value, why in JAX_UNSUPPORTED if holds(key, value)]
    if found:
        names = ", ".join(name for name, _ in found)
        whys = "; ".join(dict.fromkeys(why for _, why in found))
        raise ConfigError(f"engine=jax does not support {names} ({whys}): change {'them' if len(found) > 1 else 'it'}, "
                          "or train with engine=torch (docs/jax.md)")


# what each shared setting may be (bert_kit/checks.py); subclasses add theirs
RUN_RULES: dict[str, Range] = {
    "batch_size": positive(integer=True),
    "grad_accum": positive(integer=True),
    "max_steps": positive(integer=True, optional=True),
    "lr": positive(),
    "weight_decay": non_negative(),
    "betas": fraction(high_open=True),
    "eps": positive(),
    "warmup_steps": non_negative(integer=True, optional=True),
    "warmup_fraction": fraction(high_open=True),
    "min_lr_ratio": fraction(),
    "clip_grad": non_negative(hint="0 turns clipping off"),
    "num_workers": non_negative(integer=True),
    "dist_timeout_s": Range(0, 10**9, low_open=True),  # torch's timedelta overflows past ~1e14 s
    "seed": Range(0, 2**32 - 1, integer=True),
    "log_every": positive(integer=True),
    "eval_every": non_negative(integer=True),
    "save_every": non_negative(integer=True),
    "save_minutes": non_negative(hint="0: save_every steps only"),
    "keep_last": non_negative(integer=True, hint="0 keeps all"),
}
