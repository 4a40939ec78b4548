"""A model folder's weight files: which exist, reading them (safetensors, shards, legacy .bin),
and the checks that refuse NaN/inf/integer tensors.

A folder holds `model.safetensors` (preferred) or a legacy `pytorch_model.bin`, or the shards of
either with their index (`model.safetensors.index.json`, as HF writes a large model):
`weights_files` finds them, `read_state_dict` reads them, `weight_names` names their tensors
(from the headers), and `check_weights_file` is the cheap check that they can be read. A .bin
is read with `weights_only=True`: a pickle that would build Python objects is refused, never
unpickled. Errors name the file (and the tensor at fault): a truncated or garbage file, a shard
missing or from another model, a tensor holding NaN or inf (`check_finite`), or one of integers
(`check_float`: every BERT weight is floating point, and loading would cast it silently).

Tensors come as torch tensors, or as NumPy arrays (`as_numpy`: the JAX engine's, read without
torch). Renaming them to and from HF's names, and loading them into a model, is `bert_kit.hf`'s.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from bert_kit.checks import CorruptFileError, read_json
from bert_kit.hf_names import BUFFERS

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # a model folder's weights, in order of preference
INDEX_SUFFIX = ".index.json"  # model.safetensors.index.json: the shards of a large model, as HF writes it


class FiniteTensors(dict):
    """Tensors `read_state_dict` read and found finite (`bert_kit.hf.load_into` need not check them again)."""


def read_state_dict(folder: str | Path, as_numpy: bool = False) -> dict[str, Any]:
    """Tensors of `model.safetensors` (preferred) or `pytorch_model.bin` in `folder`, or of every
    shard its index names (`weights_files`): torch tensors, or NumPy arrays with `as_numpy` (the
    JAX engine's: safetensors are then read without torch, unless they hold bfloat16, and the
    floating point tensors of those and of a pytorch_model.bin become float32, as NumPy has no
    bfloat16).

    A truncated, empty or garbage file raises CorruptFileError naming it; a pickle that holds
    anything but tensors and plain data is refused (never unpickled); so is a tensor of integers
    (every BERT weight is floating point: loading would cast it silently)."""
    tensors: dict[str, Any] = {}
    files = weights_files(folder)
    for file in files:
        if file.suffix == ".safetensors":
            from safetensors import SafetensorError

            if as_numpy:
                from safetensors.numpy import load_file
            else:
                from safetensors.torch import load_file
            try:
                part = load_file(str(file))
                if as_numpy:  # bfloat16 arrays where ml_dtypes is loaded (JAX loads it): float32, as below
                    part = {k: v.astype("float32") if v.dtype.name == "bfloat16" else v for k, v in part.items()}
            except SafetensorError as e:  # a bad header, or a file shorter than its header says
                raise CorruptFileError(f"{file} is not a readable safetensors file ({_first_line(e)}): it is "
                                       "truncated or corrupt; copy or save the model again") from None
            except TypeError as e:  # NumPy has no bfloat16: through torch, as float32 (a .bin's way)
                if "bfloat16" not in str(e):
                    raise
                from safetensors.torch import load_file as load_torch_tensors

                part = {k: v.float().numpy() if v.is_floating_point() else v.numpy()
                        for k, v in load_torch_tensors(str(file)).items()}
        else:
            part = load_torch_file(file)
            if not isinstance(part, dict):
                raise CorruptFileError(f"{file} holds a {type(part).__name__}, not a state dict of named tensors")
            if as_numpy:
                part = {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in part.items()}
        check_finite(part, str(file))
        check_float(part, str(file))
        tensors.update(part)
    if len(files) > 1:
        check_shards(Path(folder), tensors)
    return FiniteTensors(tensors)


def weights_files(folder: str | Path) -> list[Path]:
    """The weight files of a model folder: `model.safetensors` (preferred) or `pytorch_model.bin`,
    or the shards that `model.safetensors.index.json` (or `pytorch_model.bin.index.json`) names, as
    HF writes a large model. A shard the index names must be a file beside it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder not found: {folder}")
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return [folder / name]
        index = folder / f"{name}{INDEX_SUFFIX}"
        if index.is_file():
            shards = sorted(set(_weight_map(index).values()))
            for shard in shards:
                if Path(shard).name != shard or not shard.endswith(Path(name).suffix):
                    raise CorruptFileError(f"{index}: shard {shard!r} is not a {Path(name).suffix} file beside it")
                if not (folder / shard).is_file():
                    raise FileNotFoundError(f"{index} names the shard {shard}, which is not in {folder}: copy every "
                                            "shard of the model")
            return [folder / shard for shard in shards]
    if (folder / "adapter_config.json").is_file():  # a LoRA adapter: the model is its base with it merged in
        raise FileNotFoundError(f"{folder} holds a LoRA adapter, not a model's weights: load it with from_pretrained, "
                                f"or write the merged model with `bert-kit merge {folder} --output FOLDER`")
    raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {folder} (nor the index of a sharded "
                            f"model, model.safetensors{INDEX_SUFFIX})")


def weights_present(folder: Path) -> bool:
    """Whether `folder` holds a model's weights file (or the index of its shards)."""
    return any((folder / name).is_file() or (folder / f"{name}{INDEX_SUFFIX}").is_file() for name in WEIGHT_FILES)


def _weight_map(index: Path) -> dict[str, str]:
    """The tensor name -> shard file map of an index file."""
    data = read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise CorruptFileError(f"{index}: expected a 'weight_map' of tensor names to shard files")
    return weight_map


def check_shards(folder: Path, tensors: dict[str, Any]) -> None:
    """Every tensor the index names was in the shards, and no shard held a tensor the index omits."""
    name = next(f"{w}{INDEX_SUFFIX}" for w in WEIGHT_FILES if (folder / f"{w}{INDEX_SUFFIX}").is_file())
    weight_map = _weight_map(folder / name)
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise CorruptFileError(f"{folder / name} names {len(missing)} tensor(s) its shards do not hold (first "
                               f"{missing[0]} in {weight_map[missing[0]]}): a shard is from another model or "
                               "incomplete")


def weight_names(folder: str | Path) -> list[str]:
    """The names of the tensors a folder's weights hold, read from the safetensors headers (or an
    index) without loading them; a pytorch_model.bin is loaded."""
    files = weights_files(folder)
    if len(files) > 1:
        return sorted(_weight_map(next(Path(folder) / f"{w}{INDEX_SUFFIX}" for w in WEIGHT_FILES
                                       if (Path(folder) / f"{w}{INDEX_SUFFIX}").is_file())))
    if files[0].suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(files[0]), framework="pt") as f:
            return list(f.keys())
    return list(read_state_dict(folder))


def check_float(tensors: dict[str, Any], source: str) -> None:
    """Raise CorruptFileError naming `source` and the first weight that is not floating point:
    every BERT weight is, and loading integers into a float parameter would cast them silently
    (a quantized checkpoint's int8 codes read as weights). Buffers HF stores (position_ids) pass."""
    for name, t in tensors.items():
        dtype = getattr(t, "dtype", None)
        if dtype is None or re.search(BUFFERS, name):
            continue
        # NumPy arrays (the JAX engine's): bfloat16 is no NumPy float kind, so integers are what is refused
        integers = not t.is_floating_point() if hasattr(t, "is_floating_point") else np.dtype(dtype).kind in "iub"
        if integers:
            raise CorruptFileError(f"{source}: tensor {name} holds {str(dtype).removeprefix('torch.')} values, not "
                                   "floating point: every BERT weight is float (float32, float16 or bfloat16); "
                                   "dequantize or convert the checkpoint first")


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


def check_weights_file(folder: str | Path) -> None:
    """Cheap check that a folder's weights can be read: each safetensors header (which must cover
    the whole file) or a memory-mapped torch load (a LoRA adapter's: its adapter_model.safetensors).
    Raises CorruptFileError naming the file."""
    adapter = Path(folder) / "adapter_model.safetensors"
    for file in [adapter] if adapter.is_file() and not weights_present(Path(folder)) else weights_files(folder):
        if file.suffix == ".safetensors":
            from safetensors import SafetensorError, safe_open

            try:
                with safe_open(str(file), framework="pt"):
                    pass
            except SafetensorError as e:
                raise CorruptFileError(f"{file} is not a readable safetensors file ({_first_line(e)}): it is "
                                       "truncated or corrupt") from None
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
