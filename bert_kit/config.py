"""Model configuration: one dataclass, presets, YAML and HF `config.json` in and out.

`BertConfig` describes BERT and the family members that are BERT with different details, read
from and written to their own HF `config.json` layouts (`model_type`):
- RoBERTa and XLM-RoBERTa: positions numbered from pad_token_id + 1 (`position_offset`), one
  segment id (type_vocab_size 1), no pooler in any head (`pooler: false`);
- DistilBERT: no segment ids (type_vocab_size 0), no pooler, its own key names (dim, n_layers,
  n_heads, hidden_dim, activation, sinusoidal_pos_embds).
ModernBERT is another architecture with its own config (`bert_kit.modernbert_config`);
`load_hf_config` reads either; what both share is `bert_kit.config_base.ConfigBase`. This
module imports without torch, so tools can read and validate configs cheaply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from bert_kit.checks import (ConfigError, CorruptFileError, UnsupportedModelError, fraction, load_yaml, non_negative,
                             positive, read_json, read_text, resolve_plain)
from bert_kit.config_base import ConfigBase

# HF `config.json` keys that carry no architecture information; accepted and dropped on import
# (id2label is kept: a classifier's label names; label2id and num_labels follow from it).
# chunk_size_feed_forward only splits the feed-forward over the sequence to save memory: the
# outputs are the same. tie_word_embeddings: false is checked against the weights (`bert_kit.hf`).
_HF_IGNORED_KEYS = {
    "architectures", "model_type", "transformers_version", "_name_or_path", "gradient_checkpointing",
    "use_cache", "classifier_dropout", "torch_dtype", "dtype", "label2id", "num_labels",
    "problem_type", "output_past", "bos_token_id", "eos_token_id", "directionality", "pooler_fc_size",
    "pooler_num_attention_heads", "pooler_num_fc_layers", "pooler_size_per_head", "pooler_type",
    "is_decoder", "add_cross_attention", "tie_word_embeddings", "chunk_size_feed_forward",
    "finetuning_task", "tokenizer_class", "prefix", "sep_token_id", "decoder_start_token_id",
    "task_specific_params", "return_dict", "output_hidden_states", "output_attentions",
    "torchscript", "bert_kit",
}
# HF keys whose other values build a model bert-kit does not implement: (key, allowed, what it would be)
_HF_REFUSED = (
    ("is_decoder", (False, None), "a decoder (causal self-attention)"),
    ("add_cross_attention", (False, None), "cross-attention layers (an encoder-decoder)"),
    ("position_embedding_type", ("absolute", "learned", "sinusoidal", None),
     "position embeddings other than absolute ones"),
)
# HF's exact GELU under other names
_HF_GELU = {"gelu_python": "gelu"}
# model_type -> the prefix of its HF class names (BertModel, RobertaForMaskedLM, ...): the families
# bert-kit builds. All but ModernBERT are a `BertConfig`.
FAMILIES = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta", "distilbert": "DistilBert",
            "modernbert": "ModernBert"}
BERT_FAMILY = ("bert", "roberta", "xlm-roberta", "distilbert")
# DistilBERT's config.json names -> BertConfig's (DistilBERT keeps LayerNorm eps 1e-12 fixed)
_DISTILBERT_KEYS = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
                    "hidden_dim": "intermediate_size", "dropout": "hidden_dropout_prob",
                    "attention_dropout": "attention_probs_dropout_prob", "activation": "hidden_act"}
# DistilBERT's head dropouts (training only) and flags that change nothing in the outputs
_DISTILBERT_IGNORED = {"qa_dropout", "seq_classif_dropout", "tie_weights_", "output_past"}
_ACTIVATIONS = ("gelu", "relu")
_POSITION_TYPES = ("learned", "sinusoidal")
# what each numeric field may be (checked in __post_init__; see bert_kit/checks.py)
_RULES = {
    **{name: positive(integer=True) for name in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
        "max_position_embeddings")},
    "type_vocab_size": non_negative(integer=True, hint="0: no segment embeddings, as DistilBERT"),
    "position_offset": non_negative(integer=True, optional=True),
    "hidden_dropout_prob": fraction(high_open=True),
    "attention_probs_dropout_prob": fraction(high_open=True),
    "layer_norm_eps": positive(),
    "initializer_range": positive(),
    "pad_token_id": non_negative(integer=True),
}


MAX_PARAMETERS = 2 * 10**10  # 80 GB of fp32 weights: 60x BERT-large, past any encoder trained


def unsupported_family(model_type: Any, source: str) -> UnsupportedModelError:
    """The one-line refusal of a model family bert-kit does not build (t5, gpt2, ...)."""
    return UnsupportedModelError(f"{source}: model_type {model_type!r} is a model family bert-kit does not build; "
                                 f"it builds {', '.join(FAMILIES)}")


def hf_architecture(model_type: str, role: str) -> str:
    """The HF class name of a head of a family: ("roberta", "ForMaskedLM") -> "RobertaForMaskedLM"."""
    return FAMILIES[model_type] + role


def architecture_role(name: str) -> str:
    """An HF class name as bert-kit's BERT class of that role: "RobertaForMaskedLM" -> "BertForMaskedLM",
    so code that asks which head a folder holds reads every family alike. Other names are kept."""
    for prefix in sorted(FAMILIES.values(), key=len, reverse=True):  # ModernBert before Bert
        if name.startswith(prefix) and (name[len(prefix):] == "Model" or name[len(prefix):].startswith("For")):
            return "Bert" + name[len(prefix):]
    return name


@dataclass
class BertConfig(ConfigBase):
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
    # The family member (HF model_type) whose config.json and weight names its folders use, and
    # two details in which the members differ from BERT that no HF config names (None: the family's):
    model_type: str = "bert"  # "bert", "roberta", "xlm-roberta" or "distilbert"
    position_offset: int | None = None  # RoBERTa: positions start at pad_token_id + 1, padding sits at pad_token_id
    pooler: bool | None = None  # BERT's dense + tanh on [CLS]; RoBERTa's and DistilBERT's heads have none
    id2label: dict[int, str] | None = None  # a classifier's label name per output (HF's id2label); None: LABEL_i

    def __post_init__(self) -> None:
        if self.position_embedding_type == "absolute":  # HF's name for the learned table
            self.position_embedding_type = "learned"
        if self.model_type not in BERT_FAMILY:
            raise ConfigError(f"model_type={self.model_type!r} is not a valid choice: expected one of {BERT_FAMILY}"
                              + (" (ModernBERT is a ModernBertConfig)" if self.model_type == "modernbert" else ""))
        roberta = self.model_type in ("roberta", "xlm-roberta")
        if self.position_offset is None:
            self.position_offset = self.pad_token_id + 1 if roberta else 0
        if self.pooler is None:
            self.pooler = self.model_type == "bert"
        self._check_shared(_RULES)
        self._check_family(roberta)
        if self.hidden_act not in _ACTIVATIONS:
            raise ConfigError(f"hidden_act={self.hidden_act!r} is not a valid choice: expected one of {_ACTIVATIONS}")
        if self.position_embedding_type not in _POSITION_TYPES:
            raise ConfigError(f"position_embedding_type={self.position_embedding_type!r} is not a valid choice: "
                              f"expected one of {_POSITION_TYPES}")
        n = self.num_parameters()  # a typo of a few digits would otherwise end in the kernel's OOM killer
        if n > MAX_PARAMETERS:
            raise ConfigError(f"these settings describe a {n:.3g}-parameter encoder (num_hidden_layers="
                              f"{self.num_hidden_layers}, hidden_size={self.hidden_size}, intermediate_size="
                              f"{self.intermediate_size}, vocab_size={self.vocab_size}, max_position_embeddings="
                              f"{self.max_position_embeddings}); bert-kit builds encoders of at most "
                              f"{MAX_PARAMETERS:.0e} parameters: check those sizes".replace("e+10", "e10"))

    def _check_family(self, roberta: bool) -> None:
        """What HF's class of `model_type` computes whatever the config says: the details must agree."""
        where = f"model_type={self.model_type!r}"
        if roberta and self.position_offset != self.pad_token_id + 1:
            raise ConfigError(f"position_offset={self.position_offset} does not fit {where}: RoBERTa numbers "
                              f"positions from pad_token_id + 1 = {self.pad_token_id + 1}")
        if not roberta and self.position_offset:
            raise ConfigError(f"position_offset={self.position_offset} does not fit {where}: positions start at 0")
        if self.pooler != (self.model_type == "bert"):
            raise ConfigError(f"pooler={self.pooler} does not fit {where}: "
                              + ("BERT's heads read the pooler" if self.model_type == "bert" else
                                 "its heads have no pooler"))
        if (self.type_vocab_size == 0) != (self.model_type == "distilbert"):
            raise ConfigError(f"type_vocab_size={self.type_vocab_size} does not fit {where}: "
                              + ("DistilBERT has no segment embeddings (0)" if self.model_type == "distilbert"
                                 else "expected at least 1 segment id"))
        if self.model_type == "distilbert" and self.layer_norm_eps != 1e-12:
            raise ConfigError(f"layer_norm_eps={self.layer_norm_eps} does not fit {where}: DistilBERT's is 1e-12")
        if self.max_length < 1:
            raise ConfigError(f"max_position_embeddings={self.max_position_embeddings} leaves no position past "
                              f"position_offset={self.position_offset}")

    @property
    def max_length(self) -> int:
        """The longest input the position table covers (RoBERTa's 514 rows hold 512 tokens)."""
        return self.max_position_embeddings - (self.position_offset or 0)

    def num_parameters(self) -> int:
        """Parameters of the encoder (`BERTModel`: embeddings, layers, pooler), known without building it."""
        H, I = self.hidden_size, self.intermediate_size
        positions = self.max_position_embeddings if self.position_embedding_type == "learned" else 0
        embeddings = (self.vocab_size + positions + self.type_vocab_size) * H + 2 * H
        layer = 4 * H * H + 4 * H + 2 * H * I + I + H + 4 * H  # attention (qkv, out), feed-forward, 2 LayerNorms
        return embeddings + self.num_hidden_layers * layer + (H * H + H if self.pooler else 0)

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config") -> "BertConfig":
        """Build from a plain dict; an unknown key is named together with the valid ones."""
        return cls._build(d, source)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> "BertConfig":
        """Build from an HF `config.json` dict of BERT, RoBERTa, XLM-RoBERTa or DistilBERT, dropping
        keys that do not shape the model."""
        model_type = d.get("model_type", "bert")
        if model_type not in BERT_FAMILY:
            if model_type == "modernbert":
                raise UnsupportedModelError(f"{source}: model_type 'modernbert' is read by ModernBertConfig")
            raise unsupported_family(model_type, source)
        for key, allowed, what in _HF_REFUSED:
            if d.get(key) not in allowed:
                raise UnsupportedModelError(f"{source}: {key}: {json.dumps(d[key])} makes {what}, which bert-kit "
                                            "does not implement: it builds BERT encoders only")
        if model_type == "distilbert":
            d = {_DISTILBERT_KEYS.get(k, k): v for k, v in d.items() if k not in _DISTILBERT_IGNORED}
            if d.pop("sinusoidal_pos_embds", False):
                d["position_embedding_type"] = "sinusoidal"
            d["type_vocab_size"] = 0
        kept = {k: v for k, v in d.items() if k not in _HF_IGNORED_KEYS}
        kept["model_type"] = model_type
        if (d.get("bert_kit") or {}).get("position_embedding_type") == "sinusoidal":
            kept["position_embedding_type"] = "sinusoidal"  # marker written by `to_hf_dict`
        act = kept.get("hidden_act", "gelu")
        kept["hidden_act"] = _HF_GELU.get(act, act) if isinstance(act, str) else act
        if kept["hidden_act"] not in _ACTIVATIONS:
            raise UnsupportedModelError(f"{source}: hidden_act {act!r} is not supported: bert-kit implements "
                                        "'gelu' (exact erf form) and 'relu'")
        return cls.from_dict(kept, source)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> "BertConfig":
        """A preset by name (see `PRESETS`), with optional field overrides."""
        key = name.strip()
        if key not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; known presets: {list(PRESETS)}")
        return cls.from_dict({**PRESETS[key], **overrides}, source=f"preset {name!r}")

    @classmethod
    def from_file(cls, path: str | Path) -> "BertConfig":
        """Read a YAML or JSON file, or a folder holding `config.json`. HF configs are recognised."""
        path, d = read_config_mapping(path)
        try:
            if "preset" in d:  # YAML may start from a preset and override fields
                preset = d.pop("preset")
                return cls.from_name(preset, **d)
            if "model_type" in d or "architectures" in d:
                return cls.from_hf_dict(d, source=str(path))
            return cls.from_dict(d, source=str(path))
        except ConfigError as e:
            raise ConfigError(e if str(path) in str(e) else f"{path}: {e}") from None

    # ---- export -------------------------------------------------------------------------------

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` dict that transformers' config class of `model_type` reads."""
        d = self._hf_fields()
        for ours in ("model_type", "position_offset", "pooler"):  # implied by the family
            del d[ours]
        architecture = hf_architecture(self.model_type, "Model")
        if self.model_type == "distilbert":
            d["sinusoidal_pos_embds"] = d.pop("position_embedding_type") == "sinusoidal"
            for key in ("type_vocab_size", "layer_norm_eps"):
                del d[key]
            d = {next((k for k, v in _DISTILBERT_KEYS.items() if v == key), key): v for key, v in d.items()}
        elif d["position_embedding_type"] == "learned":
            d["position_embedding_type"] = "absolute"
        else:  # HF has no sinusoidal BERT: keep our marker so bert-kit reads it back
            d["bert_kit"] = {"position_embedding_type": "sinusoidal"}
            d["position_embedding_type"] = "absolute"
        return {"model_type": self.model_type, "architectures": [architecture], **d}

    def save(self, path: str | Path) -> Path:
        """Write HF-style `config.json` (into `path` if it is a folder) or YAML (for .yaml/.yml)."""
        path = Path(path)
        if path.suffix in (".yaml", ".yml"):
            import yaml

            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
            return path
        return super().save(path)


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


def load_hf_config(folder: str | Path) -> Any:
    """Read `config.json` from an HF or bert-kit model folder: a `BertConfig` (BERT, RoBERTa,
    XLM-RoBERTa, DistilBERT) or a `ModernBertConfig`; another family is refused in one line."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in model folder {folder}")
    d = read_json(path)
    if not isinstance(d, dict):
        raise CorruptFileError(f"{path}: expected a mapping of config keys, got {type(d).__name__}")
    try:
        if d.get("model_type") == "modernbert":
            from bert_kit.modernbert_config import ModernBertConfig

            return ModernBertConfig.from_hf_dict(d, source=str(path))
        return BertConfig.from_hf_dict(d, source=str(path))
    except UnsupportedModelError:  # a model of another kind: the wrong model for bert-kit
        raise
    except ConfigError as e:  # values no BERT can have: a broken model folder
        raise CorruptFileError(str(e)) from None


# ---- either architecture: BertConfig or ModernBertConfig, chosen by the preset or model_type ----

def preset_names() -> list[str]:
    """Every preset name: BERT's shapes (`PRESETS`) and ModernBERT's (`modernbert_config.PRESETS`)."""
    from bert_kit.modernbert_config import PRESETS as MODERNBERT_PRESETS

    return [*PRESETS, *MODERNBERT_PRESETS]


def config_from_name(name: str, **overrides: Any) -> Any:
    """The config of a preset of either architecture (modernbert-* are ModernBertConfig), with overrides."""
    from bert_kit.modernbert_config import PRESETS as MODERNBERT_PRESETS, ModernBertConfig

    key = name.strip() if isinstance(name, str) else name
    if key in MODERNBERT_PRESETS:
        return ModernBertConfig.from_name(key, **overrides)
    if key not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; known presets: {preset_names()}")
    return BertConfig.from_name(key, **overrides)


def sized_preset(name: str, tokenizer: Any, **overrides: Any) -> Any:
    """A preset of either architecture sized to `tokenizer`: its vocabulary size, and for ModernBERT
    (whose presets hold the ids of its own BPE vocabulary) the ids of its special tokens; the
    overrides win."""
    from bert_kit.modernbert_config import PRESETS as MODERNBERT_PRESETS

    fields = {"vocab_size": tokenizer.vocab_size}
    if isinstance(name, str) and name.strip() in MODERNBERT_PRESETS:
        ids = {"pad_token_id": "pad_token_id", "cls_token_id": "cls_token_id", "sep_token_id": "sep_token_id",
               "bos_token_id": "cls_token_id", "eos_token_id": "sep_token_id"}  # config field -> tokenizer's
        fields.update({field: getattr(tokenizer, attr) for field, attr in ids.items()
                       if getattr(tokenizer, attr, None) is not None})
    return config_from_name(name, **{**fields, **overrides})


def config_from_dict(d: dict[str, Any], source: str = "model") -> Any:
    """A mapping of config fields with an optional `preset` (whose architecture it takes), or an HF
    `config.json` dict (its model_type says which): a BertConfig or a ModernBertConfig."""
    d = dict(d)
    preset = d.pop("preset", None)
    try:
        if preset:
            return config_from_name(preset, **d)
        if d.get("model_type") == "modernbert":
            from bert_kit.modernbert_config import ModernBertConfig

            return ModernBertConfig.from_hf_dict(d, source)
        if "model_type" in d or "architectures" in d:
            return BertConfig.from_hf_dict(d, source)
        return BertConfig.from_dict(d, source)
    except ConfigError as e:
        raise ConfigError(e if source in str(e) else f"{source}: {e}") from None


def read_config_mapping(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(the file read, its mapping): a YAML or JSON config file, or a folder's `config.json`."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    if path.suffix in (".yaml", ".yml"):  # as run configs are read: duplicate keys and alias bombs refused
        d = resolve_plain(load_yaml(read_text(path), str(path))) or {}
    else:
        d = read_json(path)
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(d).__name__}")
    return path, d


def read_config_file(path: str | Path) -> Any:
    """A YAML or JSON config file, or a folder holding `config.json`, of either architecture
    (`config_from_dict`); HF configs are recognised by their model_type."""
    path, d = read_config_mapping(path)
    return config_from_dict(d, source=str(path))
