"""The files of a tokenizer folder beside `tokenizer.json`: `vocab.txt` and `tokenizer_config.json`.

HF folders of different families say different things, or nothing: the special tokens' roles
(BERT's [CLS], [SEP], ... or RoBERTa's and XLM-R's <s>, </s>, ...), the longest input
(`model_max_length`, with a huge sentinel for "unknown") and whether the family takes segment
ids (`model_input_names`, else the tokenizer class). This module reads and writes those files and
holds the defaults taken when a folder is silent, so `bert_kit.tokenizer` deals with encoding
only. It needs neither `tokenizers` nor torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bert_kit.checks import read_json, read_text

# role -> default token string; ids always come from the vocabulary
DEFAULT_SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
# the same roles in RoBERTa's and XLM-R's vocabularies (a tokenizer.json without tokenizer_config.json)
ROBERTA_SPECIAL_TOKENS = {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"}
# HF tokenizer classes whose model_input_names leave out token_type_ids
NO_TOKEN_TYPES = ("RobertaTokenizer", "XLMRobertaTokenizer", "DistilBertTokenizer", "CamembertTokenizer")
# BERT's learned position table has 512 rows, so that is the cap when a folder does not say
DEFAULT_MODEL_MAX_LENGTH = 512


# --------------------------------------------------------------------------------- vocab.txt
def read_vocab(path: Path) -> dict[str, int]:
    """vocab.txt -> {token: line index}, exactly as BERT reads it (one token per line)."""
    vocab: dict[str, int] = {}
    lines = read_text(path).split("\n")  # a decode error names the file and line
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last token
    for index, token in enumerate(lines):
        if token in vocab:
            raise ValueError(f"{path}:{index + 1}: token {token!r} already appears on line {vocab[token] + 1}")
        vocab[token] = index
    if not vocab:
        raise ValueError(f"vocab file {path} is empty")
    return vocab


def write_vocab(folder: Path, vocab: dict[str, int], source: str) -> None:
    """Write `folder`/vocab.txt, one token per line in id order; `source` names the tokenizer in
    the error when the ids leave a gap (a line number is an id, so there can be none)."""
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError(f"vocabulary ids of {source} are not contiguous 0..{len(by_id) - 1}")
    (folder / "vocab.txt").write_text("".join(t + "\n" for t, _ in by_id), encoding="utf-8")


# --------------------------------------------------------------------------------- tokenizer_config.json
def read_tokenizer_config(folder: Path) -> dict[str, Any]:
    """`folder`/tokenizer_config.json as a dict; {} when the folder has none."""
    config_file = folder / "tokenizer_config.json"
    if not config_file.is_file():
        return {}
    config = read_json(config_file)  # errors name the file and line
    if not isinstance(config, dict):
        raise ValueError(f"{config_file}: expected a mapping of settings, got {type(config).__name__}")
    return config


def write_tokenizer_config(folder: Path, config: dict[str, Any], token_types: bool) -> None:
    """Write `folder`/tokenizer_config.json; a family without segment ids says so in
    model_input_names, so that `transformers.AutoTokenizer` returns none either."""
    if not token_types:
        config = {**config, "model_input_names": ["input_ids", "attention_mask"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def special_tokens_from_config(config: dict[str, Any], vocab: dict[str, int] | None = None) -> dict[str, str]:
    """Token strings from tokenizer_config.json (plain strings or AddedToken dicts), else BERT's,
    else (when `vocab` lacks BERT's) RoBERTa's <s>, </s>, <pad>, <unk>, <mask>."""
    out = {}
    for role, default in DEFAULT_SPECIAL_TOKENS.items():
        if vocab is not None and default not in vocab and ROBERTA_SPECIAL_TOKENS[role] in vocab:
            default = ROBERTA_SPECIAL_TOKENS[role]
        value = config.get(f"{role}_token", default)
        out[role] = value.get("content", default) if isinstance(value, dict) else str(value or default)
    return out


def max_length_from_config(config: dict[str, Any]) -> int:
    """tokenizer_config.json's model_max_length, else BERT's 512."""
    max_len = config.get("model_max_length")
    # HF writes a huge sentinel when unknown; keep BERT's 512 then
    if not (isinstance(max_len, (int, float)) and 0 < max_len < 1e9):
        return DEFAULT_MODEL_MAX_LENGTH
    return int(max_len)


def uses_token_types(config: dict[str, Any]) -> bool:
    """Whether the family takes segment ids: tokenizer_config's model_input_names, else its class
    (RoBERTa's, XLM-R's and DistilBERT's tokenizers return none)."""
    names = config.get("model_input_names")
    if isinstance(names, list):
        return "token_type_ids" in names
    return config.get("tokenizer_class", "BertTokenizer").removesuffix("Fast") not in NO_TOKEN_TYPES
