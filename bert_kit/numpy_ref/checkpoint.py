"""Weight exchange in the HF BERT format: ``config.json`` + ``model.safetensors`` with HF names.

The NumPy layers use short readable names (``encoder.layers.0.attention_norm.weight``); HF uses
``encoder.layer.0.attention.output.LayerNorm.weight``. The mapping is one literal table per part,
used as is for import and inverted for export. Linear weights are (out, in) on both sides, so no
tensor is transposed. The MLM decoder is tied to the word embeddings: it is written only once, as
``bert.embeddings.word_embeddings.weight`` (HF re-ties it on load).

A pretraining checkpoint has the ``bert.`` prefix and ``cls.*`` heads; a base one (like MiniLM)
has neither. Both load into either model class: a base model ignores the heads, a pretraining
model loading a base checkpoint needs ``strict=False`` and keeps its freshly initialised heads.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"

# Our module name -> HF module name. Modules here have a .weight; LayerNorm/Linear also a .bias.
EMBEDDING_TABLES = {
    "embeddings.word_embeddings": "embeddings.word_embeddings",
    "embeddings.position_embeddings": "embeddings.position_embeddings",
    "embeddings.token_type_embeddings": "embeddings.token_type_embeddings",
}
BASE_MODULES = {
    "embeddings.norm": "embeddings.LayerNorm",
    "pooler.dense": "pooler.dense",
}
LAYER_MODULES = {  # inside encoder.layers.{i} / encoder.layer.{i}
    "attention.query": "attention.self.query",
    "attention.key": "attention.self.key",
    "attention.value": "attention.self.value",
    "attention.output": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "ffn.dense_in": "intermediate.dense",
    "ffn.dense_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
HEAD_PARAMS = {
    "mlm_head.transform.weight": "cls.predictions.transform.dense.weight",
    "mlm_head.transform.bias": "cls.predictions.transform.dense.bias",
    "mlm_head.norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "mlm_head.norm.bias": "cls.predictions.transform.LayerNorm.bias",
    "mlm_head.bias": "cls.predictions.bias",
    "nsp_head.dense.weight": "cls.seq_relationship.weight",
    "nsp_head.dense.bias": "cls.seq_relationship.bias",
}
# HF keys that carry no information for us: buffers and the tied copies of the decoder.
SKIPPED_HF_KEYS = ("embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")

# Our constructor argument -> HF config key.
CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "dim_model": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "dim_ff": "intermediate_size",
    "activation": "hidden_act",
    "max_seq_len": "max_position_embeddings",
    "num_segment_types": "type_vocab_size",
    "eps": "layer_norm_eps",
}
OPTIONAL_CONFIG_KEYS = ("layer_norm_eps", "type_vocab_size")  # HF defaults apply when absent
POSITION_TYPES = {"learned": "absolute", "sinusoidal": "sinusoidal"}  # ours -> HF value


def hf_name_map(num_layers: int, pretraining: bool) -> dict[str, str]:
    """Our parameter name -> HF tensor name, for a base or a pretraining model."""
    names = {f"{ours}.weight": f"{hf}.weight" for ours, hf in EMBEDDING_TABLES.items()}
    for ours, hf in BASE_MODULES.items():
        names.update({f"{ours}.{p}": f"{hf}.{p}" for p in ("weight", "bias")})
    for i in range(num_layers):
        for ours, hf in LAYER_MODULES.items():
            names.update({f"encoder.layers.{i}.{ours}.{p}": f"encoder.layer.{i}.{hf}.{p}"
                          for p in ("weight", "bias")})
    if not pretraining:
        return names
    names = {f"bert.{ours}": f"bert.{hf}" for ours, hf in names.items()}
    names.update(HEAD_PARAMS)
    return names


def _is_pretraining(model) -> bool:
    return hasattr(model, "bert")  # BertModel wraps the base model; BertBaseModel does not


def to_hf_config(config: dict, pretraining: bool, dtype) -> dict:
    """Our constructor settings -> an HF ``config.json`` dict."""
    hf = {hf_key: config[ours] for ours, hf_key in CONFIG_KEYS.items()}
    hf.update(
        model_type="bert",
        architectures=["BertForPreTraining" if pretraining else "BertModel"],
        position_embedding_type=POSITION_TYPES[config["position_embedding"]],
        pad_token_id=0,
        initializer_range=0.02,
        tie_word_embeddings=True,
        dtype=np.dtype(dtype).name,
    )
    return hf


def read_config(folder: str | Path) -> dict:
    """Read ``folder/config.json`` (HF keys) -> our constructor keyword arguments."""
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in {folder}")
    try:
        hf = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON: {err}") from None
    if hf.get("model_type", "bert") != "bert":
        raise ValueError(f"{path}: model_type is {hf['model_type']!r}, expected 'bert'")
    missing = [key for key in CONFIG_KEYS.values() if key not in hf and key not in OPTIONAL_CONFIG_KEYS]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    config = {ours: hf[key] for ours, key in CONFIG_KEYS.items() if key in hf}
    if config["activation"] not in ("gelu", "relu"):
        raise ValueError(f"{path}: hidden_act {config['activation']!r} is not supported (gelu, relu)")
    position_type = hf.get("position_embedding_type", "absolute")
    by_hf = {hf_value: ours for ours, hf_value in POSITION_TYPES.items()} | {"learned": "learned"}
    if position_type not in by_hf:
        raise ValueError(f"{path}: position_embedding_type {position_type!r} is not supported ({sorted(by_hf)})")
    config["position_embedding"] = by_hf[position_type]
    return config


def state_dict(model) -> dict[str, np.ndarray]:
    """All tensors under their HF names (the fixed sinusoidal table included, so HF can load it)."""
    names = hf_name_map(model.config["num_layers"], _is_pretraining(model))
    tensors = {names[ours]: np.ascontiguousarray(p) for ours, p in model.named_parameters()}
    base = model.bert if _is_pretraining(model) else model
    if base.embeddings.position_embedding == "sinusoidal":
        prefix = "bert." if _is_pretraining(model) else ""
        tensors[f"{prefix}embeddings.position_embeddings.weight"] = base.embeddings.position_table().copy()
    return tensors


def save_pretrained(model, folder: str | Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` into ``folder`` (created if needed)."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf_config = to_hf_config(model.config, _is_pretraining(model), model.dtype)
    (folder / CONFIG_NAME).write_text(json.dumps(hf_config, indent=2) + "\n")
    # "pt" is the format tag transformers expects; the layout is identical for NumPy arrays.
    save_file(state_dict(model), str(folder / WEIGHTS_NAME), metadata={"format": "pt"})


def _normalise_keys(tensors: dict[str, np.ndarray], pretraining: bool) -> dict[str, np.ndarray]:
    """Bring a base or pretraining checkpoint to the key layout of the model being loaded."""
    has_prefix = any(key.startswith("bert.") for key in tensors)
    out = {}
    for key, value in tensors.items():
        if any(key.endswith(skip) for skip in SKIPPED_HF_KEYS):
            continue
        if pretraining and not has_prefix and not key.startswith("cls."):
            key = f"bert.{key}"  # base checkpoint into a pretraining model
        elif not pretraining and key.startswith("bert."):
            key = key[len("bert."):]  # pretraining checkpoint into a base model
        out[key] = value
    return out


def load_state_dict(model, tensors: dict[str, np.ndarray], strict: bool = True, source: str = "checkpoint") -> None:
    """Copy HF-named ``tensors`` into ``model`` in place (tied references stay valid)."""
    pretraining = _is_pretraining(model)
    tensors = _normalise_keys(tensors, pretraining)
    params = dict(model.named_parameters())
    # A sinusoidal model has no position parameter: the map keeps only what the model owns.
    names = {ours: hf for ours, hf in hf_name_map(model.config["num_layers"], pretraining).items() if ours in params}
    missing = [hf for hf in names.values() if hf not in tensors]
    heads_only = all(hf.startswith("cls.") for hf in missing)
    if missing and (strict or not heads_only):
        raise KeyError(f"{source}: missing tensors {missing}")
    if missing:
        logger.warning("%s: no weights for %s; keeping their initial values", source, missing)
    # Tensors we do not use: other task heads, or a learned table when positions are sinusoidal.
    unexpected = sorted(set(tensors) - set(names.values()))
    if unexpected:
        logger.info("%s: ignoring tensors %s", source, unexpected)
    for ours, hf in names.items():
        if hf not in tensors:
            continue
        param, value = params[ours], tensors[hf]
        if param.shape != value.shape:
            raise ValueError(f"{source}: {hf} has shape {value.shape}, model expects {param.shape}")
        param[...] = value.astype(param.dtype)


def load_weights(model, folder: str | Path, strict: bool = True) -> None:
    """Load ``folder/model.safetensors`` into ``model``."""
    from safetensors.numpy import load_file

    path = Path(folder) / WEIGHTS_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {folder}")
    load_state_dict(model, load_file(str(path)), strict=strict, source=str(path))
