"""`AMPTrainer`: one object that runs forward, backward and optimizer steps in mixed precision.

It holds the model (optionally DDP-wrapped), optimizer, LR scheduler, GradScaler and the
resolved `Precision`, and takes care of gradient accumulation and clipping:

    trainer = AMPTrainer(model, optimizer, scheduler, precision, grad_accum=4, clip_grad=1.0)
    for batch in loader:
        loss = trainer.mlm_step(batch)   # a float; the optimizer steps every 4th call

Batches are dicts of (B, T) tensors: input_ids, attention_mask, token_type_ids and, for
`mlm_step`, labels (-100 where nothing is masked) plus optional next_sentence_label (B,);
for `classification_step`, labels (B,) (or (B, T) for token classification).

A non-finite loss raises `NonFiniteLossError` before any optimizer update of that step, so the
weights (and any checkpoint written after them) stay those of the last good step. A finite loss
with a non-finite gradient (one bad batch: an overflow in the backward) skips that step's update,
as fp16 loss scaling does, and training goes on; `MAX_SKIPPED_IN_A_ROW` such steps in a row raise
the error. `skipped_steps` counts them. By default every micro-batch's loss is read back for those
checks, which makes the host wait for the device each step. With `deferred_checks=True` (and a
fused Adam/AdamW, one process or a bare model under torchrun, no fp16 loss scaling) they stay on the
device: the fused optimizer skips an update through its `found_inf` input (every update, from the
first non-finite loss on), `last` holds 0-d tensors, and `check_finite()` raises the error when
called (at log steps and before checkpoints), with the same weights.

With `cuda_graphs=True` (deferred checks, a capturable fused AdamW from
`create_optimizer(capturable=True)`, grad_accum 1) the whole step of each batch shape, forward,
backward, clipping and update, is captured once as a CUDA graph and replayed: the host launches
one graph instead of hundreds of kernels, which is what bounds small models. The first batch of a
shape runs eagerly (it warms up kernels and workspaces), the second is captured; the kernels are
those of the eager step, so the numbers are too. Gradients live only inside a step: the backward
writes them (no zeroing, no adding into the previous step's) in the graphs' memory pool.

Under torchrun the model is normally DDP-wrapped: DDP all-reduces gradient buckets from hooks
during the backward, which CUDA graphs cannot replay. Given the bare model instead, the trainer
averages the gradients (and the step's losses) over the ranks itself, in one flat all-reduce after
the backward (`average_in_place`), so a compiled model can replay its forward and backward as
CUDA graphs (pretraining's `cuda_graphs`); the trainer's own whole-step graphs stay one-process.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn

from bert_kit.kernels.packing import Packed
from bert_kit.training.distributed import (any_rank, average_in_place, full_value, is_fsdp, no_sync, unwrap_model,
                                           world_size)
from bert_kit.heads import with_prediction_slots
from bert_kit.training.precision import Precision, resolve_precision
from bert_kit.training.losses import compute_classification_loss, compute_mlm_loss, compute_pretraining_loss

MAX_SKIPPED_IN_A_ROW = 10  # optimizer steps in a row with a non-finite gradient before the run stops


def to_device(batch: dict, device: torch.device) -> dict:
    """A batch's tensors (and packing layout) on `device`; copies from pinned memory do not block."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) or isinstance(v, Packed) else v
            for k, v in batch.items()}


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite, or the gradient did for `MAX_SKIPPED_IN_A_ROW` steps in a
    row; `step` is the optimizer step (1-based) that failed."""

    def __init__(self, step: int, losses: dict[str, float]):
        self.step, self.losses = step, losses
        parts = ", ".join(f"{k}={v}" for k, v in losses.items())
        loss_ok = all(math.isfinite(v) for k, v in losses.items() if k != "grad_norm")
        what = f"gradient in {MAX_SKIPPED_IN_A_ROW} steps in a row, the last" if loss_ok else "loss"
        super().__init__(f"non-finite {what} at step {step} ({parts})")


class AMPTrainer:
    """Mixed-precision training steps with gradient accumulation and clipping.

    precision: a `Precision` (bf16/fp16 autocast or fp32); fp16 adds a GradScaler.
    grad_accum: micro-batches per optimizer step; each micro loss is divided by it, so the
        accumulated gradient is the mean over micro-batches.
    clip_grad: max global gradient norm (0 or None: no clipping; the norm is still measured).
    step: optimizer steps taken so far (set it when resuming).
    After each call, `last` holds the micro-batch's losses and, when the optimizer stepped,
    `grad_norm` (a 0-d tensor, read it only when logging to avoid a device sync) and `stepped`.
    mlm_slots: when set, `mlm_step` gathers the masked positions on the host into this share of
        the batch's tokens as fixed prediction slots (`with_prediction_slots`): static shapes for
        a compiled model. `mlm_loss_fn` (None: `compute_mlm_loss`) may be set to a compiled one.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any = None, precision: Precision | None = None,
                 grad_accum: int = 1, clip_grad: float | None = 1.0, mlm_slots: float | None = None,
                 deferred_checks: bool = False, cuda_graphs: bool = False) -> None:
        if grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.precision = precision or resolve_precision("auto", verbose=False)
        self.scaler = self.precision.grad_scaler()
        self.grad_accum = grad_accum
        self.clip_grad = clip_grad
        self.mlm_slots = mlm_slots
        fused = (isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)
                 and all(g.get("fused") for g in optimizer.param_groups))
        # several processes and a bare model (no DDP, no FSDP2): the trainer averages the gradients itself,
        # in one all-reduce after the backward (DDP's hooks cannot run inside a compiled model's CUDA graphs)
        self.reduces = world_size() > 1 and unwrap_model(model) is model and not is_fsdp(model)
        # deferred checks need every rank to see the same losses: one process, or losses averaged with the gradients
        self.deferred = bool(deferred_checks and fused and not self.scaler.is_enabled()
                             and (world_size() == 1 or self.reduces))
        capturable = all(g.get("capturable") for g in optimizer.param_groups)
        if cuda_graphs and not (self.deferred and capturable and self.device.type == "cuda" and world_size() == 1):
            raise ValueError("cuda_graphs needs one CUDA process, bf16 or fp32, and a capturable fused AdamW "
                             "(create_optimizer(..., capturable=True))")
        # deferred checks: on-device state, updated in place (a CUDA graph reads and writes these very tensors)
        self._first_bad: torch.Tensor | None = None  # first bad step (1-based), 0 while none
        self._steps_done: torch.Tensor | None = None  # optimizer steps taken, counted on the device
        self._skipped: torch.Tensor | None = None  # steps skipped for a non-finite gradient
        self._in_a_row: torch.Tensor | None = None  # ... of which the latest came in a row
        self._skipped_host, self._in_a_row_host = 0, 0  # the same, without deferred checks
        self._bad_losses: dict[str, torch.Tensor] = {}
        self.graphs: dict | None = {} if cuda_graphs else None  # batch shape -> "warm" | (graph, inputs, outputs)
        self._graph_pool = None
        self._warming_up = False  # the eager step of a new batch shape, before its capture
        self.mlm_loss_fn = None  # None: compute_mlm_loss
        self.step = 0
        self.micro = 0  # micro-batches accumulated towards the next optimizer step
        self.last: dict[str, Any] = {}
        self._pending: list[dict[str, float]] = []

    @property
    def device(self) -> torch.device:
        return self.precision.device

    def _to_device(self, batch: dict) -> dict:
        return to_device(batch, self.device)

    # ---- losses -----------------------------------------------------------------------------

    def _mlm_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return compute_pretraining_loss(self.model, batch, self.mlm_loss_fn or compute_mlm_loss)

    def _classification_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits = self.model(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"))
        return compute_classification_loss(logits, batch["labels"]), {}

    # ---- steps ------------------------------------------------------------------------------

    def mlm_step(self, batch: dict) -> float | torch.Tensor:
        """Forward + backward one MLM (+ NSP) micro-batch; step the optimizer when due.

        Returns the micro-batch loss (MLM + NSP when the batch has next_sentence_label): a float,
        or a 0-d device tensor with deferred checks.
        """
        if self.mlm_slots:
            batch = with_prediction_slots(batch, self.mlm_slots)
        return self.train_step(batch, self._mlm_loss)

    def classification_step(self, batch: dict) -> float | torch.Tensor:
        """Forward + backward one classification micro-batch; step the optimizer when due."""
        return self.train_step(batch, self._classification_loss)

    def train_step(self, batch: dict, loss_fn: Any) -> float | torch.Tensor:
        """One micro-batch with any loss: `loss_fn(batch)` -> (loss tensor, {name: tensor}).

        The batch is moved to the device and `loss_fn` runs under autocast; the named parts
        are reported in `last` next to "loss". QA, token classification and other heads use this.
        """
        if self.graphs is not None and self.grad_accum == 1 and not self._warming_up:
            return self._graphed_step(batch, loss_fn)
        if self.reduces and self.grad_accum != 1:
            raise ValueError("a trainer that reduces its own gradients (a bare model under torchrun) "
                             "takes grad_accum 1")
        self.model.train()
        batch = self._to_device(batch)
        last_micro = self.micro + 1 == self.grad_accum
        # DDP: all-reduce gradients only on the micro-batch that completes the step
        with no_sync(self.model, skip=not last_micro):
            with self.precision.autocast():
                loss, parts = loss_fn(batch)
            self.scaler.scale(loss / self.grad_accum).backward()
        values = {"loss": loss.detach(), **{k: v.detach() for k, v in parts.items()}}
        if self.reduces:
            values = self._average_over_ranks(values)
        if self.deferred:
            self._record_nonfinite(values, None)
        else:
            values = {k: v.item() for k, v in values.items()}
            self._pending.append(values)
        self.micro += 1
        self.last = {**values, "stepped": False}
        if last_micro:
            self._optimizer_step()
        return values["loss"]

    def _graphed_step(self, batch: dict, loss_fn: Any) -> torch.Tensor:
        """A whole step as a CUDA graph per batch shape (eager the first time a shape is seen)."""
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in batch.items() if torch.is_tensor(v))
        entry = self.graphs.get(key)
        if entry is None:  # warm-up: cuBLAS and attention workspaces, lazily created optimizer state
            self.graphs[key] = "warm"
            self._warming_up = True
            try:
                return self.train_step(batch, loss_fn)
            finally:
                self._warming_up = False
        if entry == "warm":
            inputs = self._to_device(batch)  # the graph's input buffers, outside its memory pool
            graph = torch.cuda.CUDAGraph()
            self.model.train()
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, pool=self._graph_pool):  # recorded, not run
                outputs = self._whole_step(inputs, loss_fn)
            self._graph_pool = graph.pool()  # graphs of all shapes share one pool: they never overlap
            entry = self.graphs[key] = (graph, inputs, outputs)
        else:
            for k, v in batch.items():
                if torch.is_tensor(v):
                    entry[1][k].copy_(v, non_blocking=True)
        graph, _, outputs = entry
        graph.replay()
        if self.scheduler is not None:
            self.scheduler.step()
        self.step += 1
        self.last = {**outputs, "stepped": True}
        return outputs["loss"]

    def _whole_step(self, batch: dict, loss_fn: Any) -> dict[str, torch.Tensor]:
        """Forward, backward, clipping and a fused update: what one graph records. The gradients are
        allocated in the graph's pool (none exist before: every step sets them to None), so a replay
        writes them afresh instead of zeroing and adding into a stored set (all-MiniLM-L6-v2 at batch
        32: 578 kernels a step instead of 661, 6% less GPU time). They are freed at the end, as the
        step's other temporaries are: graphs sharing the pool use that memory too, one replay at a time."""
        with self.precision.autocast(cache_enabled=False):  # cached weight casts would be stale in replays
            loss, parts = loss_fn(batch)
        loss.backward()
        values = {"loss": loss.detach(), **{k: v.detach() for k, v in parts.items()}}
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.clip_grad if self.clip_grad else float("inf"))
        self.optimizer.found_inf = self._record_nonfinite(values, grad_norm).float()
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf
        self.optimizer.zero_grad(set_to_none=True)
        self._steps_done.add_(1)
        return {**values, "grad_norm": grad_norm}

    def _average_over_ranks(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The gradients and the step's losses averaged over the ranks in one all-reduce: every rank
        takes the same update and sees a non-finite loss of any rank, so all of them stop together."""
        grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        losses = torch.stack([v.float() for v in values.values()])
        average_in_place([*grads, losses])
        return dict(zip(values, losses.unbind()))

    def _record_nonfinite(self, losses: dict[str, torch.Tensor], grad_norm: torch.Tensor | None) -> torch.Tensor:
        """Deferred mode, on the device: remember the first step that must stop the run (a non-finite
        loss, or a non-finite gradient in `MAX_SKIPPED_IN_A_ROW` steps in a row) and count the steps
        skipped for a non-finite gradient. Returns whether this step's update is to be skipped (0-d
        bool); every state tensor is updated in place, as a CUDA graph replays it."""
        stacked = torch.stack([v.float() for v in losses.values()])
        device = stacked.device
        if self._first_bad is None:
            self._first_bad = torch.zeros((), dtype=torch.long, device=device)
            self._steps_done = torch.full((), self.step, dtype=torch.long, device=device)
            self._skipped = torch.zeros((), dtype=torch.long, device=device)
            self._in_a_row = torch.zeros((), dtype=torch.long, device=device)
        values = {**losses, "grad_norm": grad_norm} if grad_norm is not None else losses
        for k in values:
            if k not in self._bad_losses:
                self._bad_losses[k] = torch.zeros((), device=device)
        stop = torch.isfinite(stacked).all().logical_not()
        if grad_norm is not None:
            bad_grad = torch.isfinite(grad_norm).logical_not() & stop.logical_not()
            self._in_a_row.copy_((self._in_a_row + 1) * bad_grad)
            self._skipped.add_(bad_grad.long())
            stop = stop | (self._in_a_row >= MAX_SKIPPED_IN_A_ROW)
        first = stop & (self._first_bad == 0)
        self._first_bad.copy_(torch.where(first, self._steps_done + 1, self._first_bad))
        for k, bad in self._bad_losses.items():  # what this step did not record yet (its gradient) is unknown
            bad.copy_(torch.where(first, values[k].float() if k in values else torch.nan, bad))
        skip = self._first_bad != 0
        return skip | bad_grad if grad_norm is not None else skip

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped so far for a non-finite gradient of a finite loss (deferred: a sync)."""
        if self._skipped is not None:
            return int(self._skipped) + self._skipped_host
        return self._skipped_host

    def check_finite(self) -> None:
        """Deferred mode: raise `NonFiniteLossError` if a loss so far was NaN or infinite, or the
        gradient was in `MAX_SKIPPED_IN_A_ROW` steps in a row (one device sync)."""
        if not self.deferred or self._first_bad is None:
            return
        step = int(self._first_bad)
        if step:
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(step, {k: float(v) for k, v in self._bad_losses.items()})

    def _optimizer_step(self) -> None:
        """Check the accumulated losses, unscale, clip, step, update the scaler and the lr."""
        pending, self._pending, self.micro = self._pending, [], 0
        bad = [p for p in pending if not all(math.isfinite(v) for v in p.values())]
        if not self.deferred and any_rank(bool(bad)):  # every rank stops together, or the others would hang
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(self.step + 1, bad[0] if bad else {"loss on another rank": math.nan})
        self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        max_norm = self.clip_grad if self.clip_grad else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        # a finite loss with a non-finite gradient: clipping would write NaN into every weight, so the
        # update is skipped (fp16 loss scaling skips such steps itself and lowers the scale)
        skip = False
        if self.deferred:  # the fused kernel leaves every weight and moment alone while found_inf is 1
            self.optimizer.found_inf = self._record_nonfinite(
                {k: v for k, v in self.last.items() if torch.is_tensor(v)}, grad_norm).float()
        elif not self.precision.use_grad_scaler:
            norm = float(full_value(grad_norm))  # every rank: FSDP2's norm is a DTensor
            skip = any_rank(not math.isfinite(norm))
            self._in_a_row_host = self._in_a_row_host + 1 if skip else 0
            self._skipped_host += int(skip)
            if self._in_a_row_host >= MAX_SKIPPED_IN_A_ROW:
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError(self.step + 1, {**(pending[-1] if pending else {}), "grad_norm": norm})
        try:
            if not skip:
                self.scaler.step(self.optimizer)  # skipped by the scaler if fp16 gradients overflowed
        finally:
            if self.deferred:
                del self.optimizer.found_inf
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.deferred:
            self._steps_done.add_(1)
        if self.scheduler is not None:
            self.scheduler.step()
        self.step += 1
        self.last.update(stepped=True, grad_norm=grad_norm)

    _train_step = train_step  # earlier name, kept for callers that use it

    @property
    def lr(self) -> float:
        """Learning rate of the first parameter group (what the next update will use)."""
        return self.optimizer.param_groups[0]["lr"]

    @property
    def raw_model(self) -> nn.Module:
        """The model without its DDP wrapper."""
        return unwrap_model(self.model)
