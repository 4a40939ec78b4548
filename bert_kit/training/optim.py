"""Optimizers and learning-rate schedules for BERT training.

* `param_groups`: weight decay on matrices only; biases and LayerNorm weights (every 1-D
  parameter) are not decayed, as in the original BERT code.
* `create_optimizer`: AdamW (the fused CUDA kernel on GPU) or LAMB (You et al. 2019, the
  large-batch optimizer BERT was pretrained with in 76 minutes), written out below.
* `create_scheduler`: linear warmup, then linear or cosine decay (or constant), as a `LambdaLR`.
  Optimizer update s (0-based) runs at lr * `lr_multiplier(s)`.

Both optimizers are torch's `Optimizer`s with the same update and state dict, but import
torch._dynamo only under torch.compile (`EagerOptimizer`): torch wraps `add_param_group`,
`zero_grad`, `state_dict`, `load_state_dict` and Adam's `step` so that a compiled graph never
traces them, and those wrappers import torch._dynamo on their first call (sympy, FX, FSDP: 2-4 s
of start-up that a run without torch.compile never uses).
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn

OPTIMIZERS = ("adamw", "lamb")
SCHEDULES = ("linear", "cosine", "constant")


def _eager(method: Callable) -> Callable:
    """torch's `method` while torch.compile traces it; otherwise the function inside it, without the
    wrapper that keeps it out of a trace (that wrapper does nothing else, and imports torch._dynamo)."""
    raw = inspect.unwrap(method)

    @functools.wraps(raw)
    def call(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return method(self, *args, **kwargs)
        return raw(self, *args, **kwargs)

    return call


class EagerOptimizer(torch.optim.Optimizer):
    """A mixin for `torch.optim.Optimizer` subclasses: torch's methods, without importing
    torch._dynamo outside of torch.compile (see the module's docstring)."""

    add_param_group = _eager(torch.optim.Optimizer.add_param_group)
    zero_grad = _eager(torch.optim.Optimizer.zero_grad)
    state_dict = _eager(torch.optim.Optimizer.state_dict)
    load_state_dict = _eager(torch.optim.Optimizer.load_state_dict)


try:  # Adam.step without torch's wrappers (grad mode and graph breaks; the profiler's once patched)
    from torch.optim.optimizer import _use_grad_for_differentiable

    _ADAM_STEP = inspect.unwrap(torch.optim.Adam.step)
    _ADAM_STEP_TRACED = _use_grad_for_differentiable(_ADAM_STEP)
except (ImportError, AttributeError):  # a torch without them: its own step
    _ADAM_STEP = _ADAM_STEP_TRACED = None


class AdamW(EagerOptimizer, torch.optim.AdamW):
    """`torch.optim.AdamW`: the same arguments, update and state dict; torch._dynamo is imported
    only under torch.compile."""

    def step(self, closure: Callable | None = None) -> Any:
        if _ADAM_STEP is None:
            return torch.optim.AdamW.step(self, closure)
        if torch.compiler.is_compiling():
            return _ADAM_STEP_TRACED(self, closure)
        # what torch's wrapper does outside of a trace (its graph breaks do nothing there)
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _ADAM_STEP(self, closure)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: 2-D+ weights decayed, 1-D parameters (biases, LayerNorm) not.

    Tied weights appear once (named_parameters deduplicates). The no-decay group also skips
    LAMB's layer adaptation, as in the TF/NVIDIA implementations.
    """
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0, "trust_ratio": False}]


def no_decay_names(model: nn.Module) -> list[str]:
    """Names of the parameters that `param_groups` leaves out of weight decay."""
    return [n for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]


class LAMB(EagerOptimizer):
    """Layer-wise Adaptive Moments (You et al. 2019).

    Per parameter tensor p with gradient g (step t, bias-corrected Adam moments):
        r = m_hat / (sqrt(v_hat) + eps) + weight_decay * p
        p <- p - lr * (||p|| / ||r||) * r          (trust ratio 1 when either norm is 0)
    The trust ratio makes each layer's step proportional to its weight norm, which keeps very
    large batches (32k) stable. Groups with trust_ratio=False take the plain AdamW-like step.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, trust_ratio: bool = True):
        if lr <= 0 or eps <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid LAMB settings lr={lr}, betas={betas}, eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      trust_ratio=trust_ratio))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                m, v, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
                m.lerp_(p.grad, 1 - beta1)  # m = b1 m + (1 - b1) g
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                if group["trust_ratio"]:
                    w_norm, u_norm = p.norm(), update.norm()
                    # a tensor op, not a Python branch: no device sync per parameter
                    trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                    update.mul_(trust)
                p.add_(update, alpha=-group["lr"])
        return loss


def create_optimizer(model: nn.Module, name: str = "adamw", lr: float = 1e-4, weight_decay: float = 0.01,
                     betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                     device: torch.device | str | None = None, capturable: bool = False) -> torch.optim.Optimizer:
    """AdamW (fused on CUDA) or LAMB over `param_groups(model, weight_decay)`.

    capturable: a fused AdamW that a CUDA graph can record, its lr a device tensor (`Schedule`
    fills it in place each step)."""
    groups = param_groups(model, weight_decay)
    if name == "adamw":
        device = torch.device(device) if device is not None else next(model.parameters()).device
        for g in groups:
            g.pop("trust_ratio", None)
        # the fused kernel updates every tensor in one launch; CPU keeps the default loop
        fused = device.type == "cuda"
        if capturable and fused:
            return AdamW(groups, lr=torch.tensor(lr, device=device), betas=tuple(betas), eps=eps, fused=True,
                         capturable=True)
        return AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)
    if name == "lamb":
        return LAMB(groups, lr=lr, betas=tuple(betas), eps=eps)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


def lr_multiplier(step: int, warmup_steps: int, total_steps: int, schedule: str = "linear",
                  min_ratio: float = 0.0) -> float:
    """Factor on the peak lr for optimizer update `step` (0-based).

    Warmup: (step + 1) / warmup_steps, so the first update already moves and update
    warmup_steps - 1 reaches the peak. Then progress p = (step - warmup) / (total - warmup)
    decays linearly (1 - p) or along a half cosine (1 + cos(pi p)) / 2, from 1 down to
    `min_ratio` at step == total_steps; "constant" stays at 1.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        decay = 1.0 - progress
    elif schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    return min_ratio + (1.0 - min_ratio) * decay


def create_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                     schedule: str = "linear", min_ratio: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """`LambdaLR` following `lr_multiplier`.

    The multiplier is a closure, so a checkpoint stores only the step count: a resumed run
    follows the schedule of its own (possibly longer) config.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if warmup_steps < 0 or total_steps <= 0:
        raise ValueError(f"need warmup_steps >= 0 and total_steps > 0, got {warmup_steps}, {total_steps}")

    def multiplier(step: int) -> float:
        return lr_multiplier(step, warmup_steps, total_steps, schedule, min_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the lr of every parameter group (in place on the device for a capturable optimizer)."""
    for group in optimizer.param_groups:
        if group.get("capturable"):  # the optimizer (and a CUDA graph of it) reads lr on the device
            if not isinstance(group["lr"], torch.Tensor):
                group["lr"] = torch.tensor(lr, device=group["params"][0].device)
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


class Schedule:
    """The learning rate of every optimizer update: warmup, then decay to `min_ratio` of the peak.

    Progress is counted in optimizer steps, or, with a time budget (`budget_s`), in seconds of the
    budget after a session's first step (evaluations and checkpoints included): the decay then
    ends when the budget does, however many steps fit in it. Warmup covers `warmup_steps` steps
    when given, else `warmup_fraction` of the run (of its steps, or of that time). The peak lr and
    weight decay are read from the settings each time the run starts, so a resumed run takes new
    values; the warmup length is kept from the run's start (`state_dict`), so extending
    `max_steps` stretches the decay without a second warmup. The training loop hands each lr to its
    engine, which sets it (`set_lr` for a torch optimizer).
    """

    def __init__(self, peak_lr: float, total_steps: int,
                 warmup_steps: int | None, warmup_fraction: float, kind: str = "linear",
                 min_ratio: float = 0.0, budget_s: float | None = None) -> None:
        if kind not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")
        self.peak_lr, self.total_steps = peak_lr, max(1, total_steps)
        self.kind, self.min_ratio, self.budget_s = kind, min_ratio, budget_s
        self.warmup_fraction = warmup_fraction
        self.warmup_steps = warmup_steps if warmup_steps is not None else (
            None if budget_s else round(warmup_fraction * self.total_steps))

    def multiplier(self, step: int, trained_s: float = 0.0, train_span_s: float | None = None) -> float:
        """Factor on the peak lr for update `step` (0-based) after `trained_s` seconds of the budget's
        clock out of `train_span_s` (time budgets only)."""
        if self.budget_s is None:
            return lr_multiplier(step, self.warmup_steps, self.total_steps, self.kind, self.min_ratio)
        if self.warmup_steps is not None and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        # time-based: positions in milliseconds of the clock, so lr_multiplier's integer maths holds;
        # before the span is known (a run's first step) the position is its start
        total = max(1, round((train_span_s or 1.0) * 1000))
        position = min(total, round(trained_s * 1000))
        warmup = 0 if self.warmup_steps is not None else round(self.warmup_fraction * total)
        return lr_multiplier(position, warmup, total, self.kind, self.min_ratio)

    def apply(self, step: int, trained_s: float = 0.0, train_span_s: float | None = None) -> float:
        """The lr of update `step`."""
        return self.peak_lr * self.multiplier(step, trained_s, train_span_s)

    def state_dict(self) -> dict:
        return {"warmup_steps": self.warmup_steps, "total_steps": self.total_steps}

    def load_state_dict(self, state: dict) -> None:
        self.warmup_steps = state.get("warmup_steps", self.warmup_steps)
