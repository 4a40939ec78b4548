"""What `BERTModel` checks of its inputs before it runs, and the block in which a trusted caller
skips the value checks.

Shapes, dtypes and ids out of range fail here with a message naming the input at fault, instead
of an index error deep in the embeddings, a CUDA assert or a silently wrong output.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from bert_kit.config import BertConfig

_inputs_checked_by_caller = False


@contextmanager
def unchecked_inputs() -> Iterator[None]:
    """Within this block forward passes skip `check_inputs`'s value range check: for callers that
    built their batches from a tokenizer the model was checked against (the training loop). On a
    GPU the check reads a value back from the device, a synchronisation in every step."""
    global _inputs_checked_by_caller
    previous, _inputs_checked_by_caller = _inputs_checked_by_caller, True
    try:
        yield
    finally:
        _inputs_checked_by_caller = previous


def check_inputs(config: BertConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 token_type_ids: torch.Tensor | None) -> None:
    """Clear errors for bad ids, masks and shapes, before they become an index error, a CUDA
    assert or a silently wrong output. Costs one host-device sync (all value checks at once)."""
    if not getattr(config, "type_vocab_size", 0):
        token_type_ids = None  # a model without segments (DistilBERT, ModernBERT) ignores them
    for name, t in (("input_ids", input_ids), ("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (batch, seq_len), got {type(t).__name__}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must be an integer tensor (torch.long), got {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}")
    B, T = input_ids.shape
    if T == 0 and B > 0:
        raise ValueError(f"input_ids has no tokens (shape {tuple(input_ids.shape)}): a sequence holds at least "
                         "[CLS] and [SEP]")
    if T > config.max_length:
        past = f" past position_offset {config.position_offset}" if getattr(config, "position_offset", 0) else ""
        raise ValueError(f"sequence length {T} exceeds max_position_embeddings "
                         f"({config.max_position_embeddings}){past}; truncate the input")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and t.shape != input_ids.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} does not match input_ids {tuple(input_ids.shape)}")
    if token_type_ids is not None and token_type_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"token_type_ids must be an integer tensor (torch.long), got {token_type_ids.dtype}")
    if attention_mask is not None and attention_mask.is_complex():
        raise TypeError(f"attention_mask must hold 0/1 (integers, bools or floats), got {attention_mask.dtype}")
    if not input_ids.numel() or _inputs_checked_by_caller:
        return  # an empty batch gives an empty output; a trusted caller checked the values itself
    # one device sync for all value checks (each .item() on a GPU tensor waits for the GPU)
    stats = [input_ids.min(), input_ids.max()]
    if token_type_ids is not None:
        stats += [token_type_ids.min(), token_type_ids.max()]
    if attention_mask is not None:
        nonzero = attention_mask != 0
        stats += [(nonzero & (attention_mask != 1)).any(), nonzero.sum(dim=1).min()]  # not 0/1; emptiest row
    values = torch.stack([s.long() for s in stats]).tolist()
    lo, hi = values[0], values[1]
    if lo < 0 or hi >= config.vocab_size:
        raise ValueError(f"token id {lo if lo < 0 else hi} out of range for vocab_size {config.vocab_size}")
    if token_type_ids is not None and (values[2] < 0 or values[3] >= config.type_vocab_size):
        bad = values[2] if values[2] < 0 else values[3]
        raise ValueError(f"token_type id {bad} out of range for type_vocab_size {config.type_vocab_size}")
    if attention_mask is not None and values[-2]:
        odd = attention_mask[(attention_mask != 0) & (attention_mask != 1)][:3].tolist()
        raise ValueError(f"attention_mask must hold only 0 (padding) and 1 (token), found {odd}")
    if attention_mask is not None and values[-1] == 0:
        row = int((attention_mask != 0).sum(dim=1).argmin())
        raise ValueError(f"attention_mask row {row} is all zeros: every sequence needs at least one token")
