"""`bert-kit fill-mask`: top-k predictions for the [MASK] tokens of a text.

Every text is checked before the model loads: 1 to 16 [MASK] tokens within the model's positions
(`bert_kit.tasks.fill_mask.encode_masked`), and --top-k from 1 to the vocabulary size.
"""

from __future__ import annotations

import argparse
import json
import sys

from bert_kit.cli.options import COUNT, add_device_option, add_model_option
from bert_kit.tasks.fill_mask import MAX_MASKS, check_top_k, encode_masked, fill_masks, load_mlm_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="+",
                        help=f"text with 1 to {MAX_MASKS} [MASK] tokens (several texts allowed)")
    add_model_option(parser, "with MLM head weights")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model folder)")
    parser.add_argument("--top-k", type=COUNT, default=5, help="predictions per mask (default 5)")
    add_device_option(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from bert_kit.config import load_hf_config
    from bert_kit.model_folder import resolve_model
    from bert_kit.tokenizer import get_tokenizer
    from bert_kit.checks import resolve_device

    folder = resolve_model(args.model)  # a run folder's final/, or a hub name's local copy
    tokenizer = get_tokenizer(args.tokenizer or folder)
    config = load_hf_config(folder)
    rows = [encode_masked(tokenizer, text, config.max_length) for text in args.text]  # before the model
    check_top_k(args.top_k, config.vocab_size)
    model = load_mlm_model(folder, resolve_device(args.device or "auto"))
    everything = []
    for text, predictions in zip(args.text, fill_masks(model, tokenizer, rows, args.top_k)):
        everything.append({"text": text, "predictions": predictions})
        if args.json:
            continue
        print(text)
        for m, row in enumerate(predictions, start=1):
            print(f"  mask {m}:")
            for p in row:
                print(f"    {p['score']:.4f}  {p['token']:<16} {p['sequence']}")
    if args.json:
        json.dump(everything if len(everything) > 1 else everything[0], sys.stdout, indent=2)
        print()
    return 0
