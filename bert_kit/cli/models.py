"""`bert-kit models`: the model presets (fresh weights of a known shape) and the hub models
that have a local copy, i.e. every name `model=` and `--model` accept besides a folder, each
with its family (config.json's model_type: bert, roberta, xlm-roberta, distilbert, modernbert).

    bert-kit models            # a table of presets, then the local copies found
    bert-kit models --json     # the same as JSON
"""

from __future__ import annotations

import argparse
import json


def preset_table() -> list[dict]:
    """One row per preset, BERT's then ModernBERT's: name, family, layers, hidden size, heads,
    parameters (with the preset's vocabulary: BERT's 30,522, ModernBERT's 50,368)."""
    from bert_kit.config import config_from_name, preset_names

    rows, seen = [], {}
    for name in preset_names():
        config = config_from_name(name)
        key = (config.model_type, config.num_hidden_layers, config.hidden_size, config.num_attention_heads)
        if key in seen:  # an alias such as bert-base for "bert-base-uncased (110M)"
            seen[key]["aliases"].append(name)
            continue
        seen[key] = {"name": name, "family": config.model_type, "layers": key[1], "hidden": key[2], "heads": key[3],
                     "parameters": config.num_parameters(), "aliases": []}
        rows.append(seen[key])
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def family(folder) -> str:
    """config.json's model_type ("bert", "roberta", ...), with a note when bert-kit does not build it."""
    from bert_kit.config import FAMILIES

    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type") or "bert"
    except (OSError, ValueError, AttributeError):
        return "unreadable config.json"
    return model_type if model_type in FAMILIES else f"{model_type}: not built by bert-kit"


def run(args: argparse.Namespace) -> int:
    from bert_kit.model_folder import hf_cache_dir, local_models

    presets = preset_table()
    local = [{"name": name, "folder": str(folder), "family": family(folder)} for name, folder in local_models()]
    if args.json:
        print(json.dumps({"presets": presets, "local_copies": local}, indent=2))
        return 0
    print("presets (fresh weights of this shape; pretrain model=NAME, or a config's model: NAME):")
    for r in presets:
        aliases = f"  (also {', '.join(r['aliases'])})" if r["aliases"] else ""
        print(f"  {r['name']:<26} {r['family']:<11} {r['layers']:>2} layers, hidden {r['hidden']:>4}, "
              f"{r['heads']:>2} heads, {r['parameters'] / 1e6:6.1f}M parameters{aliases}")
    print(f"local copies of hub models (pretrained weights; model=NAME or --model NAME), "
          f"from installed packages and {hf_cache_dir()}:")
    for r in local:
        print(f"  {r['name']:<45} {r['family']:<12} {r['folder']}")
    if not local:
        print("  none: `huggingface-cli download NAME` makes one, or pass a model folder")
    return 0
