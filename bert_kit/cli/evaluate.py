"""`bert-kit evaluate`: score a model on a task's data file; metrics printed and saved as JSON.

The JSON (and, for classification, the confusion matrix PNG) goes to --output, else to the
working directory as eval_{task}_{data file}.json: never into the model folder, which may be
read-only or installed inside a package.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bert_kit.checks import check_input_file
from bert_kit.cli.errors import check_output_file
from bert_kit.cli.options import (COUNT, FINITE, INDEX, INTEGER, MAX_LENGTH, add_device_option, add_model_option,
                                  add_table_options, flag_messages, name_settings_as_flags)
from bert_kit.outputs import write_text
from bert_kit.tasks import TASKS


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared with `bert-kit predict`."""
    parser.add_argument("--task", choices=TASKS, default=None, help="default: the task recorded in the model folder")
    add_model_option(parser, "fine-tuned, or any encoder for similarity")
    parser.add_argument("--batch-size", type=COUNT, default=64)
    parser.add_argument("--max-length", type=MAX_LENGTH, default=None,
                        help="tokens per text (default: the model's fine-tuning length, else its positions)")
    add_device_option(parser)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    parser.add_argument("--backend", choices=("auto", "torch", "onnx"), default="auto",
                        help="onnx: ONNX Runtime on the CPU (a folder from bert-kit export, or one exported now); "
                             "auto: onnx for exported folders, else torch")
    parser.add_argument("--similarity-mode", choices=("bi-encoder", "cross-encoder"), default=None,
                        help="similarity: cosine of pooled vectors or the regression head (default: from the folder)")
    parser.add_argument("--pooling", choices=("mean", "cls"), default=None, help="bi-encoder pooling (default mean)")
    # the reading flags default to what the folder was fine-tuned with (bert_kit.tasks.inference.read_settings)
    parser.add_argument("--text-column", default=None,
                        help="text column of TSV/CSV/JSONL: name or 0-based index (default: the model's, else sentence)")
    parser.add_argument("--text-pair-column", default=None,
                        help="second text column (similarity: read any pair file; default: the model's)")
    add_table_options(parser)
    parser.add_argument("--label-pattern", default=None, help="regex with label and text groups splitting the text")
    parser.add_argument("--word-column", type=INDEX, default=None,
                        help="token-classification: CoNLL column of the word (default: the model's, else 0)")
    parser.add_argument("--skip-bad-answers", action="store_true", help="qa: leave out answers not in their context")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--data", required=True, help="labelled data file (TSV/CSV/JSONL, CoNLL, SQuAD JSON, STS-B)")
    parser.add_argument("--output", default=None,
                        help="metrics JSON (default: ./eval_{task}_{data file name}.json)")
    parser.add_argument("--max-examples", type=COUNT, default=None, help="evaluate on the first N examples only")
    parser.add_argument("--label-column", default=None,
                        help="classification: label column; similarity: score (default: the model's, else label)")
    parser.add_argument("--tag-column", type=INTEGER, default=None,
                        help="token-classification: CoNLL column of the tag (default: the model's, else the last)")
    parser.add_argument("--score-range", type=FINITE, nargs=2, metavar=("LOW", "HIGH"), default=None,
                        help="similarity: range of the gold scores (default: the model's, else 0 5)")
    parser.add_argument("--split-articles", type=COUNT, default=None,
                        help="qa: evaluate on the articles after the first N (the held-out part of a "
                             "fine-tuning split)")
    name_settings_as_flags(parser)


@flag_messages
def run(args: argparse.Namespace) -> int:
    t0 = time.time()
    check_output_file(args.output, "--output", inputs=[args.data])
    check_input_file(args.data, "--data")  # before torch and the model load
    from bert_kit.tasks.inference import load_task_model, summary_line

    task, model, precision = load_task_model(args)
    out = Path(args.output) if args.output else Path(f"eval_{task.name}_{Path(args.data).stem}.json")
    png = out.with_name(out.stem + "_confusion_matrix.png") if task.name == "classification" else None
    named = "--output" if args.output else "the default --output"  # checked before the evaluation too
    check_output_file(out, named, inputs=[args.data])
    check_output_file(png, f"the confusion matrix beside {named}", inputs=[args.data])
    items = task.read_eval(args.data, args.max_examples)
    if not items:
        raise ValueError(f"{args.data}: no examples to evaluate")
    metrics = task.evaluate(model, items, precision)
    result = {"task": task.name, "model": str(args.model), "data": str(args.data), **metrics,
              "max_length": task.s.max_length, "seconds": round(time.time() - t0, 3)}
    if task.name == "similarity":
        result.update(similarity_mode=task.s.similarity.mode, pooling=task.s.similarity.pooling)
    write_text(out, json.dumps(result, indent=2) + "\n")
    print(summary_line(task.name, metrics))
    print(f"wrote {out}")
    if task.name == "classification" and "confusion_matrix" in metrics:
        from bert_kit.metrics import plot_confusion_matrix

        png = plot_confusion_matrix(metrics["confusion_matrix"], task.label_names, png,
                                    title=f"{Path(args.data).name}: accuracy {metrics['accuracy']:.3f}")
        print(f"wrote {png}")
    return 0
