"""ModernBERT's configuration: one dataclass with HF `ModernBertConfig`'s field names, presets, and
HF `config.json` in and out (what it shares with `BertConfig` is `bert_kit.config_base.ConfigBase`).
Imports without torch, as `bert_kit.config`.

The hub holds two forms of the same settings, and both are read:
- newer transformers: `layer_types` (one "full_attention" or "sliding_attention" per layer) and
  `rope_parameters` ({"full_attention": {"rope_theta": ...}, "sliding_attention": {...}});
- older: `global_attn_every_n_layers` (layer i is global when i % n == 0), `global_rope_theta`,
  `local_rope_theta`.
`to_hf_dict` writes the newer form, and the older keys beside it when the layers follow the
every-n pattern, so transformers 4.x reads the folder too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_kit.checks import ConfigError, UnsupportedModelError, fraction, non_negative, positive, read_json
from bert_kit.config_base import ConfigBase

LAYER_TYPES = ("full_attention", "sliding_attention")
ACTIVATIONS = ("gelu", "gelu_pytorch_tanh", "gelu_new", "relu", "silu")  # HF ACT2FN names bert-kit implements
# older config.json keys, read into layer_types / rope_parameters
_LEGACY_KEYS = ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta")
# keys that do not shape the outputs: training switches, kernel choices, bookkeeping
_IGNORED_KEYS = {
    "architectures", "model_type", "transformers_version", "_name_or_path", "torch_dtype", "dtype",
    "label2id", "num_labels", "problem_type", "gradient_checkpointing", "deterministic_flash_attn",
    "reference_compile", "repad_logits_with_grad", "sparse_prediction", "sparse_pred_ignore_index",
    "layer_norm_eps", "position_embedding_type", "use_cache", "finetuning_task", "tokenizer_class", "return_dict",
    "output_hidden_states",
    "output_attentions", "torchscript", "bert_kit", "tie_word_embeddings", "is_decoder", "add_cross_attention",
    "initializer_cutoff_factor", "chunk_size_feed_forward",
}
_RULES = {
    **{name: positive(integer=True) for name in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "max_position_embeddings", "local_attention")},
    "norm_eps": positive(),
    "initializer_range": positive(),
    "pad_token_id": non_negative(integer=True),
    **{name: fraction(high_open=True) for name in ("attention_dropout", "embedding_dropout", "mlp_dropout",
                                                   "classifier_dropout")},
}


@dataclass
class ModernBertConfig(ConfigBase):
    """Hyper-parameters of a ModernBERT encoder; field names follow HF `ModernBertConfig`."""

    vocab_size: int = 50368  # BPE vocabulary (50,280 tokens padded to a multiple of 64)
    hidden_size: int = 768  # width of the residual stream
    intermediate_size: int = 1152  # GeGLU inner width: Wi projects to 2x this (input and gate)
    num_hidden_layers: int = 22
    num_attention_heads: int = 12  # must divide hidden_size
    hidden_activation: str = "gelu"  # GeGLU's activation (exact erf GELU)
    max_position_embeddings: int = 8192  # longest input (rotary positions: no table)
    initializer_range: float = 0.02
    norm_eps: float = 1e-5  # LayerNorm epsilon
    norm_bias: bool = False  # LayerNorms without a bias
    pad_token_id: int = 50283
    # the ids of [CLS], [SEP] (bos, eos): written back for transformers; the model does not read them
    cls_token_id: int | None = 50281
    sep_token_id: int | None = 50282
    bos_token_id: int | None = 50281
    eos_token_id: int | None = 50282
    attention_bias: bool = False  # Wqkv and Wo without biases
    attention_dropout: float = 0.0  # on attention probabilities and on the attention output
    layer_types: list[str] | None = None  # per layer: "full_attention" or "sliding_attention"; None: every 3rd global
    rope_parameters: dict[str, dict] | None = None  # rotary theta per layer type; None: 160,000 global, 10,000 local
    local_attention: int = 128  # sliding window, in total: a token sees local_attention // 2 on each side
    embedding_dropout: float = 0.0
    mlp_bias: bool = False  # Wi and Wo of the GeGLU without biases
    mlp_dropout: float = 0.0
    decoder_bias: bool = True  # the MLM decoder's bias
    classifier_pooling: str = "cls"  # sequence classification pools "cls" (first token) or "mean"
    classifier_dropout: float = 0.0  # before the heads' classifier
    classifier_bias: bool = False  # the heads' dense layer (dense, act, norm) without a bias
    classifier_activation: str = "gelu"  # the heads' activation
    id2label: dict[int, str] | None = None  # a classifier's label name per output (HF's id2label); None: LABEL_i

    def __post_init__(self) -> None:
        self._check_shared(_RULES)
        if self.head_dim % 2:
            raise ConfigError(f"head size {self.head_dim} (hidden_size / num_attention_heads) must be even: rotary "
                              "embeddings turn pairs of dimensions")
        for name in ("hidden_activation", "classifier_activation"):
            if getattr(self, name) not in ACTIVATIONS:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not a valid choice: expected one of {ACTIVATIONS}")
        if self.classifier_pooling not in ("cls", "mean"):
            raise ConfigError(f"classifier_pooling={self.classifier_pooling!r} is not a valid choice: expected one of "
                              "('cls', 'mean')")
        if self.layer_types is None:  # HF's default: every third layer global, from the first
            self.layer_types = layer_types_every(3, self.num_hidden_layers)
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - set(LAYER_TYPES):
            raise ConfigError(f"layer_types must name {self.num_hidden_layers} layers (num_hidden_layers), each one of "
                              f"{LAYER_TYPES}; got {self.layer_types}")
        self.rope_parameters = _rope_parameters(self.rope_parameters)

    @property
    def sliding_window(self) -> int:
        """Half the window, as HF: a sliding layer's token sees the keys within this distance."""
        return self.local_attention // 2

    @property
    def max_length(self) -> int:
        return self.max_position_embeddings

    @property
    def model_type(self) -> str:
        return "modernbert"

    def rope_theta(self, layer_type: str) -> float:
        return float(self.rope_parameters[layer_type]["rope_theta"])

    def num_parameters(self) -> int:
        """Parameters of the encoder (`ModernBertModel`), known without building it."""
        H, I, L = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        norm = H * (2 if self.norm_bias else 1)
        attention = 4 * H * H + (4 * H if self.attention_bias else 0)
        mlp = 3 * H * I + (2 * I + H if self.mlp_bias else 0)
        embeddings = self.vocab_size * H + norm
        layers = L * (attention + mlp + 2 * norm) - norm  # the first layer has no attn_norm
        return embeddings + layers + norm  # + final_norm

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config") -> "ModernBertConfig":
        """Build from a plain dict with our field names (the older HF keys are read too)."""
        return cls._build(_from_legacy(dict(d)), source)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> "ModernBertConfig":
        """Build from an HF `config.json` dict, dropping keys that do not shape the model."""
        if d.get("model_type", "modernbert") != "modernbert":
            raise UnsupportedModelError(f"{source}: model_type is {d.get('model_type')!r}, expected 'modernbert'")
        if d.get("tie_word_embeddings") is False:
            raise UnsupportedModelError(f"{source}: tie_word_embeddings: false; bert-kit ties the MLM decoder to the "
                                        "word embeddings, as ModernBERT does")
        if d.get("rope_scaling"):
            raise UnsupportedModelError(f"{source}: rope_scaling {json.dumps(d['rope_scaling'])} is not implemented: "
                                        "bert-kit builds the default rotary embeddings")
        return cls.from_dict({k: v for k, v in d.items() if k not in _IGNORED_KEYS}, source)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> "ModernBertConfig":
        """A preset by name (see `PRESETS`), with optional field overrides."""
        if name not in PRESETS:
            raise ConfigError(f"unknown ModernBERT preset {name!r}; known presets: {list(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides}, source=f"preset {name!r}")

    @classmethod
    def from_file(cls, path: str | Path) -> "ModernBertConfig":
        """Read an HF config.json (or the folder holding one)."""
        path = Path(path)
        return cls.from_hf_dict(read_json(path / "config.json" if path.is_dir() else path), source=str(path))

    # ---- export -------------------------------------------------------------------------------

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` dict that `transformers.ModernBertConfig` reads (4.x and 5.x)."""
        d = self._hf_fields()
        n = next((n for n in range(1, self.num_hidden_layers + 1)
                  if layer_types_every(n, self.num_hidden_layers) == self.layer_types), None)
        if n is not None:  # the older keys, for transformers 4.x
            d.update(global_attn_every_n_layers=n, global_rope_theta=self.rope_theta("full_attention"),
                     local_rope_theta=self.rope_theta("sliding_attention"))
        return {"model_type": "modernbert", "architectures": ["ModernBertModel"], **d, "tie_word_embeddings": True}


def layer_types_every(n: int, num_layers: int) -> list[str]:
    """HF's older pattern: layer i is global when i % n == 0, else a sliding-window layer."""
    return ["sliding_attention" if i % n else "full_attention" for i in range(num_layers)]


def _from_legacy(d: dict[str, Any]) -> dict[str, Any]:
    """global_attn_every_n_layers / global_rope_theta / local_rope_theta -> layer_types / rope_parameters
    (where the newer keys are given too, they win, as in transformers)."""
    every = d.pop("global_attn_every_n_layers", None)
    thetas = {"full_attention": d.pop("global_rope_theta", None), "sliding_attention": d.pop("local_rope_theta", None)}
    if d.get("layer_types") is None and every is not None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ConfigError(f"global_attn_every_n_layers={every!r} is out of range: expected an integer >= 1")
        d["layer_types"] = layer_types_every(every, d.get("num_hidden_layers", 22))
    if any(v is not None for v in thetas.values()):
        rope = {k: dict(v) for k, v in (d.get("rope_parameters") or {}).items()}
        for kind, theta in thetas.items():
            if theta is not None:
                rope.setdefault(kind, {}).setdefault("rope_theta", theta)
        d["rope_parameters"] = rope
    return d


DEFAULT_THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}


def _rope_parameters(given: dict | None) -> dict[str, dict]:
    """rope_parameters completed with HF's default thetas; only the default rotary type is built."""
    if given is not None and not isinstance(given, dict):
        raise ConfigError(f"rope_parameters must map layer types to settings, got {given!r}")
    out = {}
    for kind in LAYER_TYPES:
        params = dict((given or {}).get(kind) or {})
        params.setdefault("rope_type", "default")
        params.setdefault("rope_theta", DEFAULT_THETA[kind])
        if params["rope_type"] != "default":
            raise UnsupportedModelError(f"rope_parameters[{kind!r}]: rope_type {params['rope_type']!r} is not "
                                        "implemented: bert-kit builds the default rotary embeddings")
        theta = params["rope_theta"]
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
            raise ConfigError(f"rope_parameters[{kind!r}]['rope_theta']={theta!r} is out of range: expected a number > 1")
        out[kind] = params
    return out


def _size(layers: int, hidden: int, intermediate: int, heads: int) -> dict[str, int]:
    return {"num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": intermediate,
            "num_attention_heads": heads}


_SMALL_VOCAB = {"vocab_size": 512, "pad_token_id": 0, "cls_token_id": 1, "sep_token_id": 2, "bos_token_id": 1,
               "eos_token_id": 2}
# answerdotai/ModernBERT-base and -large shapes, and small ones for tests
PRESETS: dict[str, dict[str, Any]] = {
    "modernbert-base": _size(22, 768, 1152, 12),
    "modernbert-large": _size(28, 1024, 2624, 16),
    # the 6-minute recipe's (configs/pretrain_cram_modernbert.yaml): bert-small's FLOPs a token, 6 layers
    "modernbert-small": _size(6, 512, 768, 8),
    "modernbert-tiny": {**_size(3, 64, 96, 4), **_SMALL_VOCAB, "max_position_embeddings": 512},
    "modernbert-mini": {**_size(6, 256, 384, 4), **_SMALL_VOCAB, "max_position_embeddings": 1024},
}
