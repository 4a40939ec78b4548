"""Model folders: find the folder a name or path stands for, and the metadata bert-kit keeps in it.

A model folder holds config.json, model.safetensors (or pytorch_model.bin) and the tokenizer
files. A run folder stands for its best/ (fine-tuning) or final/ (pretraining) model, or its
newest checkpoint. A fine-tuned folder records its task in config.json (`bert_kit` key: task,
max_length, similarity_mode, pooling) and its label names in `id2label`, so `evaluate`,
`predict` and `embed` need only the folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bert_kit.checks import CorruptFileError, read_json

_CHECKPOINT = re.compile(r"^step-(\d+)$")


def newest_checkpoint_folder(folder: Path) -> Path | None:
    """The newest complete `step-*` checkpoint in `folder` or `folder/checkpoints` (one with
    trainer_state.pt), without importing the training code."""
    found = []
    for root in (folder, folder / "checkpoints"):
        if root.is_dir():
            for p in root.iterdir():
                m = _CHECKPOINT.match(p.name)
                if m and (p / "trainer_state.pt").is_file():
                    found.append((int(m.group(1)), p))
    return max(found)[1] if found else None


def resolve_model_folder(source: str | Path) -> Path | None:
    """A folder with config.json: the folder itself, its `best/` or `final/`, or its newest checkpoint.

    Returns None when `source` is not a folder (a preset name or a config file)."""
    path = Path(source)
    if not path.is_dir():
        return None
    for candidate in (path, path / "best", path / "final"):
        if (candidate / "config.json").is_file():
            return candidate
    found = newest_checkpoint_folder(path)
    if found is None:
        raise FileNotFoundError(f"{path} holds no config.json (nor best/, final/ or a step-* checkpoint)")
    return found


def locate_model(source: str | Path) -> tuple[str, Path | str]:
    """("folder", path), ("file", path) or ("preset", name); anything else is a FileNotFoundError."""
    from bert_kit.config import PRESETS

    folder = resolve_model_folder(source)
    if folder is not None:
        return "folder", folder
    if Path(source).is_file():
        return "file", Path(source)
    if str(source).strip() in PRESETS:
        return "preset", str(source).strip()
    raise FileNotFoundError(f"model {str(source)!r} is neither a model folder, a config file nor a preset "
                            f"({', '.join(sorted(PRESETS))})")




def model_config(spec: Any) -> Any:
    """The `BertConfig` a run's `model` setting stands for, when it can be known without torch:
    a preset name, a mapping of fields (with an optional `preset`), a config file, or a model
    folder. Returns None for a path that does not exist (yet) or a folder that cannot be read
    (loading it reports why). A bad preset name or bad field values raise ConfigError."""
    from bert_kit.checks import ConfigError
    from bert_kit.config import BertConfig, load_hf_config

    if isinstance(spec, dict):
        fields = dict(spec)
        preset = fields.pop("preset", None)
        try:
            return BertConfig.from_name(preset, **fields) if preset else BertConfig.from_dict(fields, source="model")
        except ConfigError as e:
            raise ConfigError(e if str(e).startswith("model") else f"model: {e}") from None
    if not isinstance(spec, (str, Path)):
        raise ConfigError(f"model={spec!r} must be a preset name, a model folder, a config file or a mapping")
    path = Path(spec)
    try:
        folder = resolve_model_folder(path)
        if folder is not None:
            return load_hf_config(folder)
        if path.is_file():
            return BertConfig.from_file(path)
    except (OSError, ValueError):
        return None  # loading the model names the problem with the folder
    if "/" in str(spec) or path.suffix in (".json", ".yaml", ".yml") or not str(spec).strip():
        return None  # a path that does not exist yet
    from bert_kit.config import PRESETS

    if str(spec).strip() not in PRESETS:
        raise ConfigError(f"model={str(spec)!r} is neither a model folder, a config file nor a preset "
                          f"({', '.join(sorted(PRESETS))})")
    return BertConfig.from_name(str(spec))


def read_model_metadata(folder: str | Path) -> dict[str, Any]:
    """What a fine-tuned folder's config.json says: the `bert_kit` dict plus label names."""
    d = read_json(Path(folder) / "config.json")
    if not isinstance(d, dict):
        raise CorruptFileError(f"{Path(folder) / 'config.json'}: expected a mapping of config keys, got "
                               f"{type(d).__name__}")
    meta = dict(d.get("bert_kit") or {})
    meta["architectures"] = d.get("architectures") or []
    if "id2label" in d:
        meta["label_names"] = [d["id2label"][k] for k in sorted(d["id2label"], key=int)]
    return meta


def write_model_metadata(folder: str | Path, meta: dict[str, Any]) -> None:
    """Merge `meta` into config.json's `bert_kit` dict (ignored by both loaders) and set finetuning_task."""
    path = Path(folder) / "config.json"
    d = json.loads(path.read_text())
    d["bert_kit"] = {**(d.get("bert_kit") or {}), **meta}
    d["finetuning_task"] = meta.get("task")
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(d, indent=2) + "\n")
    tmp.replace(path)


def write_sentence_transformers_files(folder: str | Path, pooling: str, max_length: int) -> None:
    """modules.json and pooling config so `sentence_transformers.SentenceTransformer(folder)`
    loads a bi-encoder with the same pooling and normalisation as `SentenceEncoder`."""
    folder = Path(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_length,
                                                                  "do_lower_case": False}, indent=2) + "\n")
    (folder / "1_Pooling").mkdir(exist_ok=True)
    hidden = json.loads((folder / "config.json").read_text())["hidden_size"]
    pooling_config = {"word_embedding_dimension": hidden, "pooling_mode_cls_token": pooling == "cls",
                      "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
                      "pooling_mode_mean_sqrt_len_tokens": False}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2) + "\n")


def sentence_transformers_settings(folder: Path) -> dict[str, Any]:
    """max_length and pooling from a sentence-transformers folder (all-MiniLM-L6-v2 ships them)."""
    found: dict[str, Any] = {}
    sbert = folder / "sentence_bert_config.json"
    if sbert.is_file():
        found["max_length"] = read_json(sbert).get("max_seq_length")
    pooling = folder / "1_Pooling" / "config.json"
    if pooling.is_file():
        found["pooling"] = "cls" if read_json(pooling).get("pooling_mode_cls_token") else "mean"
    return found
