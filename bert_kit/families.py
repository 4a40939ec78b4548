"""Which class plays each role for each architecture: the one table the jobs build models from.

A job asks for a role (an encoder, an MLM head, a sequence classifier, ...) on a model source (a
folder, a config file, a preset name, a mapping of fields); the source's config says the
architecture and `CLASSES` the class:

    config              roles                                              classes
    BertConfig          Model, ForPreTraining, ForMaskedLM,                bert_kit.model.BERTModel,
    (BERT, RoBERTa,     ForSequenceClassification, ForTokenClassification, bert_kit.heads.BERTFor...
    XLM-R, DistilBERT)  ForQuestionAnswering
    ModernBertConfig    the same but ForPreTraining (no NSP head)          bert_kit.modernbert.ModernBert...

Roles are HF's class-name suffixes, so a folder's `architectures` entry names its role in every
family (`bert_kit.config.architecture_role`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn as nn

from bert_kit.checks import ConfigError
from bert_kit.config import (BertConfig, architecture_role, config_from_dict, load_hf_config, read_config_file,
                             sized_preset)
from bert_kit.heads import HEAD_CLASSES as BERT_CLASSES
from bert_kit.model_folder import resolve_model
from bert_kit.modernbert import HEAD_CLASSES as MODERNBERT_CLASSES
from bert_kit.modernbert_config import ModernBertConfig

ROLES = ("Model", "ForPreTraining", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
         "ForQuestionAnswering")

# config class -> role -> model class
CLASSES: dict[type, dict[str, type]] = {
    BertConfig: {role: BERT_CLASSES["Bert" + role] for role in ROLES},
    ModernBertConfig: {role: MODERNBERT_CLASSES["ModernBert" + role] for role in ROLES
                       if "ModernBert" + role in MODERNBERT_CLASSES},
}


def model_class(config: Any, role: str) -> type:
    """The class of `role` for a model of `config`: (ModernBertConfig, "ForMaskedLM") -> ModernBertForMaskedLM."""
    classes = CLASSES[type(config)]
    if role not in classes:
        raise ValueError(f"a {config.model_type} model has no {role.removeprefix('For')} head; bert-kit builds "
                         f"{', '.join(classes)} for it")
    return classes[role]


def role_of(model: nn.Module) -> str:
    """The role a model plays ("Model", "ForMaskedLM", ...), whatever its family ("" for another module)."""
    name = getattr(model, "hf_architecture", None)
    return architecture_role(name).removeprefix("Bert") if isinstance(name, str) else ""


def is_encoder(model: nn.Module) -> bool:
    """A bare encoder (`BERTModel`, `ModernBertModel`), not a model with a head."""
    return role_of(model) == "Model"


def encoder_of(model: nn.Module) -> nn.Module:
    """The encoder of a model with a head (its `bert`), or the encoder itself."""
    return model if is_encoder(model) else model.bert


def fresh_config(spec: str | dict | Path, kind: str, tokenizer: Any) -> Any:
    """The config of a fresh model: a preset name ("preset"), a config file ("file") or a mapping
    of fields with an optional preset ("mapping"); a preset, alone or in a mapping, is sized to
    `tokenizer` (fields the mapping sets win)."""
    if kind == "file":
        return read_config_file(spec)
    if kind == "preset":
        spec = {"preset": spec}
    if kind not in ("preset", "mapping") or not isinstance(spec, dict):
        raise ValueError(f"model must be a preset name, a folder, a config file or a mapping, got {spec!r}")
    d = dict(spec)
    preset = d.pop("preset", None)
    if preset:
        try:
            return sized_preset(preset, tokenizer, **d)
        except ConfigError as e:
            raise ConfigError(e if str(e).startswith("model") else f"model: {e}") from None
    d.setdefault("vocab_size", tokenizer.vocab_size)
    return config_from_dict(d, source="model")


def load_model(role: str, folder: str | Path, **kwargs: Any) -> nn.Module:
    """The class of `role` for the folder's architecture, `from_pretrained(folder, **kwargs)`; a hub
    name is its local copy."""
    folder = resolve_model(folder)
    return model_class(load_hf_config(folder), role).from_pretrained(folder, **kwargs)
