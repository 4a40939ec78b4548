"""What the two model configs share: `BertConfig` (`bert_kit.config`) and `ModernBertConfig`
(`bert_kit.modernbert_config`) subclass `ConfigBase`, which holds no fields, so each config's
dataclass stays one plain list of its HF field names (and `config.json` keeps their order).

Shared here: the checks every encoder makes (label names, numeric ranges, heads dividing the
width, the pad id inside the vocabulary), construction from a dict with unknown keys named, the
label maps, and `config.json` out. Imports without torch, as both configs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from bert_kit.checks import ConfigError, Range, check_settings, label_map


class ConfigBase:
    """Methods of a dataclass config with HF's `vocab_size`, `hidden_size`, `num_attention_heads`,
    `pad_token_id` and `id2label` (a classifier's label name per output; None: LABEL_i)."""

    def _check_shared(self, rules: dict[str, Range]) -> None:
        """The checks of `__post_init__` that both configs make, label names made {output: name}."""
        if self.id2label is not None:
            self.id2label = label_map(self.id2label)
        check_settings(self, rules)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                              f"({self.num_attention_heads})")
        if self.pad_token_id >= self.vocab_size:
            raise ConfigError(f"pad_token_id={self.pad_token_id} is out of range: expected an integer in "
                              f"[0, vocab_size={self.vocab_size})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def label2id(self) -> dict[str, int]:
        """The output of each label name (HF's label2id); empty without label names."""
        return {name: i for i, name in (self.id2label or {}).items()}

    @classmethod
    def _build(cls, d: dict[str, Any], source: str) -> Any:
        """`cls(**d)`; an unknown key is named together with the valid ones, and an error names `source`.
        YAML reads 1e-5 (no dot) and nan as text: numbers written as text become numbers."""
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - valid)
        if unknown:
            raise ConfigError(f"{source}: unknown config key(s) {unknown}; valid keys: {sorted(valid)}")
        numeric = {f.name: f.type for f in fields(cls) if f.type in ("int", "float")}
        d = {k: _number_from_text(v, numeric[k]) if k in numeric and isinstance(v, str) else v for k, v in d.items()}
        try:
            return cls(**d)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """The fields; id2label only when there are label names."""
        d = asdict(self)
        if d["id2label"] is None:
            del d["id2label"]
        return d

    def _hf_fields(self) -> dict[str, Any]:
        """`to_dict` with the label names as `config.json` holds them: id2label keyed by text (as HF
        writes it) and label2id beside it."""
        d = self.to_dict()
        if "id2label" in d:
            d["id2label"] = {str(i): name for i, name in d["id2label"].items()}
            d["label2id"] = self.label2id
        return d

    def save(self, path: str | Path) -> Path:
        """Write HF-style `config.json` (`to_hf_dict`; into `path` if it is a folder)."""
        path = Path(path)
        if path.suffix != ".json":
            path.mkdir(parents=True, exist_ok=True)
            path = path / "config.json"
        path.write_text(json.dumps(self.to_hf_dict(), indent=2) + "\n")
        return path


def _number_from_text(text: str, kind: str) -> Any:
    """"1e-5" -> 1e-05 (float fields), "12" or "1.2e1" -> 12 (int fields); other text is left for the checks."""
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if kind == "int" and number.is_integer() else number if kind == "float" else text
