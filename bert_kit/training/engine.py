"""Engines: what the one training loop asks of the framework that holds the model.

The loop (`loop.py`) owns the run: steps, logging windows, the clock and the lr schedule,
evaluation cadence, best/ selection, checkpoint folders, signals and results. An engine owns the
model's numbers: it runs one optimizer update over a step's micro-batches, reads a window's
losses back, saves and loads what it trains, and runs the model for evaluation.

    Engine.join_processes(cfg)                       # first thing: torchrun's ranks (or a JAX run's hosts)
    choose_precision = Engine.start_device(cfg)      # the device starts while the job reads its data
    engine = Engine(job, cfg, run)                   # over the job's model
    engine.load_checkpoint(checkpoint, state)        # when resuming
    engine.step(micro_batches, lr)                   # queued on the device: nothing waits
    losses, grad_norm, skipped = engine.read_window()  # at log steps: the one sync of a window

Two engines take the same jobs, data and run folders:

* `TorchEngine` (here): the job's PyTorch model on its device, DDP or FSDP2 over torchrun ranks,
  AdamW (fused on CUDA) or LAMB, and the `AMPTrainer` (autocast, accumulation, clipping, deferred
  non-finite checks, CUDA graphs);
* `JaxEngine` (`bert_kit/jax/engine.py`): the same model in Flax NNX, one jitted step data
  parallel over every local device.

The loop is handed its engine's class: the jobs look it up by the `engine:` setting
(`bert_kit.tasks.engine_class`, which imports jax only for engine=jax), so nothing here imports
an engine of a layer above.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch

from bert_kit.input_checks import unchecked_inputs
from bert_kit.threads import CoreShare
from bert_kit.training.checkpoint import collect_state, load_checkpoint
from bert_kit.training.distributed import (broadcast_weights, full_value, init_distributed, is_main, rank,
                                           world_size, wrap_model)
from bert_kit.training.losses import compute_mlm_loader_loss
from bert_kit.training.optim import create_optimizer, set_lr
from bert_kit.training.precision import Precision, resolve_device, resolve_precision, start_cuda
from bert_kit.training.trainer import AMPTrainer


class Engine:
    """The interface the loop uses; `TorchEngine` and `bert_kit.jax.engine.JaxEngine` implement it."""

    name = ""
    precision: Any  # device and precision, resolved once; str() of it goes to results.json
    parallel: str | None = None  # how the weights are spread over several devices (ddp, fsdp); None on one

    def status(self, text: str) -> None:
        """Show `text` on the run's progress bar while the device waits ("" clears it; the loop sets this)."""

    @classmethod
    def join_processes(cls, cfg: Any) -> None:
        """The run's other processes, first thing (torchrun's ranks, a JAX run's hosts)."""
        raise NotImplementedError

    @classmethod
    def start_device(cls, cfg: Any) -> Callable[[], Precision]:
        """Check the device the settings name and start it; returns what resolves the precision the
        job builds its model in, called once the job has read its data (the device starts meanwhile)."""
        raise NotImplementedError

    def load_checkpoint(self, checkpoint: Path, state: dict) -> None:
        """Continue from a checkpoint folder (its trainer state `state`): weights, optimizer, step."""
        raise NotImplementedError

    def step(self, micro_batches: list[dict], lr: float) -> None:
        """Queue one optimizer update at `lr` over a step's micro-batches (host batches of the job);
        the losses add up on the device."""
        raise NotImplementedError

    def read_window(self) -> tuple[dict[str, float], float, int]:
        """(each loss's mean per step since the last call, the last step's gradient norm, steps skipped
        for a non-finite gradient since the last call). Waits for the device; raises
        `NonFiniteLossError` when a loss went NaN or inf."""
        raise NotImplementedError

    def check_finite(self) -> None:
        """Raise `NonFiniteLossError` if a step so far had a non-finite loss (before a checkpoint)."""
        raise NotImplementedError

    def checkpoint_state(self) -> dict[str, Any]:
        """What `save_checkpoint` writes besides the loop's bookkeeping, as its keyword arguments; the
        job's model holds the current weights afterwards. Every rank calls it (FSDP2 gathers shards)."""
        raise NotImplementedError

    def model_state(self) -> dict | None:
        """Before `job.save_model`: the job's model holds the current weights, or this returns its
        full state dict (a sharded model). Every rank calls it."""
        raise NotImplementedError

    def evaluate_mlm(self, loader: Any, limit: int | None, slots: float | None) -> dict[str, float]:
        """MLM (+ NSP) metrics of the current weights over an evaluation loader (`compute_mlm_loader_loss`)."""
        raise NotImplementedError

    def evaluate_task(self, task: Any, items: list[dict]) -> dict[str, Any]:
        """A fine-tuning task's validation metrics of the current weights (`Task.evaluate`)."""
        raise NotImplementedError

    def running(self) -> ContextManager:
        """The context the training steps run in."""
        raise NotImplementedError


class TorchEngine(Engine):
    """The job's PyTorch model: wrapped for DDP/FSDP2, trained by an `AMPTrainer`."""

    name = "torch"

    @classmethod
    def join_processes(cls, cfg: Any) -> None:
        init_distributed(cfg.dist_timeout_s)

    @classmethod
    def start_device(cls, cfg: Any) -> Callable[[], Precision]:
        device = resolve_device(cfg.device)  # a bad or missing device is an error now
        start_cuda(device)  # in a thread, while the job reads its data and builds its model

        def choose() -> Precision:
            precision = resolve_precision(cfg.precision, device, verbose=is_main())
            if precision.device.type == "cuda":
                torch.set_float32_matmul_precision("high")  # TF32 for any fp32 matmul left
            return precision

        return choose

    def __init__(self, job: Any, cfg: Any, run: Any) -> None:
        self.job, self.precision = job, run.precision
        self.parallel = cfg.parallel if world_size() > 1 else None
        device, model = run.precision.device, job.model
        sharded = self.parallel == "fsdp"
        if sharded and self.precision.use_grad_scaler:
            raise ValueError("parallel=fsdp trains in bf16 or fp32 (fp16 would need loss scaling of sharded "
                             "gradients): set precision=bf16 or precision=fp32")
        # FSDP2 gathers bf16 weights when training in bf16 on GPUs; gradients are reduced in fp32
        param_dtype = torch.bfloat16 if device.type == "cuda" and self.precision.dtype == torch.bfloat16 else None
        # a compiled model replaying CUDA graphs cannot run DDP's gradient hooks: under torchrun the
        # trainer gets the bare model and all-reduces the gradients itself
        own_reduction = world_size() > 1 and not sharded and job.compiled_graphs
        wrapped = model if own_reduction else wrap_model(model, device, cfg.parallel, param_dtype)
        if own_reduction:
            broadcast_weights(model)
        if world_size() > 1:
            torch.manual_seed(cfg.seed + 1_000_003 * rank())  # same init on every rank (above), own dropout
        self.optimizer = create_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay, tuple(cfg.betas), cfg.eps,
                                          device, capturable=job.cuda_graphs)
        self.trainer = AMPTrainer(wrapped, self.optimizer, None, self.precision, clip_grad=cfg.clip_grad,
                                  deferred_checks=True, cuda_graphs=job.cuda_graphs)
        self.weight_decay = cfg.weight_decay
        self.losses: dict[str, Any] = {}  # the window's losses, summed on the device
        self.steps = 0  # optimizer steps in the window
        self.skipped_before = 0  # steps skipped for a non-finite gradient, as of the last read
        self.cores = CoreShare() if device.type == "cpu" else None  # threads for the cores left free

    def load_checkpoint(self, checkpoint: Path, state: dict) -> None:
        saved = state.get("engine", "torch")
        if saved != "torch":
            raise ValueError(f"{checkpoint} was written by engine={saved}: resume it with engine={saved}, or start "
                             f"a new run from its weights (model={checkpoint})")
        load_checkpoint(checkpoint, self.job.model, optimizer=self.optimizer, scaler=self.trainer.scaler,
                        restore_rng=False)
        self.trainer.step = int(state["step"])
        for group in self.optimizer.param_groups:  # a changed weight_decay takes effect (the state kept the old)
            if group.get("weight_decay", 0.0) > 0:
                group["weight_decay"] = self.weight_decay
            if "capturable" in group:  # as this run needs it, whatever the saving run had
                group["capturable"] = self.job.cuda_graphs

    def step(self, micro_batches: list[dict], lr: float) -> None:
        if self.cores is not None:
            self.cores.adjust()
        set_lr(self.optimizer, lr)
        trainer, n = self.trainer, len(micro_batches)
        trainer.grad_accum = n
        for batch in micro_batches:  # the trainer steps the optimizer after the last one
            trainer.train_step(batch, lambda b: self.job.loss(trainer.model, b))
            for k, v in trainer.last.items():
                if k.endswith("loss"):  # summed on the device: no sync
                    self.losses[k] = self.losses.get(k, 0.0) + v / n
        self.steps += 1

    def read_window(self) -> tuple[dict[str, float], float, int]:
        self.trainer.check_finite()
        losses = {k: float(v) / self.steps for k, v in self.losses.items()}
        grad_norm = float(full_value(self.trainer.last["grad_norm"]))  # every rank: FSDP2's norm is a DTensor
        skipped = self.trainer.skipped_steps - self.skipped_before
        self.skipped_before += skipped
        self.losses, self.steps = {}, 0
        return losses, grad_norm, skipped

    def check_finite(self) -> None:
        self.trainer.check_finite()

    def checkpoint_state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "scaler": self.trainer.scaler,
                "collected": collect_state(self.job.model, self.optimizer)}

    def model_state(self) -> dict | None:
        return collect_state(self.job.model).get("model")  # gathers FSDP2 shards

    def evaluate_mlm(self, loader: Any, limit: int | None, slots: float | None) -> dict[str, float]:
        # eagerly: a compiled model would compile a second graph for a few batches of evaluation
        # (set_stance: torch >= 2.6; before it, the evaluation runs compiled)
        stance = getattr(torch.compiler, "set_stance", None)
        with stance("force_eager") if stance is not None else contextlib.nullcontext():
            return compute_mlm_loader_loss(self.job.model, loader, self.precision.device, limit,
                                           self.precision.autocast_dtype, slots)

    def evaluate_task(self, task: Any, items: list[dict]) -> dict[str, Any]:
        return task.evaluate(self.job.model, items, self.precision)

    def running(self) -> ContextManager:
        return unchecked_inputs()  # ids come from the job's tokenizer: no range check (a device sync) per step
