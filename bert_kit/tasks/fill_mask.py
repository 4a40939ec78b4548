"""Fill in [MASK] tokens: the quickest look at what a masked-language model has learned.

    bert-kit fill-mask --model runs/pretrain/final "the cat sat on the [MASK]." --top-k 5

Python:

    predictions = fill_mask(model, tokenizer, "paris is the [MASK] of france.")
    predictions[0][0]  # {"token": "capital", "token_id": 3007, "score": 0.93, "sequence": "..."}

`model` is any bert-kit MLM model (`BERTForMaskedLM` or `BERTForPreTraining`); the model
folder must hold MLM head weights (`cls.predictions.*`), which encoder-only checkpoints such as
sentence-transformers models do not have.

Bounds, each a ConfigError that says what to change: a text holds 1 to MAX_MASKS [MASK] tokens,
all within the model's positions (a mask past them would be cut off with the text); top_k is an
integer from 1 to the vocabulary size. Each prediction carries its whole filled-in text, so
masks x top_k is what an answer costs.

torch is imported by the functions that run a model: `bert-kit fill-mask` checks its texts (and
answers --help) without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from bert_kit.checks import ConfigError, Range, resolve_device

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

MAX_MASKS = 16  # [MASK] tokens per text: each is predicted on its own, with the others still masked


def encode_masked(tokenizer: Any, text: str, max_length: int | None = None, max_masks: int = MAX_MASKS) -> list[int]:
    """Token ids (with [CLS]/[SEP], at most `max_length`) of a text holding 1 to `max_masks` [MASK]
    tokens, all within `max_length`; otherwise a ConfigError saying which bound the text breaks."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    mask = tokenizer.convert_ids_to_tokens(tokenizer.mask_token_id)
    ids = tokenizer(text, max_length=max_length, return_tensors=None)["input_ids"][0]
    kept, written = ids.count(tokenizer.mask_token_id), text.count(mask)
    shown = repr(text if len(text) <= 60 else text[:57] + "...")
    if kept < written:  # the tokenizer cut the text before some of its masks
        raise ConfigError(f"{written - kept} of the {written} {mask} token(s) of the text {shown} lie past the "
                          f"model's {max_length} positions, where the text is cut: shorten the text before them")
    if kept == 0:
        raise ConfigError(f"no {mask} token in the text {shown}: write {mask} where a word is to be predicted")
    if kept > max_masks:
        raise ConfigError(f"the text {shown} holds {kept} {mask} tokens; at most {max_masks} (each is predicted on "
                          "its own, with the others still masked): split it into several texts")
    return ids


def fill_mask(model: nn.Module, tokenizer: Any, text: str, top_k: int = 5) -> list[list[dict[str, Any]]]:
    """Top-k predictions for every [MASK] in `text`, in order of appearance.

    Returns one list per mask of `top_k` dicts: token (str), token_id (int), score (softmax
    probability over the vocabulary) and sequence (the text with this token filled in).
    """
    check_top_k(top_k, vocab_size(model, tokenizer))
    limit = getattr(getattr(model, "config", None), "max_length", None)
    return fill_masks(model, tokenizer, [encode_masked(tokenizer, text, limit)], top_k)[0]


def check_top_k(top_k: int, vocab_size: int) -> None:
    """top_k is an integer from 1 to the vocabulary size."""
    Range(1, vocab_size, integer=True, hint="the vocabulary size").check("top_k", top_k)


def vocab_size(model: nn.Module, tokenizer: Any) -> int:
    """Rows of the model's MLM decoder (its config's vocab_size), else the tokenizer's vocabulary."""
    return getattr(getattr(model, "config", None), "vocab_size", None) or tokenizer.vocab_size


def fill_masks(model: nn.Module, tokenizer: Any, rows: Sequence[Sequence[int]],
               top_k: int = 5) -> list[list[list[dict[str, Any]]]]:
    """`fill_mask` for a batch of token id lists (with [CLS]/[SEP]): one padded forward pass, the
    MLM head only at the [MASK] positions. Returns, per row, one list of `top_k` dicts per mask."""
    import torch

    check_top_k(top_k, vocab_size(model, tokenizer))
    lengths = torch.tensor([len(r) for r in rows])
    ids = torch.full((len(rows), int(lengths.max())), tokenizer.pad_token_id, dtype=torch.long)  # (B, T)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.as_tensor(row)
    attention_mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    index = ((ids == tokenizer.mask_token_id) & attention_mask.bool()).flatten().nonzero().squeeze(1)  # (M,) flat
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model(ids.to(device), attention_mask.to(device), torch.zeros_like(ids).to(device),
                    masked_index=index.to(device))
    model.train(was_training)
    logits = out[0] if isinstance(out, tuple) else out  # (M, V): (mlm, nsp) for a pretraining model
    scores, top_ids = logits.float().softmax(dim=-1).topk(min(top_k, logits.shape[-1]), dim=-1)  # (M, k)
    scores, top_ids = scores.cpu().tolist(), top_ids.cpu().tolist()
    results: list[list[list[dict[str, Any]]]] = [[] for _ in rows]
    for m, flat in enumerate(index.tolist()):
        b, pos = divmod(flat, ids.shape[1])
        predictions = []
        for score, tid in zip(scores[m], top_ids[m]):
            filled = list(rows[b])
            filled[pos] = tid
            predictions.append({"token": tokenizer.convert_ids_to_tokens(tid), "token_id": tid, "score": score,
                                "sequence": tokenizer.decode(filled)})
        results[b].append(predictions)
    return results


def load_mlm_model(folder: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The MLM model of a folder's architecture (`BERTForMaskedLM`, `ModernBertForMaskedLM`), refusing
    folders without MLM head weights."""
    from bert_kit.config import load_hf_config
    from bert_kit.families import model_class
    from bert_kit.hf import load_into
    from bert_kit.weight_files import read_state_dict

    from bert_kit.hf_names import holds_mlm_head

    state, config = read_state_dict(folder), load_hf_config(folder)
    if not holds_mlm_head(list(state), config.model_type):
        raise ValueError(f"{folder} has no MLM head weights: it is an encoder-only "
                         "checkpoint, so its [MASK] predictions would be random")
    from bert_kit.kernels import fast_path

    model = model_class(config, "ForMaskedLM")(config)
    load_into(model, state, source=str(folder))
    device = resolve_device(device)
    fast_path.apply(model, device, training=False)
    return model.to(device).eval()
