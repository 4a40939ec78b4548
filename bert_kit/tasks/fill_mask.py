"""Fill in [MASK] tokens: the quickest look at what a masked-language model has learned.

    bert-kit fill-mask --model runs/pretrain/final "the cat sat on the [MASK]." --top-k 5

Python:

    predictions = fill_mask(model, tokenizer, "paris is the [MASK] of france.")
    predictions[0][0]  # {"token": "capital", "token_id": 3007, "score": 0.93, "sequence": "..."}

`model` is any bert-kit MLM model (`BERTForMaskedLM` or `BERTForPreTraining`); the model
folder must hold MLM head weights (`cls.predictions.*`), which encoder-only checkpoints such as
sentence-transformers models do not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn as nn

from bert_kit.checks import positive, resolve_device


@torch.no_grad()
def fill_mask(model: nn.Module, tokenizer: Any, text: str, top_k: int = 5) -> list[list[dict[str, Any]]]:
    """Top-k predictions for every [MASK] in `text`, in order of appearance.

    Returns one list per mask of `top_k` dicts: token (str), token_id (int), score (softmax
    probability over the vocabulary) and sequence (the text with this token filled in).
    """
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    ids = tokenizer(text, max_length=limit, return_tensors=None)["input_ids"][0]
    if tokenizer.mask_token_id not in ids:
        mask = tokenizer.convert_ids_to_tokens(tokenizer.mask_token_id)
        raise ValueError(f"no {mask} token in the text {text!r}")
    return fill_masks(model, tokenizer, [ids], top_k)[0]


@torch.no_grad()
def fill_masks(model: nn.Module, tokenizer: Any, rows: Sequence[Sequence[int]],
               top_k: int = 5) -> list[list[list[dict[str, Any]]]]:
    """`fill_mask` for a batch of token id lists (with [CLS]/[SEP]): one padded forward pass, the
    MLM head only at the [MASK] positions. Returns, per row, one list of `top_k` dicts per mask."""
    positive(integer=True).check("top_k", top_k)
    lengths = torch.tensor([len(r) for r in rows])
    ids = torch.full((len(rows), int(lengths.max())), tokenizer.pad_token_id, dtype=torch.long)  # (B, T)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.as_tensor(row)
    attention_mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    index = ((ids == tokenizer.mask_token_id) & attention_mask.bool()).flatten().nonzero().squeeze(1)  # (M,) flat
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
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
    """`BERTForMaskedLM` from a model folder, refusing folders without MLM head weights."""
    from bert_kit.config import load_hf_config
    from bert_kit.heads import BERTForMaskedLM
    from bert_kit.hf import load_into, read_state_dict

    state = read_state_dict(folder)
    if not any(k.startswith("cls.predictions.") for k in state):
        raise ValueError(f"{folder} has no MLM head weights (cls.predictions.*): it is an encoder-only "
                         "checkpoint, so its [MASK] predictions would be random")
    model = BERTForMaskedLM(load_hf_config(folder))
    load_into(model, state, source=str(folder))
    return model.to(resolve_device(device)).eval()
