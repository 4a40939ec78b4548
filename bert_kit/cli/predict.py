"""`bert-kit predict`: run a fine-tuned model over an input file, one JSON object per line out."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bert_kit.checks import check_input_file
from bert_kit.cli.errors import check_output_file
from bert_kit.cli.evaluate import add_common_arguments
from bert_kit.cli.options import flag_messages, name_settings_as_flags
from bert_kit.outputs import write_file
from bert_kit.tasks import PREDICT_TASKS



def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, PREDICT_TASKS)
    parser.add_argument("--input", required=True, help="file to predict on (see the table in the module docs)")
    parser.add_argument("--output", required=True, help="JSON Lines file to write")
    parser.add_argument("--input-format", choices=("auto", "conll", "lines"), default="auto",
                        help="token-classification: CoNLL columns or one sentence per line (default: detect)")
    name_settings_as_flags(parser)


@flag_messages
def run(args: argparse.Namespace) -> int:
    t0 = time.time()
    check_output_file(args.output, "--output", inputs=[args.input])
    check_input_file(args.input)  # before the model loads; a pipe or /dev/stdin is read once, later
    from bert_kit.tasks.inference import PREDICTORS, load_task_model  # torch: after the arguments are checked

    task, model, precision = load_task_model(args, verbose=False)
    if task.name not in PREDICTORS:
        other = {"embedding": "bert-kit embed (vectors) or evaluate --task retrieval",
                 "reranker": "bert-kit serve (POST /rerank) or evaluate --task retrieval --rerank"}
        raise ValueError(f"{args.model} is a {task.name} model, which predict does not run: use {other[task.name]}")
    records = PREDICTORS[task.name](task, model, args.input, precision, args.input_format)
    out = Path(args.output)
    write_file(out, lambda f: f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    print(f"{task.name}: {len(records)} predictions -> {out} ({time.time() - t0:.1f}s on {precision.device})")
    return 0
