"""`bert-kit evaluate`: score a model on a task's data file; metrics printed and saved as JSON.

The JSON (and, for classification, the confusion matrix PNG) goes to --output, else to the
working directory as eval_{task}_{data file}.json: never into the model folder, which may be
read-only or installed inside a package. That default file is replaced by a new evaluation of
the same model, never by one of another model (the same dev.tsv scored by two models): the
other model's goes to eval_{task}_{data file}_{model}.json, and the command says so.

`--task retrieval` scores any encoder on a BEIR folder (`--data nfcorpus --split test`): nDCG@10,
MRR@10, Recall@1/10/100 and MAP@100 as MTEB computes them (`bert_kit.retrieval`), saved as
eval_retrieval_{folder}_{split}.json (by the same rule). With `--rerank RERANKER --top-k 100` a
reranker (a `--task reranker` folder, or any cross-encoder with one output) rescores each query's
first 100 documents: both stages' metrics are printed and saved ("first_stage" in the JSON). An
embedding model's folder (`--task embedding`) on a BEIR folder is scored the same way.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from bert_kit.checks import PRECISIONS, ConfigError, check_input_file
from bert_kit.cli.errors import check_output_file
from bert_kit.cli.options import (COUNT, FINITE, INDEX, INTEGER, MAX_LENGTH, add_device_option, add_model_option,
                                  add_table_options, flag_messages, name_settings_as_flags)
from bert_kit.model_folder import resolve_model
from bert_kit.outputs import write_text
from bert_kit.tasks import TASKS


def add_common_arguments(parser: argparse.ArgumentParser, tasks: tuple[str, ...] = TASKS) -> None:
    """Flags shared with `bert-kit predict`."""
    parser.add_argument("--task", choices=tasks, default=None, help="default: the task recorded in the model folder")
    add_model_option(parser, "fine-tuned, or any encoder for similarity and retrieval")
    parser.add_argument("--batch-size", type=COUNT, default=None,
                        help="examples a batch (default 64; retrieval: as many texts as --max-tokens-per-batch holds)")
    parser.add_argument("--max-length", type=MAX_LENGTH, default=None,
                        help="tokens per text (default: the model's fine-tuning length, else its positions)")
    add_device_option(parser)
    parser.add_argument("--precision", choices=PRECISIONS, default="auto")
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
    parser.add_argument("--long-text", choices=("truncate", "chunks"), default=None,
                        help="classification: texts past --max-length cut (truncate), or read in windows whose "
                             "logits pool into the text's (chunks); default: as the model was fine-tuned")
    parser.add_argument("--chunk-stride", type=INDEX, default=None,
                        help="chunks: tokens shared by neighbouring windows (default: the model's, else a quarter)")
    parser.add_argument("--chunk-pooling", choices=("mean", "max"), default=None,
                        help="chunks: how the windows' logits make the text's (default: the model's, else mean)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, (*TASKS, "retrieval"))
    parser.add_argument("--data", required=True, help="labelled data file (TSV/CSV/JSONL, CoNLL, SQuAD JSON, STS-B); "
                                                      "retrieval: a BEIR folder")
    parser.add_argument("--output", default=None,
                        help="metrics JSON (default: ./eval_{task}_{data file name}.json; when that holds another "
                             "model's evaluation, ./eval_{task}_{data file name}_{model}.json)")
    parser.add_argument("--max-examples", type=COUNT, default=None, help="evaluate on the first N examples only")
    parser.add_argument("--label-column", default=None,
                        help="classification: label column; similarity: score (default: the model's, else label)")
    parser.add_argument("--label-delimiter", default=None,
                        help="several labels per text: what separates a row's labels (default: the model's, else ,)")
    parser.add_argument("--label-columns", nargs="+", default=None, metavar="COLUMN",
                        help="several labels per text: one 0/1 column per label, in the model's label order "
                             "(default: the model's)")
    parser.add_argument("--tag-column", type=INTEGER, default=None,
                        help="token-classification: CoNLL column of the tag (default: the model's, else the last)")
    parser.add_argument("--score-range", type=FINITE, nargs=2, metavar=("LOW", "HIGH"), default=None,
                        help="similarity: range of the gold scores (default: the model's, else 0 5)")
    parser.add_argument("--split-articles", type=COUNT, default=None,
                        help="qa: evaluate on the articles after the first N (the held-out part of a "
                             "fine-tuning split)")
    add_retrieval_arguments(parser)
    name_settings_as_flags(parser)


def add_retrieval_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of --task retrieval (`bert_kit.retrieval.evaluator.RetrievalEvaluator`)."""
    group = parser.add_argument_group("retrieval (--task retrieval --data BEIR_FOLDER)")
    group.add_argument("--split", default="test", help="the qrels/SPLIT.tsv to score (default test)")
    group.add_argument("--query-prefix", default="", help='put before every query, e.g. "query: " (E5 models)')
    group.add_argument("--passage-prefix", default="", help='put before every document, e.g. "passage: "')
    group.add_argument("--score-function", choices=("cos", "dot"), default="cos",
                       help="cosine, or the dot product of the raw pooled vectors (default cos)")
    for name, default in (("ndcg", [10]), ("mrr", [10]), ("recall", [1, 10, 100]), ("map", [100]), ("precision", [])):
        group.add_argument(f"--{name}-at", type=COUNT, nargs="*", default=default, metavar="K",
                           help=f"cutoffs of {name} (default {' '.join(map(str, default)) or 'none'})")
    group.add_argument("--top-k", type=COUNT, default=None, help="documents retrieved per query (default: the "
                                                                 "largest cutoff)")
    group.add_argument("--max-tokens-per-batch", type=COUNT, default=None,
                       help="padded tokens a batch (default: sized for the device)")
    group.add_argument("--corpus-chunk-size", type=COUNT, default=50_000,
                       help="documents embedded, then searched, at a time (default 50000)")
    group.add_argument("--faiss", default=None, metavar="FACTORY",
                       help='search a FAISS index instead ("Flat", "HNSW32", "IVF4096,PQ64"; needs the [retrieval] '
                            "extra)")
    group.add_argument("--save-run", default=None, metavar="FILE",
                       help="also write the ranking as a TREC run file (query Q0 doc rank score tag)")
    group.add_argument("--rerank", default=None, metavar="RERANKER",
                       help="rescore each query's first --top-k documents (default 100) with this reranker folder "
                            "(bert-kit finetune --task reranker, or a cross-encoder with one output)")
    group.add_argument("--rerank-max-length", type=MAX_LENGTH, default=None,
                       help="tokens per (query, document) pair of --rerank (default: its fine-tuning length, else 512)")


@flag_messages
def run(args: argparse.Namespace) -> int:
    if args.task == "retrieval" or (args.task in (None, "embedding") and Path(args.data).is_dir()
                                    and (args.task or recorded_task(args.model)) == "embedding"):
        return run_retrieval(args)
    if args.rerank:
        raise ConfigError("--rerank reranks a first stage's documents: it goes with --task retrieval")
    if Path(args.data).is_dir() and (args.task or recorded_task(args.model)) == "reranker":
        raise ConfigError(reranker_on_beir(args))
    t0 = time.time()
    check_output_file(args.output, "--output", inputs=[args.data])
    check_input_file(args.data, "--data")  # before torch and the model load
    from bert_kit.tasks.inference import load_task_model, summary_line

    task, model, precision = load_task_model(args)
    folder = resolve_model(args.model).resolve()
    out = Path(args.output) if args.output else default_output(task.name, args.data, args.model, folder)
    png = out.with_name(out.stem + "_confusion_matrix.png") if task.name == "classification" else None
    named = "--output" if args.output else "the default --output"  # checked before the evaluation too
    check_output_file(out, named, inputs=[args.data])
    check_output_file(png, f"the confusion matrix beside {named}", inputs=[args.data])
    items = task.read_eval(args.data, args.max_examples)
    if not items:
        raise ValueError(f"{args.data}: no examples to evaluate")
    metrics = task.evaluate(model, items, precision)
    result = {"task": task.name, "model": str(args.model), "model_path": str(folder), "data": str(args.data),
              **metrics, "max_length": task.s.max_length, "seconds": round(time.time() - t0, 3)}
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


def run_retrieval(args: argparse.Namespace) -> int:
    """--task retrieval: embed a BEIR split's queries and corpus, search, score, write the JSON."""
    from bert_kit.model_folder import read_model_metadata, sentence_transformers_settings
    from bert_kit.retrieval.beir import beir_files, read_beir

    t0 = time.time()
    folder = Path(args.data)
    model = resolve_model(args.model)
    if recorded_task(args.model) == "reranker":  # its encoder alone would embed, and score, as noise
        raise ConfigError(reranker_on_beir(args))
    out = Path(args.output) if args.output else default_output(
        "retrieval", f"{folder.resolve().name}_{args.split}", args.model, model.resolve())
    check_output_file(out, "--output" if args.output else "the default --output", inputs=beir_files(folder))
    check_output_file(args.save_run, "--save-run", inputs=beir_files(folder))
    cutoffs = {name: getattr(args, f"{name}_at") for name in ("ndcg", "mrr", "recall", "map", "precision")}
    if not any(cutoffs.values()):
        raise ConfigError("no metric to compute: give --ndcg-at, --mrr-at, --recall-at, --map-at or --precision-at")
    reranker_folder = resolve_model(args.rerank) if args.rerank else None  # a bad name fails before any work
    rerank_k = (args.top_k or 100) if args.rerank else None
    short = [f"{name}@{k}" for name, ks in cutoffs.items() for k in ks if args.top_k and k > args.top_k]
    if short and not args.rerank:  # the metrics of a run cut short, as trec_eval scores one: lower than the search's
        print(f"warning: --top-k {args.top_k} keeps fewer documents than {', '.join(short)} count: they score "
              f"the first {args.top_k} of each query (raise --top-k, or lower the cutoffs)", file=sys.stderr)
    data = read_beir(folder, args.split)  # before torch and the model load
    if args.max_examples:  # the first N judged queries
        data.qrels = dict(list(data.qrels.items())[:args.max_examples])
        data.queries = {q: data.queries[q] for q in data.qrels}
    from bert_kit.embeddings import SentenceEncoder  # torch: after the data was read
    from bert_kit.onnx_export import onnx_folder
    from bert_kit.retrieval.evaluator import RetrievalEvaluator, format_table
    from bert_kit.retrieval.metrics import metric_names
    from bert_kit.retrieval.rerank import Reranker, check_reranker_folder, rerank
    from bert_kit.training.precision import resolve_precision

    if reranker_folder is not None:  # not a reranker: said before the first stage embeds the corpus
        check_reranker_folder(reranker_folder)

    exported = onnx_folder(model, args.backend)
    precision = resolve_precision("fp32" if exported else args.precision, "cpu" if exported else args.device or "auto",
                                  purpose="inference")
    pooling = (args.pooling or read_model_metadata(model).get("pooling")
               or sentence_transformers_settings(model).get("pooling") or "mean")
    encoder = SentenceEncoder.from_pretrained(exported or model, pooling, args.score_function == "cos", args.max_length,
                                              precision.device, precision=precision.name,
                                              max_tokens_per_batch=args.max_tokens_per_batch)
    top_k = max(rerank_k, max(k for ks in cutoffs.values() for k in ks)) if rerank_k else args.top_k
    evaluator = RetrievalEvaluator(data, cutoffs, args.query_prefix, args.passage_prefix, args.score_function,
                                   top_k, args.corpus_chunk_size, args.faiss, args.batch_size, show_progress=True)
    ranking = evaluator.search(encoder)
    counts = {"num_queries": len(data.qrels), "num_docs": len(data.corpus_ids),
              "queries_without_relevant": data.unanswerable}
    metrics = {**evaluator.score(ranking), **counts}
    first_stage, reranking = None, {}
    if reranker_folder is not None:  # the second stage: each query's first rerank_k documents, rescored
        t1 = time.time()
        reranker = Reranker.from_pretrained(reranker_folder, args.rerank_max_length, precision.device, precision.name,
                                            args.max_tokens_per_batch)
        ranking = rerank(ranking, data, reranker, rerank_k, args.query_prefix)
        first_stage, metrics = metrics, {**evaluator.score(ranking), **counts}
        reranking = {"rerank": {"model": str(args.rerank), "model_path": str(reranker_folder.resolve()),
                                "top_k": rerank_k, "max_length": reranker.max_length,
                                "seconds": round(time.time() - t1, 3)}, "first_stage": first_stage}
    result = {"task": "retrieval", "model": str(args.model), "model_path": str(model.resolve()), "data": str(args.data),
              "split": args.split, **metrics,
              "max_length": encoder.max_length, "pooling": pooling, "score_function": args.score_function,
              "query_prefix": args.query_prefix, "passage_prefix": args.passage_prefix, "precision": encoder.precision,
              "top_k": evaluator.top_k, "index": args.faiss or "exact", "timings": evaluator.seconds, **reranking,
              "seconds": round(time.time() - t0, 3)}
    write_text(out, json.dumps(result, indent=2) + "\n")
    if args.save_run:
        ranking.write_trec(args.save_run)
    print(f"retrieval: {folder.name} {args.split}, {len(data.qrels)} queries, {len(data.corpus_ids)} documents "
          f"({evaluator.seconds['corpus']:.1f} s to embed and search the corpus)")
    if first_stage is None:
        print(format_table(metrics, metric_names(evaluator.cutoffs)))
    else:
        print(f"reranked each query's first {rerank_k} documents with {args.rerank} "
              f"({reranking['rerank']['seconds']:.1f} s); the others follow in the first stage's order")
        print(format_table(metrics, metric_names(evaluator.cutoffs), first_stage=first_stage, reranked=metrics))
    print(f"wrote {out}" + (f" and {args.save_run}" if args.save_run else ""))
    return 0


def reranker_on_beir(args: argparse.Namespace) -> str:
    """What to run instead when a reranker is to score a BEIR folder as an embedding model would."""
    return (f"{args.model}: a reranker scores (query, document) pairs and embeds no corpus; on a BEIR folder it "
            f"reranks a first stage: bert-kit evaluate --task retrieval --model EMBEDDING_MODEL --data {args.data} "
            f"--rerank {args.model} (--task reranker scores a file of (query, passage, label) rows or "
            "mine-negatives tuples)")


def recorded_task(model: str) -> str | None:
    """The task a model folder records (bert-kit finetune's), or None (any other folder, a bad name)."""
    from bert_kit.model_folder import read_model_metadata

    try:
        return read_model_metadata(resolve_model(model)).get("task")
    except (OSError, ValueError):
        return None


def default_output(task: str, data: str | Path, model: str | Path, folder: Path) -> Path:
    """eval_{task}_{data}.json, unless it holds an evaluation of another model than `folder`:
    then eval_{task}_{data}_{model}.json (a number added while that one is another model's too),
    said on stderr. An evaluation is never replaced by another model's."""
    plain = Path(f"eval_{task}_{Path(data).stem}.json")
    holder = evaluated_model(plain)
    if holder is None or holder[1] == folder:
        return plain
    label, n = model_label(model, folder), 1
    while True:
        out = plain.with_name(f"{plain.stem}_{label}{'' if n == 1 else f'_{n}'}.json")
        found = evaluated_model(out)
        if found is None or found[1] == folder:
            print(f"evaluate: {plain} holds the evaluation of another model ({holder[0]}): writing {out}",
                  file=sys.stderr, flush=True)
            return out
        n += 1


def evaluated_model(path: Path) -> tuple[str, Path] | None:
    """(the model as named, its folder) of the evaluation JSON at `path`; None when there is
    none there (or not one that can be read as an evaluation)."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(earlier, dict) or "task" not in earlier or "model" not in earlier:
        return None
    named = str(earlier["model"])
    if isinstance(earlier.get("model_path"), str):
        return named, Path(earlier["model_path"])
    try:  # written before the folder was recorded: the model as it was named, from here
        return named, resolve_model(named).resolve()
    except (OSError, ValueError):
        return named, Path(named)


def model_label(model: str | Path, folder: Path) -> str:
    """A short name of a model for a file name: its folder's (`finetune_sst2`), with its run's
    for a run's part (`finetune_sst2-best`), the last part of a hub name (`all-MiniLM-L6-v2`)."""
    parts = Path(str(model).rstrip("/")).parts or folder.parts
    name = parts[-1]
    if (name in ("best", "final") or name.startswith("step-")) and len(parts) > 1:
        name = f"{parts[-2]}-{name}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
