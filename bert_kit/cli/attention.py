"""`bert-kit attention`: a PNG grid of every layer's and head's attention map."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from bert_kit.checks import ConfigError
from bert_kit.cli.errors import check_output_file
from bert_kit.model import BERTModel
from bert_kit.visualize import _parse_indices, attention_maps, plot_attention_grid



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder (HF or bert-kit) with a tokenizer")
    parser.add_argument("--text", required=True, help="the text to show attention for")
    parser.add_argument("--text-pair", default=None, help="optional second segment ([SEP]-separated pair)")
    parser.add_argument("--output", required=True, help="PNG to write")
    parser.add_argument("--layers", default=None, help="layers to draw, e.g. 0,5 or 0-2 (default: all)")
    parser.add_argument("--heads", default=None, help="heads to draw, e.g. 0-3 (default: all)")
    parser.add_argument("--max-length", type=int, default=128, help="longer texts are truncated")
    parser.add_argument("--save-npy", default=None, help="also write the (L, nh, T, T) probabilities here")


def run(args: argparse.Namespace) -> int:
    from bert_kit.tokenizer import get_tokenizer

    if not args.text.strip():
        raise ConfigError("--text is empty: give the text to show attention for")
    check_output_file(args.output, "--output")
    check_output_file(args.save_npy, "--save-npy")
    model = BERTModel.from_pretrained(args.model)
    tokenizer = get_tokenizer(args.model)
    enc = tokenizer(args.text, args.text_pair, max_length=args.max_length)
    _, attentions = attention_maps(model, enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    att = attentions[:, 0]  # (L, nh, T, T) of the one text
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist())
    layers = _parse_indices(args.layers, att.shape[0], "layers")
    heads = _parse_indices(args.heads, att.shape[1], "heads")
    title = f"{Path(args.model).name}: {args.text[:80]!r}"
    path = plot_attention_grid(att, tokens, args.output, layers, heads, title=title)
    if args.save_npy:
        with open(args.save_npy, "wb") as f:
            np.save(f, att.numpy())
    print(f"wrote {path}: {len(layers)} layers x {len(heads)} heads over {len(tokens)} tokens")
    return 0
