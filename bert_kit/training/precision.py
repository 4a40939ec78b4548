"""Device and numeric precision, resolved once per run and printed with the reason.

    prec = resolve_precision("auto")      # prints e.g. "precision: bf16 autocast on cuda (...)"
    with prec.autocast():
        loss = model(...)
    scaler = prec.grad_scaler()           # a real GradScaler only for fp16

"auto" picks bf16 on a GPU that supports it (no loss scaling needed: bf16 has fp32's exponent
range), fp16 with a GradScaler on older GPUs, and fp32 on the CPU (CPU autocast is slower than
fp32 for training on most machines). Weights and optimizer state stay in fp32 in every mode;
autocast runs the matmuls in the lower precision.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch

from bert_kit.checks import ConfigError, resolve_device  # noqa: F401  (resolve_device: re-exported)

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = ("auto", *_DTYPES)


@dataclass
class Precision:
    """The resolved choice: where to run, which autocast dtype, and why."""

    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 means autocast is off
    reason: str

    @property
    def name(self) -> str:
        return next(k for k, v in _DTYPES.items() if v == self.dtype)

    @property
    def use_autocast(self) -> bool:
        return self.dtype != torch.float32

    @property
    def use_grad_scaler(self) -> bool:
        # fp16's narrow exponent range underflows small gradients without loss scaling
        return self.dtype == torch.float16

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype for `compute_mlm_loader_loss(autocast_dtype=...)`; None in fp32."""
        return self.dtype if self.use_autocast else None

    def autocast(self, cache_enabled: bool = True) -> contextlib.AbstractContextManager:
        """Autocast context for forward passes (a no-op in fp32). A CUDA graph capture needs
        `cache_enabled=False`: cached casts of the weights would be stale in later replays."""
        if not self.use_autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype, cache_enabled=cache_enabled)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A GradScaler that scales only in fp16 (disabled ones pass calls straight through)."""
        return torch.amp.GradScaler(self.device.type, enabled=self.use_grad_scaler)

    def __str__(self) -> str:
        mode = "fp32" if not self.use_autocast else f"{self.name} autocast"
        scaler = " + GradScaler" if self.use_grad_scaler else ""
        return f"{mode}{scaler} on {self.device} ({self.reason})"


def resolve_precision(precision: str = "auto", device: str | torch.device | None = "auto",
                      verbose: bool = True, purpose: str = "training") -> Precision:
    """Choose device and dtype; `precision` is one of auto, fp32, bf16, fp16. `purpose`
    ("training", "inference") words the printed reason."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    dev = resolve_device(device)
    cuda = dev.type == "cuda"
    if precision == "auto":
        if cuda and torch.cuda.is_bf16_supported():
            prec = Precision(dev, torch.bfloat16, f"{torch.cuda.get_device_name(dev)} supports bfloat16")
        elif cuda:
            prec = Precision(dev, torch.float16, f"{torch.cuda.get_device_name(dev)} lacks bfloat16")
        else:
            prec = Precision(dev, torch.float32, f"{dev.type} device: autocast would not speed up {purpose}")
    else:
        dtype = _DTYPES[precision]
        if cuda and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            raise ValueError(f"precision=bf16 but {torch.cuda.get_device_name(dev)} does not support bfloat16; "
                             "use fp16 or auto")
        prec = Precision(dev, dtype, "requested")
    if verbose:
        print(f"precision: {prec}", flush=True)
    return prec


def start_cuda(device: torch.device) -> None:
    """Start CUDA on `device` in a background thread: the driver, the device's context and cuBLAS
    (half a second on an H100 host) load while the caller reads data and builds its model on the
    CPU. torch's lazy initialisation holds a lock: the caller's first CUDA call waits for the rest.
    Nothing for other devices. A failure is left for the caller's own CUDA calls to report."""
    if device.type != "cuda":
        return

    def start() -> None:
        try:
            with torch.cuda.device(device):  # this thread's current device only
                a = torch.ones(64, 64, device=device)
                (a @ a).sum().item()
        except Exception:  # noqa: BLE001 (reported where the run uses the device)
            pass

    threading.Thread(target=start, name="cuda-start", daemon=True).start()
