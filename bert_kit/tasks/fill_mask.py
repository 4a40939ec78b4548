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
from typing import Any

import torch
import torch.nn as nn

from bert_kit.checks import positive, resolve_device


@torch.no_grad()
def fill_mask(model: nn.Module, tokenizer: Any, text: str, top_k: int = 5) -> list[list[dict[str, Any]]]:
    """Top-k predictions for every [MASK] in `text`, in order of appearance.

    Returns one list per mask of `top_k` dicts: token (str), token_id (int), score (softmax
    probability over the vocabulary) and sequence (the text with this token filled in).
    """
    positive(integer=True).check("top_k", top_k)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    enc = tokenizer(text, max_length=limit, return_tensors="pt")
    ids = enc["input_ids"]  # (1, T)
    positions = (ids[0] == tokenizer.mask_token_id).nonzero().flatten()  # (M,)
    if positions.numel() == 0:
        mask = tokenizer.convert_ids_to_tokens(tokenizer.mask_token_id)
        raise ValueError(f"no {mask} token in the text {text!r}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = model(ids.to(device), enc["attention_mask"].to(device), enc["token_type_ids"].to(device))
    model.train(was_training)
    logits = out[0] if isinstance(out, tuple) else out  # (1, T, V)
    probs = logits[0, positions.to(device)].float().softmax(dim=-1).cpu()  # (M, V)
    scores, top_ids = probs.topk(min(top_k, probs.shape[-1]), dim=-1)  # (M, k)
    results = []
    for m, pos in enumerate(positions.tolist()):
        row = []
        for score, tid in zip(scores[m].tolist(), top_ids[m].tolist()):
            filled = ids[0].clone()
            filled[pos] = tid
            row.append({"token": tokenizer.convert_ids_to_tokens(tid), "token_id": tid, "score": score,
                        "sequence": tokenizer.decode(filled.tolist())})
        results.append(row)
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
