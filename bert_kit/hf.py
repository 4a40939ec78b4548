"""HF checkpoint interop: one mapping dict from our parameter names to HF's, inverted for export.

A model folder (ours or HF's) holds `config.json` and `model.safetensors` (or a legacy
`pytorch_model.bin`, read with `weights_only=True`). We always write safetensors.
The only non-renaming step is the fused QKV projection: HF keeps query, key and value apart,
so they are concatenated on import and split on export.

The renaming (`to_hf_state_dict`, `from_hf_state_dict`) works on torch tensors and on NumPy
arrays alike and imports no torch, so the JAX engine (`bert_kit.jax`) maps its weights here too.

Loading checks what would otherwise give silently wrong outputs: a tensor with NaN or inf is an
error naming the file and the tensor, an MLM decoder that is not the word embeddings (bert-kit
ties them) is refused, and `from_pretrained` warns (`NewWeightsWarning`) about every weight it
initialises because the folder does not hold it (a new head: random until trained).
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bert_kit.checks import CorruptFileError, read_json, writing
from bert_kit.config import load_hf_config

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

log = logging.getLogger(__name__)


class NewWeightsWarning(UserWarning):
    """`from_pretrained` built weights the folder does not hold (a new head): random until trained."""


class FiniteTensors(dict):
    """Tensors `read_state_dict` read and found finite (`load_into` need not check them again)."""

# our name -> HF name; "{i}" stands for the layer index. Names under the `bert.` prefix in heads.
TO_HF = {
    "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
    "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
    "embeddings.norm.weight": "embeddings.LayerNorm.weight",
    "embeddings.norm.bias": "embeddings.LayerNorm.bias",
    "encoder.layers.{i}.attention.out.weight": "encoder.layer.{i}.attention.output.dense.weight",
    "encoder.layers.{i}.attention.out.bias": "encoder.layer.{i}.attention.output.dense.bias",
    "encoder.layers.{i}.attention_norm.weight": "encoder.layer.{i}.attention.output.LayerNorm.weight",
    "encoder.layers.{i}.attention_norm.bias": "encoder.layer.{i}.attention.output.LayerNorm.bias",
    "encoder.layers.{i}.ffn.up.weight": "encoder.layer.{i}.intermediate.dense.weight",
    "encoder.layers.{i}.ffn.up.bias": "encoder.layer.{i}.intermediate.dense.bias",
    "encoder.layers.{i}.ffn.down.weight": "encoder.layer.{i}.output.dense.weight",
    "encoder.layers.{i}.ffn.down.bias": "encoder.layer.{i}.output.dense.bias",
    "encoder.layers.{i}.ffn_norm.weight": "encoder.layer.{i}.output.LayerNorm.weight",
    "encoder.layers.{i}.ffn_norm.bias": "encoder.layer.{i}.output.LayerNorm.bias",
    "pooler.dense.weight": "pooler.dense.weight",
    "pooler.dense.bias": "pooler.dense.bias",
    # heads (top level of the head classes)
    "mlm.dense.weight": "cls.predictions.transform.dense.weight",
    "mlm.dense.bias": "cls.predictions.transform.dense.bias",
    "mlm.norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "mlm.norm.bias": "cls.predictions.transform.LayerNorm.bias",
    "mlm.decoder.bias": "cls.predictions.bias",
    "nsp.weight": "cls.seq_relationship.weight",
    "nsp.bias": "cls.seq_relationship.bias",
    "classifier.weight": "classifier.weight",
    "classifier.bias": "classifier.bias",
    "qa_outputs.weight": "qa_outputs.weight",
    "qa_outputs.bias": "qa_outputs.bias",
}
FROM_HF = {v: k for k, v in TO_HF.items()}
QKV = "encoder.layers.{i}.attention.qkv.{kind}"  # kind: weight | bias
HF_QKV = "encoder.layer.{i}.attention.self.{part}.{kind}"  # part: query | key | value
# HF keys that carry no weights of ours: buffers, and the decoder weight tied to the embeddings.
HF_SKIP = re.compile(r"(^|\.)(position_ids|cls\.predictions\.decoder\.(weight|bias))$")
# Old TF-converted checkpoints name LayerNorm parameters gamma/beta.
LEGACY = (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias"))
HEAD_PREFIXES = ("mlm.", "nsp.", "classifier.", "qa_outputs.")
LAYER = re.compile(r"\.(\d+)\.")


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
    """Our state dict (or any tensors named like it, e.g. gradients) -> HF names.

    Heads get the `bert.` prefix, as HF's head classes.
    """
    has_bert = hasattr(model, "bert")
    out = {}
    for name, tensor in (model.state_dict() if tensors is None else tensors).items():
        if name == "mlm.decoder.weight":
            continue  # tied to the word embeddings
        local = name[len("bert."):] if has_bert and name.startswith("bert.") else name
        template, i = _template(local)
        if template.startswith("encoder.layers.{i}.attention.qkv."):
            kind = template.rsplit(".", 1)[1]
            n = tensor.shape[0] // 3
            for j, part in enumerate(("query", "key", "value")):
                key = HF_QKV.format(i=i, part=part, kind=kind)
                out[("bert." if has_bert else "") + key] = _contiguous(tensor[j * n:(j + 1) * n])
            continue
        hf = _rename(local, TO_HF)
        if hf is None:
            raise KeyError(f"no HF name for parameter {name!r}; add it to bert_kit.hf.TO_HF")
        prefix = "bert." if has_bert and not local.startswith(HEAD_PREFIXES) else ""
        out[prefix + hf] = _contiguous(tensor)
    return out


def _contiguous(t: Any) -> Any:
    """A torch tensor or NumPy array (the JAX engine's) in one contiguous block, as safetensors wants."""
    return np.ascontiguousarray(t) if isinstance(t, np.ndarray) else t.contiguous()


def from_hf_state_dict(hf: dict[str, torch.Tensor], has_bert: bool) -> tuple[dict[str, torch.Tensor], list[str]]:
    """HF names -> ours. Returns (state dict, HF keys that map to nothing of ours)."""
    hf = dict(hf)
    for old, new in LEGACY:
        for k in [k for k in hf if k.endswith(old)]:
            hf[k[: -len(old)] + new] = hf.pop(k)
    if "cls.predictions.bias" not in hf and "cls.predictions.decoder.bias" in hf:
        hf["cls.predictions.bias"] = hf["cls.predictions.decoder.bias"]
    out, unmapped, qkv = {}, [], {}
    for key, tensor in hf.items():
        if HF_SKIP.search(key):
            continue
        local = key[len("bert."):] if key.startswith("bert.") else key
        m = re.fullmatch(r"encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)", local)
        if m:
            qkv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = tensor
            continue
        ours = _rename(local, FROM_HF)
        if ours is None:
            unmapped.append(key)
            continue
        is_head = ours.startswith(HEAD_PREFIXES)
        out[("bert." if has_bert and not is_head else "") + ours] = tensor
    for (i, kind), parts in qkv.items():
        if set(parts) != {"query", "key", "value"}:
            missing = sorted({"query", "key", "value"} - set(parts))
            raise KeyError(f"checkpoint layer {i} has no attention.self.{missing} {kind}")
        rows = [parts["query"], parts["key"], parts["value"]]
        if isinstance(rows[0], np.ndarray):
            fused = np.concatenate(rows, axis=0)
        else:
            import torch

            fused = torch.cat(rows, dim=0)
        out[("bert." if has_bert else "") + QKV.format(i=i, kind=kind)] = fused
    return out, unmapped


def read_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of `model.safetensors` (preferred) or `pytorch_model.bin` in `folder`.

    A truncated, empty or garbage file raises CorruptFileError naming it; a pickle that holds
    anything but tensors and plain data is refused (never unpickled)."""
    file = weights_file(folder)
    if file.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(file))
        except SafetensorError as e:  # a bad header, or a file shorter than its header says
            raise CorruptFileError(f"{file} is not a readable safetensors file ({_first_line(e)}): it is truncated "
                                   "or corrupt; copy or save the model again") from None
    else:
        tensors = load_torch_file(file)
    if not isinstance(tensors, dict):
        raise CorruptFileError(f"{file} holds a {type(tensors).__name__}, not a state dict of named tensors")
    check_finite(tensors, str(file))
    return FiniteTensors(tensors)


def check_finite(tensors: dict[str, Any], source: str) -> None:
    """Raise CorruptFileError naming `source` and the first tensor holding NaN or inf.

    One sum per tensor (NaN and inf propagate into it); only a sum that is not finite, which a
    float16 sum can also be by overflowing, is confirmed element by element. Torch tensors or
    NumPy arrays (the JAX engine's)."""
    for name, t in tensors.items():
        if isinstance(t, np.ndarray):  # the JAX engine's arrays
            if t.dtype.kind != "f" or not t.size or np.isfinite(t.sum()) or np.isfinite(t).all():
                continue
            bad, size = int((~np.isfinite(t)).sum()), t.size
        else:
            import torch

            if not (torch.is_tensor(t) and t.is_floating_point() and t.numel()):
                continue
            if torch.isfinite(t.sum()) or bool(torch.isfinite(t).all()):
                continue
            bad, size = int((~torch.isfinite(t)).sum()), t.numel()
        raise CorruptFileError(f"{source}: tensor {name} holds {bad} NaN or infinite value(s) of {size}: "
                               "these weights cannot give meaningful outputs (a run that diverged?); use an "
                               "earlier checkpoint, or save the model again")


def weights_file(folder: str | Path) -> Path:
    """`model.safetensors` (preferred) or `pytorch_model.bin` of a model folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder not found: {folder}")
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {folder}")


def check_weights_file(folder: str | Path) -> None:
    """Cheap check that a folder's weights can be read: the safetensors header (which must cover
    the whole file) or a memory-mapped torch load. Raises CorruptFileError naming the file."""
    file = weights_file(folder)
    if file.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(file), framework="pt"):
                pass
        except SafetensorError as e:
            raise CorruptFileError(f"{file} is not a readable safetensors file ({_first_line(e)}): it is truncated "
                                   "or corrupt") from None
    else:
        load_torch_file(file, mmap=True)


def load_torch_file(file: str | Path, mmap: bool = False) -> Any:
    """`torch.load(file, weights_only=True)` on the CPU, with errors that name the file.

    weights_only refuses pickles that would build arbitrary Python objects (and so could run
    code); such a file is reported as not a safe checkpoint. mmap: map tensor data instead of
    reading it (a cheap check that the file is whole)."""
    import pickle

    import zipfile

    file = Path(file)
    if file.stat().st_size == 0:
        raise CorruptFileError(f"{file} is empty: it was not written completely")
    is_zip = zipfile.is_zipfile(file)
    with open(file, "rb") as f:
        head = f.read(4)
    if not is_zip and head == b"PK\x03\x04":  # torch.save writes a zip, whose index comes last
        raise CorruptFileError(f"{file} is truncated: its zip archive has no end (it was not written completely)")
    if not is_zip and head[:1] != b"\x80":  # legacy files start with a pickle opcode
        raise CorruptFileError(f"{file} is truncated or corrupt: it is neither a PyTorch (zip) file nor a pickle")
    mmap = mmap and is_zip  # a legacy (pickle) file cannot be mapped: read it
    import torch

    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        # torch's message is paragraphs of advice around the reason ("Unsupported GLOBAL posix.system")
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", str(e)) if p.strip()]
        reasons = [p for p in paragraphs[1:] if not p.startswith(("Check the documentation", "Please file"))]
        detail = reasons[0].splitlines()[0] if reasons else _first_line(e)
        raise CorruptFileError(f"{file} is not a safe checkpoint: it holds Python objects other than tensors and "
                               f"plain data, which bert-kit refuses to unpickle ({detail})") from None
    except (RuntimeError, EOFError, ValueError, OSError, IndexError, KeyError) as e:
        raise CorruptFileError(f"{file} is truncated or corrupt: it cannot be read as a PyTorch file "
                               f"({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    """The first sentence of an error message (torch's go on for lines of advice)."""
    text = str(e).strip()
    first = text.splitlines()[0].split(". ")[0].rstrip(".") if text else type(e).__name__
    return first if len(first) <= 160 else first[:157] + "..."


def check_decoder_tied(hf_state: dict[str, Any], source: str) -> None:
    """Refuse an MLM decoder stored apart from the word embeddings (tie_word_embeddings: false):
    bert-kit ties them, so its predictions would differ. Torch tensors or NumPy arrays."""
    tied = hf_state.get("bert.embeddings.word_embeddings.weight", hf_state.get("embeddings.word_embeddings.weight"))
    decoder = hf_state.get("cls.predictions.decoder.weight")
    if decoder is None or tied is None:
        return
    if isinstance(decoder, np.ndarray):
        same = np.array_equal(decoder, tied)
    else:
        import torch

        same = torch.equal(decoder, tied)
    if not same:
        raise ValueError(f"{source}: its MLM decoder (cls.predictions.decoder.weight) is not the word embeddings "
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
    if hasattr(model, "mlm"):
        check_decoder_tied(hf_state, source)
    state, unmapped = from_hf_state_dict(hf_state, hasattr(model, "bert"))
    own = {k: v for k, v in model.state_dict().items() if k != "mlm.decoder.weight"}
    problems = []
    for k in sorted(set(state) & set(own)):
        if state[k].shape != own[k].shape:
            problems.append(f"  shape mismatch {k}: checkpoint {tuple(state[k].shape)}, model {tuple(own[k].shape)}")
    missing = sorted(set(own) - set(state))
    new_heads = [k for k in missing if k.startswith(HEAD_PREFIXES)]
    missing_core = [k for k in missing if k not in new_heads or strict]
    unexpected = sorted(set(state) - set(own))
    other_heads = [] if strict else [k for k in unexpected if k.startswith(HEAD_PREFIXES)]
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


def _infer_head_args(cls: type, hf_state: dict[str, torch.Tensor], config_dict: dict) -> dict:
    """num_labels from the checkpoint's classifier (or config.json) when the caller gives none."""
    import inspect

    if "num_labels" not in inspect.signature(cls.__init__).parameters:
        return {}
    for key in ("classifier.weight", "bert.classifier.weight"):
        if key in hf_state:
            return {"num_labels": hf_state[key].shape[0]}
    if "id2label" in config_dict:
        return {"num_labels": len(config_dict["id2label"])}
    return {}


INIT_FUNCTIONS = ("normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                  "xavier_normal_", "zeros_", "ones_", "constant_")


@contextmanager
def undrawn_init() -> Iterator[None]:
    """Modules built inside keep their parameters' memory as allocated: `torch.nn.init` draws
    nothing (MiniLM's encoder: 0.5 s of random numbers on a CPU, overwritten at once by the
    loaded weights). Values built without `torch.nn.init` (bert-kit's LayerNorm, buffers) stay."""
    import torch.nn.init as init

    saved = {name: getattr(init, name) for name in INIT_FUNCTIONS}
    for name in INIT_FUNCTIONS:
        setattr(init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(init, name, function)


def initialise(model: nn.Module, names: list[str]) -> None:
    """BERT's init for the parameters `names` that `undrawn_init` left as allocated: weights of
    linear and embedding layers N(0, initializer_range), their biases zero. Other parameters
    (bert-kit's LayerNorm, the MLM decoder's bias) were built without `torch.nn.init` and hold
    their values. The draws follow the order of `names` (sorted): a seeded run gets the same head."""
    import torch
    import torch.nn as nn

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
    config = {**model.config.to_hf_dict(), "architectures": [getattr(model, "hf_architecture", "BertModel")]}
    if hasattr(model, "num_labels"):  # a classifier: every output named, as transformers writes it
        config["id2label"] = {str(i): name for i, name in label_names(model).items()}
        config["label2id"] = {name: int(i) for i, name in config["id2label"].items()}
    tmp = folder / "model.safetensors.tmp"
    with writing(tmp):  # a full disk names the file
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    from bert_kit.outputs import default_mode

    tmp.chmod(default_mode())  # the safetensors writer creates 0600; a model is as readable as its config.json
    tmp.replace(folder / "model.safetensors")  # rename is atomic: a crash leaves the old file
    with writing(folder / "config.json"):
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
