"""What a job plugs into the one training loop (`Job`), and what a run resolved before its job is built (`Run`).

A job is what differs between pretraining and each fine-tuning task: its micro-batches, its loss,
what a batch counts, its evaluation, which model folder it keeps and its data position. The loop
(`loop.py`) does everything else, once. A new job (an embedding or contrastive trainer, a reranker,
distillation) subclasses `Job`: it builds its model and data in `__init__` and implements the
methods below; it needs no callback.

    class MyJob(Job):
        name, unit, metric = "distill", "examples", "spearman"
        def __init__(self, cfg, run): ...            # model (on run.precision.device), data, total_steps
        def step_batches(self, step): ...            # the micro-batches of update `step`
        def loss(self, model, batch): ...            # (loss, {part: value}) of one device batch
        def count(self, batch): ...                  # examples (or tokens) in a host batch
        def evaluate(self, final): ...               # {metric: value}, through self.engine
        def save_model(self, folder, state): ...     # the kept model folder (best/ or final/)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from bert_kit.training.engine import Engine
from bert_kit.training.precision import Precision


class Job:
    """What a job plugs into the loop. A subclass sets these attributes and implements the methods.

    model: the model to train, on its device (the torch engine wraps it for DDP/FSDP2; the JAX engine
        copies its weights, and writes them back into it before `save_model`);
    tokenizer: saved with every checkpoint and model folder;
    total_steps: optimizer steps of the whole run; steps_per_epoch: for the `epoch` of log records;
    unit: what `count` counts ("tokens" or "examples");
    metric: validation metric that picks best/, or None: the last weights are kept;
    higher_is_better: the metric's direction (False for a loss: the lowest value is the best);
    patience, min_delta: early stopping: the run ends after `patience` evaluations in a row without an
        improvement of `metric` by more than `min_delta` (None: never);
    model_folder: the folder the kept model goes to; eval_every, save_every: the cadence in steps.
    engine: set by the loop: the engine that trains the model, and runs it in `evaluate`.
    """

    name = "train"
    unit = "examples"
    metric: str | None = None
    higher_is_better = True
    patience: int | None = None
    min_delta = 0.0
    model_folder = "final"  # where the kept model goes: best/ (by `metric`) or final/ (the last weights)
    cuda_graphs = False  # replay each batch shape's whole step as a CUDA graph (the torch engine's AMPTrainer)
    compiled_graphs = False  # the compiled model replays its forward and backward as CUDA graphs (inductor's)
    fast_path = ""  # what `fast_path.apply` put on the model, one line: run_config.yaml's first (a comment)
    eval_every = save_every = 0  # steps between evaluations / checkpoints (0: at the end only)
    model: nn.Module
    tokenizer: Any
    total_steps: int
    steps_per_epoch: int | None = None
    engine: Engine

    def step_batches(self, step: int) -> list[dict]:
        """The micro-batches of optimizer update `step` (0-based), on the host."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(loss, {name: part}) of one micro-batch already on the device; `model` may be DDP-wrapped.
        The torch engine's; the JAX engine has the same losses of its own (`bert_kit.jax.train`)."""
        raise NotImplementedError

    def count(self, batch: dict) -> int:
        """Tokens or examples in a host batch (no device access)."""
        raise NotImplementedError

    def evaluate(self, final: bool) -> dict[str, float] | None:
        """Validation metrics of the current weights (None: no validation data). `final`: the last one."""
        return None

    def final_eval_steps(self) -> float:
        """What the last evaluation costs, in training steps (a forward pass is about a third of a
        step on a batch of the same size): a time budget keeps this much time for it."""
        return 0.0

    def save_model(self, folder: Path, state: dict | None) -> None:
        """An HF model folder with tokenizer and metadata; `state` is the full state dict of a
        sharded model (`collect_state`). Called on rank 0 only."""
        raise NotImplementedError

    def model_writer(self, state: dict | None) -> Callable[[Path], None]:
        """What writes the kept model folder of the weights `state` (a copy) into a folder: called
        when the evaluation chose them, run in a thread while the next steps go on, so anything
        else the folder holds (a task's tuned thresholds) is taken now too."""
        return lambda folder: self.save_model(folder, state)

    def data_state(self) -> dict:
        """The data position, saved in checkpoints. Called on every rank."""
        return {}

    def load_data_state(self, state: dict) -> None:
        """Continue at a saved data position."""

    def log(self, text: str) -> None:
        """A message line (the loop routes it past its progress bar)."""
        print(text, file=sys.stderr, flush=True)

    def log_fields(self) -> dict[str, Any]:
        """Extra values for train records (phase, epoch, ...)."""
        return {}

    def results(self, final: dict[str, float] | None, summary: dict[str, Any]) -> dict[str, Any]:
        """The job's entries of results.json, from the final metrics and the loop's summary."""
        return {}


@dataclass
class Run:
    """What `start_run` resolved before a job is built."""

    out: Path  # the run folder
    choose_precision: Callable[[], Precision]  # device and precision (waits for the device's start)
    checkpoint: Path | None  # checkpoint folder to resume from
    state: dict | None  # its trainer state
    started: float  # the time the run's clock (a time budget) counts from
    budget_s: float | None  # seconds left of the time budget
    finished: dict | None = None  # results.json of a run that finished at the checkpoint's step

    @cached_property
    def precision(self) -> Precision:
        """Device and precision, resolved (and printed) at the first use: a job reads its data
        and builds its model on the CPU first, while CUDA starts in a thread (`start_cuda`)."""
        return self.choose_precision()
