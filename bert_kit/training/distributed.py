"""Multi-process training on PyTorch's own engine: torchrun, DDP or FSDP2, and clean failures.

One process per GPU, launched with `torchrun --nproc_per_node N -m bert_kit pretrain ...`.
A plain `python`/`bert-kit` run is a world of size 1: every helper then works without
`torch.distributed` being initialised, so single-process code needs no special cases.

* `init_distributed` joins the group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...):
  NCCL on GPUs, gloo on CPU, with a timeout after which a collective gives up.
* `wrap_model` puts DDP around the model (every rank holds all weights), or shards it with
  FSDP2 (`fully_shard` on each encoder layer, then on the root, which keeps the word
  embeddings and the MLM decoder tied to them in one group).
* `no_sync(model)` skips DDP's gradient all-reduce on all but the last micro-batch of an
  optimizer step. FSDP2 reduce-scatters every micro-batch instead: skipping would keep full,
  unsharded gradients, which is what sharding is there to avoid.
* `collective_errors()` turns the error a collective raises when another rank has died or
  stalled past the timeout into a one-line `DistributedError` naming this rank.
* `Agreement` is where the loop's ranks agree on what they must decide alike (the end of a time
  budget, the lr's clock, a checkpoint due by the clock, a stop signal): one collective, every
  `AGREE_S` seconds' worth of steps.

Only rank 0 logs, plots and writes files (`is_main()`); all ranks call `barrier()` around them.

The JAX engine (engine=jax) runs one process per host, joined by `jax.distributed` instead of
torchrun; `use_processes` hands these helpers to its processes (`bert_kit.jax.train.JaxProcesses`),
so the loop, the jobs and the data loaders shard, reduce and write as they do for torch ranks.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import gc
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from bert_kit.training.settings import DEFAULT_TIMEOUT_S

PARALLEL_MODES = ("ddp", "fsdp")
# Under torchrun the ranks agree on the budget's end, the lr's clock, a checkpoint due and a stop
# signal in a collective that waits for the device: done every step, it keeps the host from queuing
# the next steps (bert-small replayed as CUDA graphs on 4 GPUs: 8.27M tokens/s against 9.45M). One
# process agrees with itself every step; several agree every AGREE_S seconds' worth of steps.
AGREE_S = 0.25

# What gloo/NCCL/the store say when a peer is gone or silent (their errors are plain RuntimeErrors).
_COMM_ERROR = re.compile(r"connection (closed|reset)|broken pipe|timed out|timeout|nccl|gloo|socket|watchdog|"
                         r"process ?group", re.IGNORECASE)


class DistributedError(RuntimeError):
    """A collective failed: another rank exited, crashed or stalled past the timeout."""


_processes: Any = None  # another runtime's processes that answer the helpers below (`use_processes`)


def use_processes(processes: Any) -> None:
    """Let `processes` (rank(), world_size(), barrier(), gather(values) -> (ranks, n) array,
    all_gather_object(obj)) answer this module's rank helpers: the JAX engine's hosts."""
    global _processes
    _processes = processes


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def init_distributed(timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Join the process group described by torchrun's RANK / WORLD_SIZE / LOCAL_RANK.

    NCCL on CUDA, gloo on CPU; collectives fail after `timeout_s` seconds of waiting.
    Returns True when running distributed (world size > 1). Calling it again, or without
    torchrun's variables, does nothing.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or _initialized():
        return _initialized()
    if "RANK" not in os.environ or "MASTER_ADDR" not in os.environ:
        raise ValueError("WORLD_SIZE > 1 but RANK/MASTER_ADDR are not set; launch with torchrun")
    if timeout_s <= 0:
        raise ValueError(f"dist_timeout_s must be positive, got {timeout_s}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=torch.device("cuda", local_rank) if backend == "nccl" else None)
    # a process that exits still in the group aborts ("terminate called ..."): leave it at exit
    atexit.register(cleanup)
    return True


def cleanup() -> None:
    """Leave the process group (at the end of a run, also after a failed collective)."""
    if _initialized():
        # free models that are no longer used first: an FSDP2 model kept alive by a reference
        # cycle holds gloo work objects that abort the process if freed after the group is gone
        gc.collect()
        dist.destroy_process_group()


def rank() -> int:
    if _processes is not None:
        return _processes.rank()
    return dist.get_rank() if _initialized() else 0


def world_size() -> int:
    if _processes is not None:
        return _processes.world_size()
    return dist.get_world_size() if _initialized() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """True on the process that logs and writes files (rank 0)."""
    return rank() == 0


def barrier() -> None:
    if _processes is not None:
        _processes.barrier()
    elif _initialized():
        dist.barrier()


def _comm_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_mean(x: torch.Tensor | float) -> torch.Tensor | float:
    """Mean of `x` over ranks (a float in, a float out; a tensor is reduced on its device)."""
    if _processes is not None:
        return float(_processes.gather([float(x)]).mean())
    if not _initialized():
        return x
    is_float = not torch.is_tensor(x)
    t = torch.tensor(float(x), device=_comm_device()) if is_float else x.detach().clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    t /= world_size()
    return t.item() if is_float else t


def max_over_ranks(*values: float) -> list[float]:
    """The largest of each value over ranks, in one collective: numbers every rank must use alike."""
    if _processes is not None:
        return _processes.gather([float(v) for v in values]).max(axis=0).tolist()
    if not _initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def any_rank(flag: bool) -> bool:
    """True if `flag` is True on any rank (e.g. a stop signal that reached only one process)."""
    return any_ranks(flag)[0]


def any_ranks(*flags: bool) -> list[bool]:
    """`any_rank` of several flags in one collective."""
    if _processes is not None:
        return [bool(x) for x in _processes.gather([float(bool(f)) for f in flags]).max(axis=0)]
    if not _initialized():
        return [bool(f) for f in flags]
    summed = all_reduce_mean(torch.tensor([1.0 if f else 0.0 for f in flags], device=_comm_device()))
    return [bool(x > 0) for x in summed.tolist()]


@dataclass
class Agreed:
    """What every rank decided alike at an agreement."""

    out_of_time: bool  # some rank's clock says the time budget is spent
    save_late: bool  # some rank says a checkpoint is due by the clock (save_minutes)
    stop: bool  # a stop signal reached some rank
    trained_s: float  # the budget clock's reading: the latest rank's
    left_s: float  # seconds left for steps: the earliest rank's end


class Agreement:
    """The one place the loop's ranks agree: one collective at `due` steps, which come every `AGREE_S`
    seconds' worth of steps under torchrun (every step for one process, at no cost)."""

    def __init__(self, step: int) -> None:
        self.next_step = step + 1

    @staticmethod
    def between_s() -> float:
        """Seconds of steps until the ranks next agree (what a decision can come late by)."""
        return AGREE_S if world_size() > 1 else 0.0

    def due(self, step: int, total: int) -> bool:
        return step >= self.next_step or step == total

    def agree(self, step: int, out_of_time: bool, save_late: bool, stop: bool, trained_s: float, left_s: float,
              step_s: float) -> Agreed:
        """The ranks' decisions at `step` from each rank's own (`step_s`: its time of a step, which
        spaces the agreements)."""
        if world_size() <= 1:
            self.next_step = step + 1
            return Agreed(out_of_time, save_late, stop, trained_s, left_s)
        late, saving, stopping, trained_s, minus_left, step_s = max_over_ranks(
            float(out_of_time), float(save_late), float(stop), trained_s, -left_s, step_s)
        self.next_step = step + (max(1, int(AGREE_S / step_s)) if step_s > 0 else 1)
        return Agreed(late > 0, saving > 0, stopping > 0, trained_s, -minus_left)


def average_in_place(tensors: list[torch.Tensor]) -> None:
    """Each tensor set to its mean over the ranks, in one all-reduce of one flat buffer (what DDP
    does bucket by bucket during the backward). The same kernels every call, with no host sync:
    a CUDA graph can record it with the step."""
    if world_size() <= 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat.div_(world_size())
    parts = flat.split([t.numel() for t in tensors])
    torch._foreach_copy_(tensors, [part.view_as(t) for part, t in zip(parts, tensors)])


def broadcast_weights(model: nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank, as DDP does when it wraps a model."""
    if world_size() > 1 and _processes is None:
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)


def all_gather_object(obj: Any) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] on every rank (small picklable objects only)."""
    if _processes is not None:
        return _processes.all_gather_object(obj)
    if not _initialized():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


# ---- wrapping the model ------------------------------------------------------------------------

def wrap_model(model: nn.Module, device: torch.device, parallel: str = "ddp",
               param_dtype: torch.dtype | None = None) -> nn.Module:
    """DDP or FSDP2 around `model` when world size > 1; the model itself otherwise.

    parallel: "ddp" (every rank holds all weights, gradients are all-reduced) or "fsdp"
        (weights, gradients and optimizer state sharded over the ranks; create the optimizer
        after this call, since FSDP2 replaces the parameters by sharded DTensors in place).
    param_dtype: FSDP2 only: dtype weights are gathered in for forward/backward (bf16 halves
        the traffic); gradients are still reduced in fp32 and the sharded master weights stay fp32.
    """
    if parallel not in PARALLEL_MODES:
        raise ValueError(f"parallel must be one of {PARALLEL_MODES}, got {parallel!r}")
    if world_size() <= 1:
        return model
    if parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from bert_kit.model import TransformerEncoderBlock
        from bert_kit.modernbert import ModernBertLayer

        mesh = init_device_mesh(device.type, (world_size(),))
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        # one group per encoder layer: only one layer's full weights are live at a time; each
        # call moves that layer's shard to the device, so the whole model never has to fit there
        for layer in [m for m in model.modules() if isinstance(m, (TransformerEncoderBlock, ModernBertLayer))]:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        # the root group holds the rest: embeddings, pooler, heads; the tied decoder weight is
        # the word-embedding parameter itself, so it is sharded (and gathered) once
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=ids)


def is_fsdp(model: nn.Module) -> bool:
    """True for a model sharded with FSDP2 (`fully_shard`)."""
    # a model is sharded only after torch.distributed.fsdp was imported: looked up, not imported
    # (its import, with DTensor's and sympy's, is a second of start-up for an unsharded run)
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (what gets saved); an FSDP2 model is its own module."""
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model


def no_sync(model: nn.Module, skip: bool = True) -> contextlib.AbstractContextManager:
    """DDP's `no_sync()` when `skip` (accumulating micro-batches), else a null context."""
    if skip and hasattr(model, "no_sync"):
        return model.no_sync()
    return contextlib.nullcontext()


def full_value(x: Any) -> Any:
    """A plain tensor from a DTensor (e.g. FSDP2's gradient norm); anything else unchanged.
    Collective for sharded DTensors: call it on every rank."""
    tensor = sys.modules.get("torch.distributed.tensor")  # a DTensor exists only once its module was imported
    return x.full_tensor() if tensor is not None and isinstance(x, tensor.DTensor) else x


# ---- failures ----------------------------------------------------------------------------------

def is_collective_error(error: BaseException) -> bool:
    """True for the errors gloo, NCCL or the rendezvous store raise when a peer is lost."""
    return _initialized() and (isinstance(error, dist.DistError) or
                               (isinstance(error, RuntimeError) and bool(_COMM_ERROR.search(str(error)))))


@contextlib.contextmanager
def collective_errors(timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
    """Re-raise a failed collective as a one-line `DistributedError` naming this rank.

    Without this, a rank whose peer died prints a C++ traceback from deep inside gloo/NCCL; with
    it, the run ends with e.g. "rank 0 of 2: lost the other ranks (Connection closed by peer)".
    """
    try:
        yield
    except DistributedError:
        raise
    except (RuntimeError, OSError) as e:
        if not is_collective_error(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        reason = re.sub(r"^\[[^\]]*\]\s*", "", first).split(". ")[0]  # drop "[.../pair.cc:553] "
        raise DistributedError(
            f"rank {rank()} of {world_size()}: lost the other ranks ({reason}); another rank exited or "
            f"stalled for more than dist_timeout_s={timeout_s:g} s (see its log). The last checkpoint is "
            "intact: restart with --resume latest") from e
