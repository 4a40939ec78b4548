"""`bert-kit fill-mask`: top-k predictions for the [MASK] tokens of a text."""

from __future__ import annotations

import argparse
import json
import sys

from bert_kit.tasks.fill_mask import fill_mask, load_mlm_model



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="+", help='text with one or more [MASK] tokens (several texts allowed)')
    parser.add_argument("--model", required=True, help="model folder (config.json + model.safetensors)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model folder)")
    parser.add_argument("--top-k", type=int, default=5, help="predictions per mask (default 5)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from bert_kit.tokenizer import get_tokenizer

    model = load_mlm_model(args.model, args.device)
    tokenizer = get_tokenizer(args.tokenizer or args.model)
    everything = []
    for text in args.text:
        predictions = fill_mask(model, tokenizer, text, args.top_k)
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
