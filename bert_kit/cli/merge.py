"""`bert-kit merge`: a LoRA adapter folder (a LoRA run's best/ or checkpoint) merged into its base
model, written as a plain model folder (config.json + model.safetensors, the tokenizer, the task's
labels and settings) that bert-kit and `transformers` load without peft (bert_kit/lora.py).

    bert-kit merge runs/sst2_lora --output models/sst2-merged
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from bert_kit.checks import ConfigError
from bert_kit.outputs import OutputFolder

SKIPPED = ("adapter_model.safetensors", "adapter_config.json", "config.json", ".bert-kit-files.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("adapter", help="LoRA adapter folder, or the run folder of a LoRA fine-tune")
    parser.add_argument("--output", required=True, help="folder to write the merged model to")


def merge_folder(adapter: str | Path, output: str | Path) -> Path:
    """Write the merged model of `adapter` to `output`; returns the folder."""
    from bert_kit.heads import HEAD_CLASSES
    from bert_kit.lora import is_adapter_folder
    from bert_kit.model_folder import read_model_metadata, resolve_model, write_model_metadata

    src, dst = resolve_model(adapter), Path(output)
    if not is_adapter_folder(src):
        raise ConfigError(f"{src} holds no LoRA adapter (adapter_config.json + adapter_model.safetensors): it is "
                          "a model folder already")
    if src.resolve() == dst.resolve():
        raise ConfigError(f"--output must differ from the adapter folder ({src})")
    out = OutputFolder(dst, "--output", "bert-kit merge")
    meta = read_model_metadata(src)
    architecture = (meta.get("architectures") or ["BertModel"])[0]
    model = HEAD_CLASSES[architecture].from_pretrained(src)  # the base model with the adapter merged in
    extra = {k: v for k, v in meta.items() if k not in ("architectures", "label_names")}
    out.prepare()
    model.save_pretrained(dst)
    if extra:
        write_model_metadata(dst, extra)
    copied = [f.name for f in sorted(src.iterdir()) if f.name not in SKIPPED and not f.name.startswith(".")]
    for name in copied:
        (shutil.copytree if (src / name).is_dir() else shutil.copyfile)(src / name, dst / name)
    out.commit(["config.json", "model.safetensors", *copied])
    return dst


def run(args: argparse.Namespace) -> int:
    folder = merge_folder(args.adapter, args.output)
    print(f"wrote {folder} (the base model with the adapter of {args.adapter} merged in)")
    return 0
