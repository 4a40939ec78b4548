"""HF checkpoint interop: one mapping dict per family from our parameter names to HF's
(`bert_kit.hf_names`: BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ModernBERT), inverted for import.

A model folder (ours or HF's) holds `config.json` and its weights: `model.safetensors`, a legacy
`pytorch_model.bin`, or the shards of either with their index, found, read and checked by
`bert_kit.weight_files`. We always write one safetensors, with the config.json and class name
(`architectures`) of the model's family, so transformers loads it. The only non-renaming step is
the fused QKV projection: BERT, RoBERTa and DistilBERT keep query, key and value apart, so they
are concatenated on import and split on export.

The renaming (`to_hf_state_dict`, `from_hf_state_dict`) works on torch tensors and on NumPy
arrays alike and imports no torch, so the JAX engine (`bert_kit.jax`) maps its weights here too.

Loading checks what would otherwise give silently wrong outputs: a tensor with NaN or inf, or
of integers, is an error naming the file and the tensor (`weight_files.check_finite` and
`check_float`, on tensors from anywhere), an MLM decoder that is not the word embeddings (bert-kit
ties them) is refused, and `from_pretrained` warns (`NewWeightsWarning`) about every weight it
initialises because the folder does not hold it (a new head: random until trained); the weights it
does hold are not drawn at random first (`undrawn_init`).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bert_kit.checks import read_json, writing
from bert_kit.config import BertConfig, architecture_role, hf_architecture, load_hf_config
from bert_kit.hf_names import BERT_HEADS, FAMILY_NAMES, QKV, Names
from bert_kit.weight_files import FiniteTensors, check_finite, check_float, read_state_dict

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

log = logging.getLogger(__name__)


class NewWeightsWarning(UserWarning):
    """`from_pretrained` built weights the folder does not hold (a new head): random until trained."""


# Old TF-converted checkpoints name LayerNorm parameters gamma/beta.
LEGACY = (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias"))
HEAD_PREFIXES = BERT_HEADS  # our head weights' names start with one of these (BERT's family)
LAYER = re.compile(r"\.(\d+)\.")


def names_for(model: Any) -> Names:
    """The names of `model`'s family, with its head's own where HF names a head differently."""
    names = FAMILY_NAMES[getattr(model.config, "model_type", "bert")]
    role = architecture_role(getattr(model, "hf_architecture", "BertModel")).removeprefix("Bert")
    return names.for_head(role)


def _template(name: str) -> tuple[str, str | None]:
    """'encoder.layers.3.ffn.up.weight' -> ('encoder.layers.{i}.ffn.up.weight', '3')."""
    m = LAYER.search(name)
    if m is None:
        return name, None
    return name[: m.start()] + ".{i}." + name[m.end():], m.group(1)


def _rename(name: str, table: dict[str, str]) -> str | None:
    template, i = _template(name)
    target = table.get(template)
    return None if target is None else target.replace("{i}", i or "")


def to_hf_state_dict(model: nn.Module, tensors: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Our state dict (or any tensors named like it, e.g. gradients) -> HF names of the model's family.

    Encoder weights of heads get the family's prefix (`bert.`, `roberta.`, ...), as HF's head classes.
    """
    names = names_for(model)
    has_bert = hasattr(model, "bert")
    out = {}
    for name, tensor in (model.state_dict() if tensors is None else tensors).items():
        if name == names.tied[0]:
            continue  # tied to the word embeddings
        local = name[len("bert."):] if has_bert and name.startswith("bert.") else name
        prefix = names.prefix if has_bert and not local.startswith(names.heads) else ""
        template, i = _template(local)
        if names.qkv and template.startswith("encoder.layers.{i}.attention.qkv."):
            kind = template.rsplit(".", 1)[1]
            n = tensor.shape[0] // 3
            for j, part in enumerate(names.qkv_parts):
                out[prefix + names.qkv.format(i=i, part=part, kind=kind)] = _contiguous(tensor[j * n:(j + 1) * n])
            continue
        hf = _rename(local, names.to_hf)
        if hf is None:
            raise KeyError(f"no HF name for parameter {name!r}; add it to bert_kit.hf_names")
        out[prefix + hf] = _contiguous(tensor)
    table = getattr(_encoder(model), "embeddings", None)
    if tensors is None and getattr(model.config, "model_type", "") == "distilbert" and hasattr(table, "position_table"):
        # DistilBERT stores its fixed sinusoidal table with the weights (bert-kit recomputes it)
        out[(names.prefix if has_bert else "") + "embeddings.position_embeddings.weight"] = table.position_table
    return out


def _encoder(model: Any) -> Any:
    return model.bert if hasattr(model, "bert") else model


def _contiguous(t: Any) -> Any:
    """A torch tensor or NumPy array (the JAX engine's) in one contiguous block, as safetensors wants."""
    return np.ascontiguousarray(t) if isinstance(t, np.ndarray) else t.contiguous()


def from_hf_state_dict(hf: dict[str, torch.Tensor], has_bert: bool,
                       names: Names | None = None) -> tuple[dict[str, torch.Tensor], list[str]]:
    """HF names -> ours (`names`: the family's, `names_for(model)`; default BERT's). Returns (state
    dict, HF keys that map to nothing of ours)."""
    names = names or FAMILY_NAMES["bert"]
    hf = dict(hf)
    for old, new in LEGACY:
        for k in [k for k in hf if k.endswith(old)]:
            hf[k[: -len(old)] + new] = hf.pop(k)
    for alias, name in names.aliases.items():  # e.g. the decoder's bias, stored under a second name
        for p in ("", names.prefix):
            if p + alias in hf:
                hf.setdefault(p + name, hf[p + alias])
                del hf[p + alias]
    skip, qkv_pattern, from_hf = re.compile(names.skip), names.qkv_pattern, names.from_hf
    out, unmapped, qkv = {}, [], {}
    for key, tensor in hf.items():
        local = key[len(names.prefix):] if key.startswith(names.prefix) else key
        if skip.search(key) or local == names.tied[1]:
            continue
        m = qkv_pattern.fullmatch(local) if qkv_pattern else None
        if m:
            qkv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = tensor
            continue
        ours = _rename(local, from_hf)
        if ours is None:
            unmapped.append(key)
            continue
        is_head = ours.startswith(names.heads)
        out[("bert." if has_bert and not is_head else "") + ours] = tensor
    for (i, kind), parts in qkv.items():
        if set(parts) != set(names.qkv_parts):
            missing = sorted(set(names.qkv_parts) - set(parts))
            raise KeyError(f"checkpoint layer {i} has no attention {missing} {kind}")
        rows = [parts[p] for p in names.qkv_parts]
        if isinstance(rows[0], np.ndarray):
            fused = np.concatenate(rows, axis=0)
        else:
            import torch

            fused = torch.cat(rows, dim=0)
        out[("bert." if has_bert else "") + QKV.format(i=i, kind=kind)] = fused
    return out, unmapped


def check_decoder_tied(hf_state: dict[str, Any], source: str, names: Names | None = None) -> None:
    """Refuse an MLM decoder stored apart from the word embeddings (tie_word_embeddings: false):
    bert-kit ties them, so its predictions would differ. Torch tensors or NumPy arrays."""
    names = names or FAMILY_NAMES["bert"]
    embeddings = names.to_hf["embeddings.word_embeddings.weight"]
    tied = hf_state.get(names.prefix + embeddings, hf_state.get(embeddings))
    decoder = hf_state.get(names.tied[1])
    if decoder is None or tied is None:
        return
    if isinstance(decoder, np.ndarray):
        same = np.array_equal(decoder, tied)
    else:
        import torch

        same = torch.equal(decoder, tied)
    if not same:
        raise ValueError(f"{source}: its MLM decoder ({names.tied[1]}) is not the word embeddings "
                         "(tie_word_embeddings: false); bert-kit ties them, so its predictions would differ")


def load_into(model: nn.Module, hf_state: dict[str, torch.Tensor], source: str = "checkpoint",
              strict: bool = False) -> list[str]:
    """Copy HF-named tensors into `model`; returns the names of freshly initialised head weights.

    Missing backbone weights, unknown keys and shape mismatches raise one error listing all of
    them. Missing head weights (a new classifier on a pretrained encoder) are allowed unless
    strict; keys of other heads (e.g. `cls.*` when fine-tuning) are dropped.
    """
    if not isinstance(hf_state, FiniteTensors):  # tensors from elsewhere than read_state_dict
        check_finite(hf_state, source)
        check_float(hf_state, source)
    names = names_for(model)
    own = {k: v for k, v in model.state_dict().items() if k != names.tied[0]}
    if names.tied[0] in model.state_dict():
        check_decoder_tied(hf_state, source, names)
    state, unmapped = from_hf_state_dict(hf_state, hasattr(model, "bert"), names)
    problems = _check_sinusoidal_table(model, state)
    for k in sorted(set(state) & set(own)):
        if state[k].shape != own[k].shape:
            problems.append(f"  shape mismatch {k}: checkpoint {tuple(state[k].shape)}, model {tuple(own[k].shape)}")
    missing = sorted(set(own) - set(state))
    new_heads = [k for k in missing if k.startswith(names.heads)]
    missing_core = [k for k in missing if k not in new_heads or strict]
    unexpected = sorted(set(state) - set(own))
    other_heads = [] if strict else [k for k in unexpected if k.startswith(names.heads)]
    unexpected = [k for k in unexpected if k not in other_heads] + unmapped
    problems += [f"  missing {k} {tuple(own[k].shape)}" for k in missing_core]
    problems += [f"  unexpected {k}" for k in unexpected]
    if problems:
        raise ValueError(f"{source} does not match {type(model).__name__}:\n" + "\n".join(problems))
    model.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    if other_heads:
        log.info("%s: ignored weights of other heads %s", source, other_heads)
    return new_heads


def _check_sinusoidal_table(model: nn.Module, state: dict[str, Any]) -> list[str]:
    """DistilBERT's folders hold its fixed sinusoidal position table, which bert-kit recomputes:
    the stored one is dropped from `state` if it is that table, else reported (a list of problems)."""
    table = getattr(getattr(_encoder(model), "embeddings", None), "position_table", None)
    key = ("bert." if hasattr(model, "bert") else "") + "embeddings.position_embeddings.weight"
    if table is None or key not in state:
        return []
    import torch

    stored = torch.as_tensor(state.pop(key))
    if stored.shape == table.shape and torch.allclose(stored.float(), table.float(), atol=1e-6):
        return []
    return [f"  {key}: the stored position table is not the sinusoidal one of the config (sinusoidal_pos_embds)"]


def _infer_head_args(cls: type, hf_state: dict[str, torch.Tensor], config_dict: dict) -> dict:
    """num_labels from the checkpoint's classifier (or config.json) when the caller gives none."""
    import inspect

    if "num_labels" not in inspect.signature(cls.__init__).parameters:
        return {}
    prefix = FAMILY_NAMES.get(config_dict.get("model_type", "bert"), FAMILY_NAMES["bert"]).prefix
    for key in ("classifier.weight", prefix + "classifier.weight", "classifier.out_proj.weight"):
        if key in hf_state:
            return {"num_labels": hf_state[key].shape[0]}
    if "id2label" in config_dict:
        return {"num_labels": len(config_dict["id2label"])}
    return {}


INIT_FUNCTIONS = ("normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                  "xavier_normal_", "zeros_", "ones_", "constant_")


_undrawn = threading.local()  # .depth: how many `undrawn_init` blocks this thread is inside
_undrawn_lock = threading.Lock()
_undrawn_users: list[int] = [0]  # the blocks open in every thread: the wrappers stay while any is
_undrawn_saved: dict[str, Any] = {}


def _undrawn_wrapper(original: Any) -> Any:
    def init_unless_undrawn(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_undrawn, "depth", 0):
            return tensor
        return original(tensor, *args, **kwargs)

    init_unless_undrawn.undrawn_original = original  # tests/conftest.py knows it by this
    return init_unless_undrawn


@contextmanager
def undrawn_init() -> Iterator[None]:
    """Modules built inside, in this thread, keep their parameters' memory as allocated:
    `torch.nn.init` draws nothing (MiniLM's encoder: 0.5 s of random numbers on a CPU, overwritten
    at once by the loaded weights). Values built without `torch.nn.init` (bert-kit's LayerNorm,
    buffers) stay. Other threads draw as ever: the functions are replaced by wrappers that skip only
    in a thread inside a block (`bert-kit embed` loads its model in a thread; replacing them by
    no-ops for every thread left models built elsewhere meanwhile undrawn, and two loads at once
    could leave the no-ops in place for good). The last block to end puts torch's own back."""
    import torch.nn.init as init

    with _undrawn_lock:
        if _undrawn_users[0] == 0:
            for name in INIT_FUNCTIONS:
                _undrawn_saved[name] = getattr(init, name)
                setattr(init, name, _undrawn_wrapper(_undrawn_saved[name]))
        _undrawn_users[0] += 1
    _undrawn.depth = getattr(_undrawn, "depth", 0) + 1
    try:
        yield
    finally:
        _undrawn.depth -= 1
        with _undrawn_lock:
            _undrawn_users[0] -= 1
            if _undrawn_users[0] == 0:
                for name, function in _undrawn_saved.items():
                    if getattr(getattr(init, name), "undrawn_original", None) is function:  # still ours
                        setattr(init, name, function)
                _undrawn_saved.clear()


def initialise(model: nn.Module, names: list[str]) -> None:
    """BERT's init for the parameters `names` that `undrawn_init` left as allocated: weights of
    linear and embedding layers N(0, initializer_range), their biases zero. Other parameters
    (bert-kit's LayerNorm, the MLM decoder's bias) were built without `torch.nn.init` and hold
    their values. The draws follow the order of `names` (sorted): a seeded run gets the same head."""
    import torch
    import torch.nn as nn

    if hasattr(model, "init_module"):  # an init of its own (ModernBERT's): the top-level modules holding them
        for owner in dict.fromkeys(name.split(".")[0] for name in names):
            model.init_module(owner)
        return
    std = model.config.initializer_range
    with torch.no_grad():
        for name in names:
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner)
            param = getattr(module, leaf)
            if isinstance(module, (nn.Linear, nn.Embedding)) and leaf == "weight":
                param.normal_(0.0, std)
                if getattr(module, "padding_idx", None) is not None:
                    param[module.padding_idx].zero_()
            elif isinstance(module, nn.Linear) and leaf == "bias":
                param.zero_()
            elif type(module).__module__.startswith("torch."):  # its values would come from torch.nn.init
                raise TypeError(f"{name}: no BERT init for a new parameter of {type(module).__name__}")


def from_pretrained(cls: type, folder: str | Path, strict: bool = False, dtype: torch.dtype | None = None,
                    **head_args) -> nn.Module:
    """Build `cls` from an HF or bert-kit folder (see `load_into` for the matching rules), or from
    the local copy of a hub name such as "sentence-transformers/all-MiniLM-L6-v2".

    dtype: parameter dtype to build in (e.g. torch.float64 keeps float64 weights exact).
    The model comes back in eval mode (dropout off), as with `transformers`. Weights the folder
    does not hold (a new head) are initialised at random, with one `NewWeightsWarning` naming them.
    """
    folder = Path(folder)
    if not folder.is_dir():  # a hub name: its local copy (nothing is downloaded)
        from bert_kit.model_folder import resolve_model

        folder = resolve_model(folder)
    config = load_hf_config(folder)
    wanted = getattr(cls, "config_class", BertConfig)
    if not isinstance(config, wanted):
        raise ValueError(f"{folder} holds a {config.model_type} model, which {cls.__name__} is not: load it with "
                         + ("bert_kit.modernbert's classes" if config.model_type == "modernbert" else
                            "bert-kit's BERT classes (BERTModel, BERTForSequenceClassification, ...)"))
    hf_state = read_state_dict(folder)
    config_dict = read_json(folder / "config.json")
    head_args = {**_infer_head_args(cls, hf_state, config_dict), **head_args}
    with undrawn_init():  # the folder's weights replace them: only the new ones are drawn, below
        model = cls(config, **head_args)
    if dtype is not None:
        model = model.to(dtype)
    new = load_into(model, hf_state, source=str(folder), strict=strict)
    initialise(model, new)
    fit_label_names(model)
    if new:
        warnings.warn(f"{cls.__name__}: {', '.join(new)} {'are' if len(new) > 1 else 'is'} newly initialised "
                      f"(not in {folder}): train them before use", NewWeightsWarning, stacklevel=3)
    return model.eval()  # as HF: inference mode until the caller calls .train()


def label_names(model: Any) -> dict[int, str]:
    """The label name of each output of a classifier (any engine's: it has `num_labels` and a
    `BertConfig`): `config.id2label` when it names every output, else LABEL_0, LABEL_1, ..."""
    names = model.config.id2label
    if names and len(names) == model.num_labels:
        return dict(names)
    return {i: f"LABEL_{i}" for i in range(model.num_labels)}


def fit_label_names(model: Any) -> None:
    """After loading: keep config.json's label names only when they name the head's outputs (an
    encoder's LABEL_0/LABEL_1, or a 3-class head's names for a new 5-class head, are dropped)."""
    if hasattr(model, "num_labels") and model.config.id2label and len(model.config.id2label) != model.num_labels:
        model.config.id2label = None


def hf_config(model: nn.Module) -> dict[str, Any]:
    """The config.json of `model`: its family's keys, its HF class name, a classifier's label names."""
    role = architecture_role(getattr(model, "hf_architecture", "BertModel")).removeprefix("Bert")
    config = {**model.config.to_hf_dict(), "architectures": [hf_architecture(model.config.model_type, role)]}
    if hasattr(model, "num_labels"):  # a classifier: every output named, as transformers writes it
        config["id2label"] = {str(i): name for i, name in label_names(model).items()}
        config["label2id"] = {name: int(i) for i, name in config["id2label"].items()}
    return config


def save_pretrained(model: nn.Module, folder: str | Path, tensors: dict[str, np.ndarray] | None = None) -> None:
    """Write `config.json` and `model.safetensors` (atomically) that `transformers` loads.

    tensors: HF-named tensors to write instead of the model's own: NumPy arrays (the JAX engine's
    weights) or torch tensors (a copy taken earlier, the full state of a sharded model)."""
    if tensors is None:
        tensors = to_hf_state_dict(model)
    if all(isinstance(v, np.ndarray) for v in tensors.values()):
        from safetensors.numpy import save_file
    else:
        from safetensors.torch import save_file

        tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = hf_config(model)
    tmp = folder / "model.safetensors.tmp"
    with writing(tmp):  # a full disk names the file
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    from bert_kit.outputs import default_mode

    tmp.chmod(default_mode())  # the safetensors writer creates 0600; a model is as readable as its config.json
    tmp.replace(folder / "model.safetensors")  # rename is atomic: a crash leaves the old file
    with writing(folder / "config.json"):
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
