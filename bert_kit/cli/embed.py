"""`bert-kit embed`: sentence embeddings of a text file (one text per line) to a .npy array."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from bert_kit.cli.errors import check_output_file
from bert_kit.cli.options import (COUNT, MAX_LENGTH, add_device_option, add_model_option, add_table_options,
                                   flag_messages, name_settings_as_flags)
from bert_kit.data.tables import parse_where, read_texts
from bert_kit.model_folder import resolve_model
from bert_kit.outputs import write_file



def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    parser.add_argument("--input", required=True, help="text file, one text per line (or a table: --text-column)")
    parser.add_argument("--text-column", default=None, help="TSV/CSV/JSONL input: the text column, name or 0-based index")
    add_table_options(parser, rows="embed only rows with this value")
    parser.add_argument("--output", required=True, help="where to write the (n, hidden) float32 .npy array")
    parser.add_argument("--pooling", choices=("mean", "cls"), default="mean", help="mean of tokens or [CLS] state")
    parser.add_argument("--no-normalize", action="store_true", help="keep raw vectors (default: unit length)")
    parser.add_argument("--max-length", type=MAX_LENGTH, default=None,
                        help="tokens per text, longer ones are truncated (default: the model's own length: its "
                             "fine-tuning or sentence-transformers length, else its positions)")
    parser.add_argument("--batch-size", type=COUNT, default=None,
                        help="at most this many texts a batch (default: as many as --max-tokens-per-batch holds)")
    parser.add_argument("--max-tokens-per-batch", type=COUNT, default=None,
                        help="padded tokens a batch, texts x the longest (default: sized for the device, "
                             "131072 on a GPU, 8192 on the CPU)")
    add_device_option(parser)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                        help="auto: bf16 autocast on a GPU that has it (fp16 on older ones), fp32 on the CPU")
    parser.add_argument("--compile", action="store_true",
                        help="compile the encoder first (a one-off ~10 s; about 2x faster on the CPU after)")
    parser.add_argument("--backend", choices=("auto", "torch", "onnx"), default="auto",
                        help="onnx: ONNX Runtime on the CPU (a folder from bert-kit export, or one exported now); "
                             "auto: onnx for exported folders, else torch")
    name_settings_as_flags(parser)


@flag_messages
def run(args: argparse.Namespace) -> int:
    check_output_file(args.output, "--output", inputs=[args.input])
    texts = read_texts(args.input, args.text_column, args.header, args.delimiter, parse_where(args.where),
                       args.encoding)
    folder = resolve_model(args.model)  # a run folder's model, or a hub name's local copy
    from bert_kit.checks import resolve_device  # torch: after the input was read
    from bert_kit.data.truncation import find_truncated, report_truncated
    from bert_kit.embeddings import SentenceEncoder
    from bert_kit.onnx_export import onnx_folder
    from bert_kit.tasks.inference import warn_blank_texts
    from bert_kit.training.precision import start_cuda

    start_cuda(resolve_device(args.device))  # the driver and context start while the model loads
    encoder = SentenceEncoder.from_pretrained(onnx_folder(folder, args.backend) or folder, args.pooling,
                                              not args.no_normalize, args.max_length, args.device,
                                              compile=args.compile, precision=args.precision,
                                              max_tokens_per_batch=args.max_tokens_per_batch)
    print(f"embedding on {encoder.device} in {encoder.precision}, batches of {encoder.max_tokens_per_batch} tokens",
          flush=True)
    warn_blank_texts(texts, args.input, tokenizer=encoder.tokenizer)  # blank, or only control characters
    kept = list(map(len, encoder.tokenize(texts)))  # tokens per text as truncated: the cut ones fill max_length
    found = find_truncated(encoder.tokenizer, texts, None, encoder.max_length, kept)
    report_truncated(found, args.input, encoder.model.config.max_position_embeddings)
    t0 = time.perf_counter()
    vectors = encoder.encode(texts, batch_size=args.batch_size, show_progress=len(texts) > 2000)
    seconds = time.perf_counter() - t0
    out = Path(args.output)
    write_file(out, lambda f: np.save(f, vectors), binary=True)  # np.save(path) would append .npy to other names
    print(f"embedded {len(texts)} texts -> {out} {vectors.shape} in {seconds:.2f} s: "
          f"{len(texts) / max(seconds, 1e-9):.0f} sentences/s on {encoder.device} ({encoder.precision})")
    return 0
