"""The fast path: which kernels a model runs for a device and a job, put on it by one explicit call.

`bert_kit/model.py` is the reference: plain PyTorch, attention by `F.scaled_dot_product_attention`.
`apply` swaps in, module by module, subclasses from this package that keep the parameters and the
state dict names and compute the same function on other kernels; the job prints what it applied:

    fast = fast_path.apply(model, device, training=True, dtype=torch.bfloat16, compile=True,
                           low_precision_residual=True)
    print(fast)  # fast path: flash varlen attention, SDPA with safe mask kernels, Triton dropout masks, ...
    model.compile(dynamic=False)

    swapped in             for                   file                 when
    CudaAttention          MultiHeadAttention    attention.py         on CUDA
    FusedQKVAttention      MultiHeadAttention    fused_backward.py    compiled CUDA training, 16-bit stream
    ShortAttention         MultiHeadAttention    short_attention.py   ... and head sizes 16-128, powers of 2
    FusedFeedForward       FeedForward (GELU)    fused_backward.py    compiled CUDA training, 16-bit stream
    MaskDropout            the encoder's Dropout dropout.py           compiled CUDA training
    LowPrecisionLayerNorm  LayerNorm             residual.py          low_precision_residual, 16-bit autocast
    PaddedDecoderMLMHead   MLMHead               padded_decoder.py    the heads compiled on CUDA

ModernBERT (`bert_kit.modernbert`) takes its own plan: each `ModernBertAttention.attend` becomes a
packed kernel of `window_attention.py` with its sliding window (flash varlen attention in 16-bit
on CUDA, FlexAttention with a document and window block mask otherwise on CUDA), and
`ModernBertModel` becomes `PackedModernBertModel`, which runs padded calls packed: no layer builds
a (T, T) mask, so memory grows linearly with the length (8,192 tokens). With flash and Triton, each
`ModernBertAttention` becomes `RotaryAttention` (`rotary_attention.py`): q and k turned in one
kernel, and attention with the rotations in one kernel a pass at T <= 128 and in the sliding-window
layers at any length. In 16 bits with Triton, each `GeGLU` becomes `FusedGeGLU` (`geglu.py`): its
activation one kernel a pass.

`plan` makes the decision, a pure function of the device, the dtype, the job and the config (tested
without a GPU); `install` swaps the classes; `apply` does both. Each swapped module still checks
per call what only the call knows (compiling? gradients? T <= 128?) and otherwise runs the
reference's code. Only modules still of the reference's class are swapped, so applying again
(an evaluation that wraps the training model) changes nothing. Pretraining, fine-tuning and
inference (evaluate, predict, embed, serve, fill-mask) all call `apply`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass

import torch
import torch.nn as nn

from bert_kit.config import BertConfig
from bert_kit.heads import MLMHead
from bert_kit.model import BERTModel, FeedForward, LayerNorm, MultiHeadAttention
from bert_kit.modernbert import GeGLU, ModernBertAttention, ModernBertModel, sdpa_attention
from bert_kit.modernbert_config import ModernBertConfig

HALF = (torch.float16, torch.bfloat16)
ATTENTION_CHOICES = ("auto", "flash", "flex", "sdpa")  # ModernBERT's attention kernel (`plan`'s attention)
JAX_ENGINE = "the JAX engine runs the model"  # the note of jobs whose steps the JAX engine computes


@dataclass(frozen=True)
class FastPath:
    """What `apply` put on a model. `str()` gives the line a run prints."""

    device: str = "cpu"  # the device type the plan is for
    cuda_attention: bool = False  # `CudaAttention`: SDPA's masked kernels chosen per use, varlen for packed
    varlen_flash: bool = False  # ... and packed batches on the flash varlen kernel (16-bit, head size <= 256)
    dropout_masks: bool = False  # `MaskDropout`: Triton dropout masks
    fused_ffn: bool = False  # `FusedFeedForward`: GELU and its gradient with the bias gradient
    fused_qkv: bool = False  # `FusedQKVAttention`: the QKV gradient with its bias gradient
    short_attention: bool = False  # `ShortAttention`: attention with its QKV gradient in two kernels, T <= 128
    padded_decoder: bool = False  # `PaddedDecoderMLMHead`: the MLM decoder on a vocabulary padded to 64
    low_precision_residual: bool = False  # `LowPrecisionLayerNorm`: a 16-bit residual stream
    window_flash: bool = False  # ModernBERT: flash varlen attention with the sliding window, batches packed
    flex_attention: bool = False  # ModernBERT: FlexAttention with a document + window block mask, batches packed
    rotary_attention: bool = False  # ModernBERT: `RotaryAttention`: rotations, attention at T <= 128 and in windows
    fused_geglu: bool = False  # ModernBERT: `FusedGeGLU`: the gated activation in one Triton kernel each way
    note: str = ""  # why nothing applies, where the device does not say it (the JAX engine)

    @property
    def applied(self) -> list[str]:
        """The parts, in words."""
        fused = {(True, True): "fused FFN/QKV backward", (True, False): "fused FFN backward",
                 (False, True): "fused QKV backward"}.get((self.fused_ffn, self.fused_qkv))
        parts = [("flash varlen attention", self.varlen_flash), ("SDPA with safe mask kernels", self.cuda_attention),
                 ("Triton dropout masks", self.dropout_masks), (fused, fused is not None),
                 ("short attention (T <= 128)", self.short_attention), ("padded MLM decoder", self.padded_decoder),
                 ("16-bit residual stream", self.low_precision_residual),
                 ("flash varlen attention with sliding window", self.window_flash),
                 ("FlexAttention (sliding window + document mask)", self.flex_attention),
                 ("Triton rotary attention (T <= 128, sliding windows) and rotations", self.rotary_attention),
                 ("Triton GeGLU", self.fused_geglu),
                 ("padded batches packed", self.window_flash or self.flex_attention)]
        return [name for name, on in parts if on]

    @property
    def summary(self) -> str:
        """The parts joined, or what runs without them (results.json's "fast_path")."""
        return ", ".join(self.applied) or f"none ({self.note or self.device.upper() + ': eager SDPA'})"

    def __str__(self) -> str:
        return f"fast path: {self.summary}"


def triton_available() -> bool:
    """Whether Triton kernels can run here: torch registers `triton_op`s and Triton is installed
    (looked up, not imported: importing it loads torch._inductor, seconds of start-up)."""
    return hasattr(torch.library, "triton_op") and importlib.util.find_spec("triton") is not None


def plan(device_type: str, config: BertConfig, *, training: bool, dtype: torch.dtype = torch.float32,
         compile: bool = False, compile_heads: bool = True, mlm_head: bool = False,
         low_precision_residual: bool = False, triton: bool = True, triton_dropout: bool = True,
         fused_backward: bool = True, short_attention: bool = True, attention: str = "auto") -> FastPath:
    """The fast path for a model of `config` on a `device_type` ("cuda", "cpu", ...) in a job; the
    arguments are `apply`'s (mlm_head: the model has an MLM head; triton: Triton kernels can run)."""
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"attention={attention!r} is not a valid choice: expected one of {ATTENTION_CHOICES}")
    if isinstance(config, ModernBertConfig):
        return plan_modernbert(device_type, config, dtype=dtype, attention=attention,
                               low_precision_residual=low_precision_residual, triton=triton and short_attention,
                               triton_geglu=triton and fused_backward)
    cuda, half = device_type == "cuda", dtype in HALF
    compiled_training = cuda and compile and training and triton
    residual16 = low_precision_residual and half
    hd = config.head_dim
    # the Triton backward kernels take a 16-bit stream and widths in multiples of 64
    fused = compiled_training and fused_backward and residual16 and config.hidden_size % 64 == 0
    return FastPath(
        device=device_type, cuda_attention=cuda, varlen_flash=cuda and half and hd <= 256,
        dropout_masks=compiled_training and triton_dropout,
        fused_ffn=fused and config.hidden_act == "gelu" and config.intermediate_size % 64 == 0, fused_qkv=fused,
        short_attention=fused and short_attention and 16 <= hd <= 128 and hd & (hd - 1) == 0,
        padded_decoder=cuda and compile and compile_heads and mlm_head, low_precision_residual=residual16)


def plan_modernbert(device_type: str, config: ModernBertConfig, *, dtype: torch.dtype = torch.float32,
                    attention: str = "auto", low_precision_residual: bool = False, triton: bool = True,
                    triton_geglu: bool = True) -> FastPath:
    """ModernBERT's plan. On CUDA: flash varlen attention with the window where flash runs (16-bit,
    head size <= 256), else FlexAttention; elsewhere the reference, unless `attention` asks for
    FlexAttention (inference: it has no CPU backward). attention "sdpa": the reference everywhere.
    With flash and Triton (`triton`: present and allowed), head sizes 32, 64 or 128: `RotaryAttention`
    (rotations in one kernel; at T <= 128, and in the sliding-window layers at any length, attention
    with them, window and QKV gradient included).
    On CUDA in 16 bits with the exact GELU and `triton_geglu`: `FusedGeGLU`.
    low_precision_residual: as BERT's, under 16-bit autocast."""
    cuda = device_type == "cuda"
    flash = cuda and dtype in HALF and config.head_dim <= 256 and attention in ("auto", "flash")
    flex = attention == "flex" or (cuda and attention == "auto" and not flash)
    rotary = flash and triton and config.head_dim in (32, 64, 128)
    geglu = cuda and dtype in HALF and attention != "sdpa" and triton_geglu and config.hidden_activation == "gelu"
    return FastPath(device=device_type, window_flash=flash, flex_attention=flex, rotary_attention=rotary,
                    fused_geglu=geglu, low_precision_residual=low_precision_residual and dtype in HALF)


def install_modernbert(model: nn.Module, fast: FastPath) -> FastPath:
    """Put `fast`'s ModernBERT kernels on `model`: each attention's `attend` (still the reference's)
    and the packed encoder class; the 16-bit residual stream's norms."""
    if fast.low_precision_residual:
        from bert_kit.kernels.residual import LowPrecisionTorchLayerNorm

        for module in model.modules():
            if type(module) is nn.LayerNorm:
                module.__class__ = LowPrecisionTorchLayerNorm
    if fast.fused_geglu:  # this module imports Triton: only when planned
        from bert_kit.kernels import geglu

        fast = dataclasses.replace(fast, fused_geglu=geglu.triton_ops is not None)
        for module in model.modules():
            if fast.fused_geglu and type(module) is GeGLU:
                module.__class__ = geglu.FusedGeGLU  # same parameters: the activation in Triton
    if not (fast.window_flash or fast.flex_attention):
        return fast
    from bert_kit.kernels import window_attention

    kernel = window_attention.flash_window_attention if fast.window_flash else window_attention.flex_window_attention
    rotary = None
    if fast.rotary_attention:  # this module imports Triton: only when planned
        from bert_kit.kernels import rotary_attention

        rotary = rotary_attention.RotaryAttention if rotary_attention.triton_ops is not None else None
        fast = dataclasses.replace(fast, rotary_attention=rotary is not None)
    for module in model.modules():
        if isinstance(module, ModernBertAttention) and module.attend is sdpa_attention:
            module.attend = kernel
            if rotary is not None and type(module) is ModernBertAttention:
                module.__class__ = rotary  # same parameters: the rotations (and short attention) in Triton
        elif type(module) is ModernBertModel:
            module.__class__ = window_attention.PackedModernBertModel  # same parameters: padded calls run packed
    return fast


def install(model: nn.Module, fast: FastPath) -> FastPath:
    """Swap the classes `fast` names into `model`, in place; returns what was installed (without
    the Triton parts, if their modules find no Triton to import)."""
    if isinstance(model.config, ModernBertConfig):
        return install_modernbert(model, fast)
    from bert_kit.kernels.attention import CudaAttention
    from bert_kit.kernels.padded_decoder import PaddedDecoderMLMHead
    from bert_kit.kernels.residual import LowPrecisionLayerNorm

    swaps: dict[type, type] = {}  # reference class -> kernel class
    if fast.low_precision_residual:
        swaps[LayerNorm] = LowPrecisionLayerNorm
    if fast.cuda_attention:
        swaps[MultiHeadAttention] = CudaAttention
    if fast.padded_decoder:
        swaps[MLMHead] = PaddedDecoderMLMHead
    if fast.fused_ffn or fast.fused_qkv:  # these modules import Triton: only when planned
        from bert_kit.kernels import fused_backward

        if fused_backward.triton_ops is None:
            fast = dataclasses.replace(fast, fused_ffn=False, fused_qkv=False, short_attention=False)
        if fast.fused_ffn:
            swaps[FeedForward] = fused_backward.FusedFeedForward
        if fast.fused_qkv:
            swaps[MultiHeadAttention] = fused_backward.FusedQKVAttention
    if fast.short_attention:
        from bert_kit.kernels import short_attention

        if short_attention.triton_ops is None:
            fast = dataclasses.replace(fast, short_attention=False)
        else:
            swaps[MultiHeadAttention] = short_attention.ShortAttention
    if fast.dropout_masks:
        from bert_kit.kernels import dropout

        if dropout.dropout_mask is None:
            fast = dataclasses.replace(fast, dropout_masks=False)
        else:  # the encoder's dropouts only: a head's classifier dropout is never compiled
            bert = model if isinstance(model, BERTModel) else model.bert
            for module in bert.modules():
                if type(module) is nn.Dropout:
                    module.__class__ = dropout.MaskDropout
    for module in model.modules():
        if type(module) in swaps:  # a class already swapped (applied before) stays
            module.__class__ = swaps[type(module)]  # same parameters and buffers: only the forward changes
    return fast


def plain_projections(model: nn.Module) -> bool:
    """Whether every QKV and feed-forward layer is a plain `nn.Linear`, as the fused backward
    kernels need (they read its weight and bias); a model with unmerged LoRA adapters has others."""
    layers = [m.qkv for m in model.modules() if isinstance(m, MultiHeadAttention)]
    layers += [layer for m in model.modules() if isinstance(m, FeedForward) for layer in (m.up, m.down)]
    return all(type(layer) is nn.Linear for layer in layers)


def apply(model: nn.Module, device: torch.device | str, *, training: bool, dtype: torch.dtype = torch.float32,
          compile: bool = False, compile_heads: bool = True, low_precision_residual: bool = False,
          triton_dropout: bool = True, fused_backward: bool = True, short_attention: bool = True,
          attention: str = "auto") -> FastPath:
    """Put the fast path for `device` and the job on `model` (in place) and return what it is.

    model: a `BERTModel`, a `ModernBertModel` or a model with heads (`bert_kit.heads`,
        `bert_kit.modernbert`), on `device` or about to be.
    training: the model will be trained (else it only runs inference).
    dtype: the run's autocast dtype (float32: no autocast).
    compile: the caller compiles the model after this call (`model.compile(...)`, or `torch.compile`
        of a function that calls it): the kernels that run only compiled are put on, and dynamo
        may keep 64 graphs per function (one per padded length, batch size and train/eval)
        before it falls back to eager. compile_heads: the heads run compiled too (False: only
        `model.bert` is compiled).
    low_precision_residual: under 16-bit autocast, LayerNorm outputs (the residual stream) stay
        16-bit (`residual.py`); pretraining's setting.
    triton_dropout, fused_backward, short_attention: allow these Triton kernels where they apply
        (all by default; off to measure against inductor's own kernels). ModernBERT:
        short_attention allows `RotaryAttention`, fused_backward `FusedGeGLU`.
    attention: ModernBERT's attention kernel: "auto" (see `plan_modernbert`), "flash", "flex", or
        "sdpa" (the reference's).
    """
    mlm_head = any(isinstance(m, MLMHead) for m in model.modules())
    fast = plan(torch.device(device).type, model.config, training=training, dtype=dtype, compile=compile,
                compile_heads=compile_heads, mlm_head=mlm_head, low_precision_residual=low_precision_residual,
                triton=triton_available(), triton_dropout=triton_dropout, fused_backward=fused_backward,
                short_attention=short_attention, attention=attention)
    if not plain_projections(model):  # LoRA's layers (bert_kit/lora.py): the kernels that read weights stay off
        fast = dataclasses.replace(fast, fused_ffn=False, fused_qkv=False, short_attention=False)
    fast = install(model, fast)
    if compile:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return fast
