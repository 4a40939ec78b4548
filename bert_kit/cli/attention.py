"""`bert-kit attention`: a PNG grid of every layer's and head's attention map.

    bert-kit attention --model runs/demo/pretrain --text "anna lives in paris." --text-pair "she is a baker."

Rows are layers, columns heads; in each map row i is what token i (the query) attends to and
column j how much token j (the key) is attended to. The title names the model and the texts;
the colour bar gives the probability scale, the same for every map.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from bert_kit.checks import ConfigError
from bert_kit.cli.errors import check_output_file
from bert_kit.outputs import write_file
from bert_kit.cli.options import MAX_LENGTH, add_device_option, add_model_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser, "with its tokenizer")
    parser.add_argument("--text", required=True, help="the text to show attention for")
    parser.add_argument("--text-pair", default=None, help="optional second segment ([SEP]-separated pair)")
    parser.add_argument("--output", default="attention.png", help="PNG to write (default ./attention.png)")
    parser.add_argument("--layers", default=None, help="layers to draw, e.g. 0,5 or 0-2 (default: all)")
    parser.add_argument("--heads", default=None, help="heads to draw, e.g. 0-3 (default: all)")
    parser.add_argument("--max-length", type=MAX_LENGTH, default=None,
                        help="longer texts are truncated (default: the model's positions)")
    parser.add_argument("--save-npy", default=None, help="also write the (L, nh, T, T) probabilities here")
    add_device_option(parser)


def run(args: argparse.Namespace) -> int:
    from bert_kit.model import BERTModel
    from bert_kit.model_folder import resolve_model
    from bert_kit.tokenizer import get_tokenizer
    from bert_kit.training.precision import resolve_device
    from bert_kit.visualize import _parse_indices, attention_maps, attention_title, plot_attention_grid

    if not args.text.strip():
        raise ConfigError("--text is empty: give the text to show attention for")
    check_output_file(args.output, "--output")
    check_output_file(args.save_npy, "--save-npy")
    if args.save_npy and Path(args.save_npy).absolute() == Path(args.output).absolute():
        raise ConfigError(f"--save-npy {args.save_npy} is also --output: name two files")
    folder = resolve_model(args.model)  # a run folder's model, or a hub name's local copy
    device = resolve_device(args.device or "auto")
    model = BERTModel.from_pretrained(folder).to(device)
    tokenizer = get_tokenizer(folder)
    enc = tokenizer(args.text, args.text_pair, max_length=args.max_length or model.config.max_length)
    enc = {k: v.to(device) for k, v in enc.items()}
    _, attentions = attention_maps(model, enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    att = attentions[:, 0].cpu()  # (L, nh, T, T) of the one text
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist())
    layers = _parse_indices(args.layers, att.shape[0], "layers")
    heads = _parse_indices(args.heads, att.shape[1], "heads")
    title = attention_title(str(args.model), args.text, args.text_pair)
    path = plot_attention_grid(att, tokens, args.output, layers, heads, title=title)
    if args.save_npy:
        write_file(args.save_npy, lambda f: np.save(f, att.numpy()), binary=True)
    print(f"wrote {path}: {len(layers)} layers x {len(heads)} heads over {len(tokens)} tokens")
    return 0
