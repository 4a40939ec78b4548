"""`bert-kit export`: a model folder to an ONNX folder that alone serves CPU inference.

    bert-kit export --model runs/finetune_sst2/best --output sst2-onnx
    bert-kit export --model models/all-MiniLM-L6-v2 --output minilm-int8 --quantize int8
    bert-kit predict --model sst2-onnx --input texts.txt --output out.jsonl     # ONNX Runtime
    bert-kit embed --model minilm-int8 --input texts.txt --output vectors.npy

The folder's head is exported (encoder + pooling, sequence classification / regression, token
classification, QA, MLM, MLM + NSP) with dynamic batch and sequence axes, next to its
config.json and tokenizer; `bert_kit.onnx_export` describes the graph. --model may be a run
folder or a hub name with a local copy. --output is a new or empty folder, or an earlier export
(whose files are replaced); SIGTERM or Ctrl-C mid-export leaves nothing behind. Needs
`pip install "bert-kit[onnx]"`.
"""

from __future__ import annotations

import argparse
import sys

# bert_kit.onnx_export's OPSET, MIN_OPSET and QUANTIZE_CHOICES, written here so that --help does not
# import torch (tests/cli/test_cli.py keeps them equal); the newest opset is torch's, checked at run time
OPSET, MIN_OPSET, QUANTIZE_CHOICES = 17, 9, ("int8",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder (HF or bert-kit; a run folder means its best/ or "
                                                       "final/), or a hub name with a local copy")
    parser.add_argument("--output", required=True, help="folder to write: model.onnx, config.json, tokenizer files")
    parser.add_argument("--format", choices=("onnx",), default="onnx", help="export format")
    parser.add_argument("--quantize", choices=QUANTIZE_CHOICES, default=None,
                        help="int8: ONNX Runtime's BERT fusions, then dynamic int8 quantisation of the matmul "
                             "weights and the embedding tables (all-MiniLM-L6-v2: 23 MB against 91 MB; the "
                             "agreement with fp32 is printed); default: fp32")
    parser.add_argument("--fuse", action="store_true",
                        help="fuse attention, add + LayerNorm and bias + GELU into ONNX Runtime's own ops (the "
                             "graph then needs ONNX Runtime; slower on short texts in fp32, measured in "
                             "benchmarks/reports/2026-11-26-cpu-embeddings-onnx.md); --quantize int8 always fuses")
    parser.add_argument("--opset", type=int, default=OPSET,
                        help=f"ONNX opset version, from {MIN_OPSET} to the newest this torch exports "
                             f"(default {OPSET})")


def run(args: argparse.Namespace) -> int:
    from bert_kit.onnx_export import export_onnx
    from bert_kit.outputs import Interrupted

    try:
        report = export_onnx(args.model, args.output, quantize=args.quantize, fuse=args.fuse, opset=args.opset)
    except Interrupted as e:  # the temporary folder is gone; an earlier export in --output is as it was
        done = f"{args.output} was written first" if e.finished else "nothing was written"
        print(f"bert-kit export: stopped by {e}: {done}", file=sys.stderr)
        return 128 + e.signum
    print(report.summary())
    return 0
