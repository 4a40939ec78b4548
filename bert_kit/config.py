"""Model configuration: one dataclass, presets, YAML and HF `config.json` in and out.

This module imports without torch, so tools can read and validate configs cheaply.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

# HF `config.json` keys that carry no architecture information; accepted and dropped on import.
_HF_IGNORED_KEYS = {
    "architectures", "model_type", "transformers_version", "_name_or_path", "gradient_checkpointing",
    "use_cache", "classifier_dropout", "torch_dtype", "dtype", "id2label", "label2id", "num_labels",
    "problem_type", "output_past", "bos_token_id", "eos_token_id", "directionality", "pooler_fc_size",
    "pooler_num_attention_heads", "pooler_num_fc_layers", "pooler_size_per_head", "pooler_type",
    "is_decoder", "add_cross_attention", "tie_word_embeddings", "chunk_size_feed_forward",
    "finetuning_task", "tokenizer_class", "prefix", "sep_token_id", "decoder_start_token_id",
    "task_specific_params", "return_dict", "output_hidden_states", "output_attentions",
    "torchscript", "bert_kit",
}
_ACTIVATIONS = ("gelu", "relu")
_POSITION_TYPES = ("learned", "sinusoidal")


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder; field names follow HF `BertConfig`."""

    vocab_size: int = 30522  # WordPiece vocabulary size
    hidden_size: int = 768  # width of every residual stream vector
    num_hidden_layers: int = 12  # number of encoder blocks
    num_attention_heads: int = 12  # heads per attention layer; must divide hidden_size
    intermediate_size: int = 3072  # feed-forward inner width (4 x hidden in BERT)
    hidden_act: str = "gelu"  # "gelu" (exact erf form, as BERT) or "relu"
    hidden_dropout_prob: float = 0.1  # dropout on embeddings and sub-layer outputs
    attention_probs_dropout_prob: float = 0.1  # dropout on attention probabilities
    max_position_embeddings: int = 512  # longest sequence the position table covers
    type_vocab_size: int = 2  # number of segment ids (sentence A / B)
    layer_norm_eps: float = 1e-12  # BERT's LayerNorm epsilon (smaller than the usual 1e-5)
    initializer_range: float = 0.02  # std of the normal init of weights
    pad_token_id: int = 0  # padding id; its embedding row is zero-initialised
    position_embedding_type: str = "learned"  # "learned" table or fixed "sinusoidal"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {_ACTIVATIONS}, got {self.hidden_act!r}")
        if self.position_embedding_type == "absolute":  # HF's name for the learned table
            self.position_embedding_type = "learned"
        if self.position_embedding_type not in _POSITION_TYPES:
            raise ValueError(f"position_embedding_type must be one of {_POSITION_TYPES}, "
                             f"got {self.position_embedding_type!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {p!r}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id ({self.pad_token_id}) must be in [0, vocab_size={self.vocab_size})")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be positive, got {self.layer_norm_eps}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config") -> "BertConfig":
        """Build from a plain dict; an unknown key is named together with the valid ones."""
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - valid)
        if unknown:
            raise ValueError(f"{source}: unknown config key(s) {unknown}; valid keys: {sorted(valid)}")
        return cls(**d)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> "BertConfig":
        """Build from an HF `config.json` dict, dropping keys that do not shape the model."""
        if d.get("model_type", "bert") != "bert":
            raise ValueError(f"{source}: model_type is {d.get('model_type')!r}, expected 'bert'")
        kept = {k: v for k, v in d.items() if k not in _HF_IGNORED_KEYS}
        if (d.get("bert_kit") or {}).get("position_embedding_type") == "sinusoidal":
            kept["position_embedding_type"] = "sinusoidal"  # marker written by `to_hf_dict`
        if kept.get("hidden_act") == "gelu_new":
            raise ValueError(f"{source}: hidden_act 'gelu_new' (tanh approximation) is not supported; use 'gelu'")
        return cls.from_dict(kept, source)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> "BertConfig":
        """A preset by name (see `PRESETS`), with optional field overrides."""
        key = name.strip()
        if key not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; known presets: {list(PRESETS)}")
        return cls.from_dict({**PRESETS[key], **overrides}, source=f"preset {name!r}")

    @classmethod
    def from_file(cls, path: str | Path) -> "BertConfig":
        """Read a YAML or JSON file, or a folder holding `config.json`. HF configs are recognised."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            try:
                d = yaml.safe_load(text) or {}
            except yaml.YAMLError as e:
                raise ValueError(f"{path}: invalid YAML: {e}") from None
        else:
            try:
                d = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None
        if not isinstance(d, dict):
            raise ValueError(f"{path}: expected a mapping of config keys, got {type(d).__name__}")
        if "preset" in d:  # YAML may start from a preset and override fields
            preset = d.pop("preset")
            return cls.from_name(preset, **d)
        if "model_type" in d or "architectures" in d:
            return cls.from_hf_dict(d, source=str(path))
        return cls.from_dict(d, source=str(path))

    # ---- export -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` dict that `transformers.BertConfig` reads."""
        d = self.to_dict()
        if d["position_embedding_type"] == "learned":
            d["position_embedding_type"] = "absolute"
        else:  # HF has no sinusoidal BERT: keep our marker so bert-kit reads it back
            d["bert_kit"] = {"position_embedding_type": "sinusoidal"}
            d["position_embedding_type"] = "absolute"
        return {"model_type": "bert", "architectures": ["BertModel"], **d}

    def save(self, path: str | Path) -> Path:
        """Write HF-style `config.json` (into `path` if it is a folder) or YAML (for .yaml/.yml)."""
        path = Path(path)
        if path.suffix in (".yaml", ".yml"):
            import yaml

            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
            return path
        if path.suffix != ".json":
            path.mkdir(parents=True, exist_ok=True)
            path = path / "config.json"
        path.write_text(json.dumps(self.to_hf_dict(), indent=2) + "\n")
        return path


def _size(layers: int, hidden: int, heads: int | None = None) -> dict[str, int]:
    return {"num_hidden_layers": layers, "hidden_size": hidden,
            "num_attention_heads": heads or max(1, hidden // 64), "intermediate_size": 4 * hidden}


# Google's BERT sizes (Turc et al. 2019 for the small ones) plus the 4/256/4 teaching default.
PRESETS: dict[str, dict[str, Any]] = {
    "bert-tiny": _size(2, 128),
    "bert-mini": _size(4, 256),
    "bert-small": _size(4, 512),
    "bert-medium": _size(8, 512),
    "bert-base-uncased (110M)": _size(12, 768),
    "bert-large-uncased (340M)": _size(24, 1024, 16),
    "bert-teaching": _size(4, 256, 4),
}
# Short aliases people type on the command line.
PRESETS["bert-base"] = PRESETS["bert-base-uncased"] = PRESETS["bert-base-uncased (110M)"]
PRESETS["bert-large"] = PRESETS["bert-large-uncased"] = PRESETS["bert-large-uncased (340M)"]


def create_model_config(name: str, **overrides: Any) -> BertConfig:
    """The 001 API: `create_model_config("bert-base-uncased (110M)")` -> BertConfig."""
    return BertConfig.from_name(name, **overrides)


def load_hf_config(folder: str | Path) -> BertConfig:
    """Read `config.json` from an HF or bert-kit model folder."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in model folder {folder}")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None
    return BertConfig.from_hf_dict(d, source=str(path))
