"""Weights of the JAX engine in and out of model folders, through the one HF mapping of `bert_kit/hf.py`.

The NNX modules carry the torch model's parameter names, so a parameter's path in the NNX state
(`encoder.layers.0.ffn.up.kernel`) becomes the torch name (`encoder.layers.0.ffn.up.weight`) by one
rule, and `hf.py` maps that to HF's name. The one non-renaming step on this side: `nnx.Linear`
keeps its kernel as (in, out) where torch and HF keep (out, in), so kernels are transposed here,
and only here. Arrays are read (`bert_kit.weight_files.read_state_dict(as_numpy=True)`) and
written as NumPy (safetensors), without torch; a legacy `pytorch_model.bin` is read through torch.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import warnings
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from bert_kit.checks import read_json
from bert_kit.config import load_hf_config
from bert_kit.hf import (HEAD_PREFIXES, NewWeightsWarning, _infer_head_args, check_decoder_tied, fit_label_names,
                         from_hf_state_dict, to_hf_state_dict)
from bert_kit.hf import save_pretrained as save_hf_folder
from bert_kit.weight_files import read_state_dict

log = logging.getLogger(__name__)

# the NNX leaf name -> the torch one, and whether the array is transposed on the way
LEAF_NAMES = {"kernel": ("weight", True), "embedding": ("weight", False)}
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def torch_name(path: tuple) -> tuple[str, bool]:
    """An NNX state path -> (the torch parameter name, whether the array is transposed).

    ('bert', 'encoder', 'layers', 0, 'ffn', 'up', 'kernel') -> ('bert.encoder.layers.0.ffn.up.weight', True)
    """
    *parents, leaf = (str(p) for p in path)
    leaf, transposed = LEAF_NAMES.get(leaf, (leaf, False))
    return ".".join([*parents, leaf]), transposed


def torch_state_dict(model: nnx.Module, state: nnx.State | None = None) -> dict[str, np.ndarray]:
    """The model's parameters (or `state`, e.g. gradients, shaped as them) as NumPy arrays under
    torch's names and in torch's layout."""
    state = nnx.state(model, nnx.Param) if state is None else state
    out = {}
    for path, value in nnx.to_flat_state(state):
        name, transposed = torch_name(path)
        array = np.asarray(jax.device_get(value.get_value() if isinstance(value, nnx.Variable) else value))
        out[name] = array.T if transposed else array
    return out


def torch_state_dict_names(model: nnx.Module) -> list[str]:
    """The torch names of the model's parameters (of an abstract model too: `nnx.eval_shape`)."""
    return [torch_name(path)[0] for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))]


def load_torch_state_dict(model: nnx.Module, state: dict[str, np.ndarray], source: str = "checkpoint",
                          strict: bool = False, unmapped: list[str] = ()) -> list[str]:
    """Copy torch-named arrays into `model`; returns the names of head weights left as initialised.

    The rules of `bert_kit.hf.load_into`: missing backbone weights, unknown names and shape
    mismatches raise one error listing all of them; missing head weights (a new classifier on a
    pretrained encoder) are allowed unless strict; weights of other heads are dropped.
    unmapped: checkpoint names no parameter of ours answers to (`from_hf_state_dict`), listed too.
    """
    params = nnx.state(model, nnx.Param)
    own = {}  # torch name -> (path, transposed, shape in torch layout)
    for path, value in nnx.to_flat_state(params):
        name, transposed = torch_name(path)
        own[name] = (path, transposed, tuple(reversed(value.shape)) if transposed else tuple(value.shape))
    problems = [f"  shape mismatch {k}: checkpoint {tuple(state[k].shape)}, model {own[k][2]}"
                for k in sorted(set(state) & set(own)) if tuple(state[k].shape) != own[k][2]]
    missing = sorted(set(own) - set(state))
    new_heads = [k for k in missing if k.startswith(HEAD_PREFIXES)]
    missing_core = [k for k in missing if k not in new_heads or strict]
    unexpected = sorted(set(state) - set(own))
    other_heads = [] if strict else [k for k in unexpected if k.startswith(HEAD_PREFIXES)]
    unexpected = [k for k in unexpected if k not in other_heads] + list(unmapped)
    problems += [f"  missing {k} {own[k][2]}" for k in missing_core]
    problems += [f"  unexpected {k}" for k in unexpected]
    if problems:
        raise ValueError(f"{source} does not match {type(model).__name__}:\n" + "\n".join(problems))
    flat = dict(nnx.to_flat_state(params))
    paths, arrays = [], []
    for name, (path, transposed, _) in own.items():
        if name in state:
            array = np.asarray(state[name], dtype=np.float32)
            paths.append(path)
            arrays.append(np.ascontiguousarray(array.T if transposed else array))
    for path, array in zip(paths, jax.device_put(arrays)):  # one transfer call for all (one per array: seconds)
        flat[path].set_value(array)
    nnx.update(model, nnx.from_flat_state(flat))
    if other_heads:
        log.info("%s: ignored weights of other heads %s", source, other_heads)
    return new_heads


def from_pretrained(cls: type, folder: str | Path, strict: bool = False, seed: int = 0, **head_args) -> nnx.Module:
    """Build `cls` (a `bert_kit.jax` model class) from an HF or bert-kit folder, or from the local
    copy of a hub name such as "sentence-transformers/all-MiniLM-L6-v2". Parameters are float32.
    Weights the folder does not hold (a new head) are drawn at random, with one `NewWeightsWarning`."""
    folder = Path(folder)
    if not folder.is_dir():  # a hub name: its local copy (nothing is downloaded)
        from bert_kit.model_folder import resolve_model

        folder = resolve_model(folder)
    config = load_hf_config(folder)
    if config.model_type != "bert":  # the JAX engine builds BERT's details only (positions, segments, pooler)
        raise ValueError(f"{folder} holds a {config.model_type} model: the JAX engine builds BERT models only; "
                         "use the PyTorch engine")
    hf_state = read_state_dict(folder, as_numpy=True)  # safetensors read as NumPy, without torch
    head_args = {**_infer_head_args(cls, hf_state, read_json(folder / "config.json")), **head_args}
    def build() -> nnx.Module:
        return cls(config, rngs=nnx.Rngs(seed), **head_args)

    # shapes only: drawing random weights that the folder replaces costs a compilation per shape
    model = cls.shapes(config, seed, **head_args)
    if hasattr(model, "mlm"):
        check_decoder_tied(hf_state, str(folder))
    state, unmapped = from_hf_state_dict(hf_state, hasattr(model, "bert"))
    if set(torch_state_dict_names(model)) - set(state):  # a new head: its weights are drawn for real
        model = nnx.jit(build)()  # one program draws them all
    new = load_torch_state_dict(model, state, source=str(folder), strict=strict, unmapped=unmapped)
    fit_label_names(model)
    if new:
        warnings.warn(f"{cls.__name__}: {', '.join(new)} {'are' if len(new) > 1 else 'is'} newly initialised "
                      f"(not in {folder}): train them before use", NewWeightsWarning, stacklevel=3)
    return model


def save_pretrained(model: nnx.Module, folder: str | Path, tokenizer: str | Path | None = None) -> None:
    """Write config.json + model.safetensors (HF names, torch layout) that bert-kit's PyTorch side
    and `transformers` load unchanged; copy the tokenizer files of the folder `tokenizer`."""
    save_hf_folder(model, folder, tensors=to_hf_state_dict(model, torch_state_dict(model)))
    if tokenizer is not None:
        source = Path(tokenizer)
        copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
        if not copied:
            raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}) in {source}")
        for name in copied:
            if (source / name).resolve() != (Path(folder) / name).resolve():
                shutil.copyfile(source / name, Path(folder) / name)


def from_torch(torch_model, cls: type) -> nnx.Module:
    """The `bert_kit.jax` twin of a bert-kit PyTorch model (BERTModel or a head), holding a copy of
    its weights (float32): the JAX engine trains what the job built, initialised as torch does.
    `cls`: the twin's class, `bert_kit.jax.HEAD_CLASSES[torch_model.hf_architecture]`."""
    head_args = {}
    if hasattr(torch_model, "num_labels"):  # the classifiers: their size and dropout
        head_args = {"num_labels": torch_model.num_labels, "classifier_dropout": torch_model.dropout.p}
    config = torch_model.config
    rates = trained_dropout(torch_model)  # may differ from the config (pretraining's `dropout`): the twin's too
    if rates is not None:
        config = dataclasses.replace(config, hidden_dropout_prob=rates[0], attention_probs_dropout_prob=rates[1])
    model = cls.shapes(config, **head_args)  # the weights are copied in
    state = {name: p.detach().cpu().float().numpy() for name, p in torch_model.named_parameters()
             if name != "mlm.decoder.weight"}  # the tied decoder is the word embeddings
    load_torch_state_dict(model, state, source=type(torch_model).__name__, strict=True)
    return model


def trained_dropout(torch_model) -> tuple[float, float] | None:
    """(hidden, attention) dropout the torch model's encoder applies (`set_dropout`); None without one."""
    from torch import nn

    from bert_kit.model import BERTModel, MultiHeadAttention

    # the encoder's modules: a head's classifier dropout is not the hidden dropout
    modules = [m for bert in torch_model.modules() if isinstance(bert, BERTModel) for m in bert.modules()]
    hidden = next((m.p for m in modules if isinstance(m, nn.Dropout)), None)
    attention = next((m.attn_dropout for m in modules if isinstance(m, MultiHeadAttention)), None)
    return None if hidden is None or attention is None else (hidden, attention)


def copy_into_torch(state: dict[str, np.ndarray], torch_model) -> None:
    """Write torch-named arrays (`torch_state_dict`) into the parameters of a bert-kit PyTorch model,
    in place: every parameter it has, no other (the tied decoder is the word embeddings)."""
    import torch

    params = dict(torch_model.named_parameters())  # a tied weight appears once
    if set(params) != set(state):
        raise ValueError(f"weights do not match {type(torch_model).__name__}: "
                         f"missing {sorted(set(params) - set(state))}, unexpected {sorted(set(state) - set(params))}")
    with torch.no_grad():
        for name, array in state.items():
            params[name].copy_(torch.from_numpy(np.array(array)))  # a writable copy of a device read-back
