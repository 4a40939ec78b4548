"""`bert-kit export`: a model folder to an ONNX folder that alone serves CPU inference.

    bert-kit export --model runs/finetune_sst2/best --output sst2-onnx
    bert-kit export --model models/all-MiniLM-L6-v2 --output minilm-int8 --quantize int8
    bert-kit predict --model sst2-onnx --input texts.txt --output out.jsonl     # ONNX Runtime
    bert-kit embed --model minilm-int8 --input texts.txt --output vectors.npy

The folder's head is exported (encoder + pooling, sequence classification / regression, token
classification, QA, MLM, MLM + NSP) with dynamic batch and sequence axes, next to its
config.json and tokenizer; `bert_kit.onnx_export` describes the graph. Needs
`pip install "bert-kit[onnx]"`.
"""

from __future__ import annotations

import argparse

from bert_kit.onnx_export import OPSET, QUANTIZE_CHOICES, export_onnx


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder (HF or bert-kit; a run folder means its best/ or final/)")
    parser.add_argument("--output", required=True, help="folder to write: model.onnx, config.json, tokenizer files")
    parser.add_argument("--format", choices=("onnx",), default="onnx", help="export format")
    parser.add_argument("--quantize", choices=QUANTIZE_CHOICES, default=None,
                        help="int8: dynamic quantisation of the matmul weights (4x smaller matmul weights, "
                             "about 2x faster on CPUs with VNNI); default: fp32")
    parser.add_argument("--fuse", action="store_true",
                        help="fuse attention, add + LayerNorm and bias + GELU into ONNX Runtime's own ops (the "
                             "graph then needs ONNX Runtime; slower on short texts, measured in benchmarks/RESULTS.md)")
    parser.add_argument("--opset", type=int, default=OPSET, help="ONNX opset version")


def run(args: argparse.Namespace) -> int:
    report = export_onnx(args.model, args.output, quantize=args.quantize, fuse=args.fuse, opset=args.opset)
    print(report.summary())
    return 0
