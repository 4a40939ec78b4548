"""Multi-process training helpers: torchrun environment, rank queries, DDP wrapping.

One process per GPU, launched with `torchrun --nproc_per_node N -m bert_kit pretrain ...`.
A plain `python`/`bert-kit` run is a world of size 1: every helper then works without
`torch.distributed` being initialised, so single-process code needs no special cases.

Only rank 0 logs, plots and writes checkpoints (`is_main()`); all ranks call `barrier()` around
shared files. With gradient accumulation, `no_sync(model)` skips the gradient all-reduce on all
but the last micro-batch of an optimizer step.
"""

from __future__ import annotations

import contextlib
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn

DEFAULT_TIMEOUT_MIN = 30  # long enough for rank 0 to tokenise a corpus while others wait


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def init_distributed(timeout_minutes: float = DEFAULT_TIMEOUT_MIN) -> bool:
    """Join the process group described by torchrun's RANK / WORLD_SIZE / LOCAL_RANK.

    NCCL on CUDA, gloo on CPU. Returns True when running distributed (world size > 1).
    Calling it again, or without torchrun's variables, does nothing.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or _initialized():
        return _initialized()
    if "RANK" not in os.environ or "MASTER_ADDR" not in os.environ:
        raise ValueError("WORLD_SIZE > 1 but RANK/MASTER_ADDR are not set; launch with torchrun")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes),
                            device_id=torch.device("cuda", local_rank) if backend == "nccl" else None)
    return True


def cleanup() -> None:
    """Leave the process group (at the end of a run)."""
    if _initialized():
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if _initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if _initialized() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """True on the process that logs and writes files (rank 0)."""
    return rank() == 0


def barrier() -> None:
    if _initialized():
        dist.barrier()


def all_reduce_mean(x: torch.Tensor | float) -> torch.Tensor | float:
    """Mean of `x` over ranks (a float in, a float out; a tensor is reduced on its device)."""
    if not _initialized():
        return x
    is_float = not torch.is_tensor(x)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor(float(x), device=device) if is_float else x.detach().clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    t /= world_size()
    return t.item() if is_float else t


def any_rank(flag: bool) -> bool:
    """True if `flag` is True on any rank (e.g. a stop signal that reached only one process)."""
    if not _initialized():
        return flag
    return all_reduce_mean(1.0 if flag else 0.0) > 0


def wrap_model(model: nn.Module, device: torch.device) -> nn.Module:
    """DDP around `model` when world size > 1; the model itself otherwise."""
    if world_size() <= 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=ids)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (what gets saved)."""
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model


def no_sync(model: nn.Module, skip: bool = True) -> contextlib.AbstractContextManager:
    """DDP's `no_sync()` when `skip` (accumulating micro-batches), else a null context."""
    if skip and hasattr(model, "no_sync"):
        return model.no_sync()
    return contextlib.nullcontext()
