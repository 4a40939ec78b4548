"""`bert-kit mine-negatives`: hard negatives for (query, positive) pairs, written as training triplets.

    bert-kit mine-negatives --model sentence-transformers/all-MiniLM-L6-v2 --data nfcorpus --split train \\
        --num-negatives 5 --range-min 10 --range-max 100 --relative-margin 0.05 --output hard.jsonl

--data is a BEIR folder (its split's queries with each relevant document) or a pairs file
(TSV/CSV/JSONL; --anchor-column / --positive-column, by default the first two columns of its
header line or JSON keys; --corpus adds candidate passages). The rules are sentence-transformers'
`mine_hard_negatives` (`bert_kit.retrieval.mining`). Output by extension: .jsonl, .csv, else TSV, with the columns
anchor, positive, negative (--format triplet) or negative_1..N (--format n-tuple). With --rescore
RERANKER a cross-encoder (`bert-kit finetune --task reranker`) rescores each query's candidates and
positives, and its scores (sigmoid, in [0, 1]) decide the margin and the order, as
sentence-transformers' `mine_hard_negatives(cross_encoder=...)` does.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bert_kit.checks import non_negative
from bert_kit.cli.errors import check_output_file
from bert_kit.cli.options import (COUNT, FINITE, INDEX, MAX_LENGTH, SEED, add_device_option, add_model_option,
                                  add_table_options, flag_messages, name_settings_as_flags, number)

NON_NEGATIVE = number(non_negative())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    parser.add_argument("--data", required=True, help="a BEIR folder, or a file of (query, positive) pairs")
    parser.add_argument("--output", required=True, help="triplets to write: .jsonl, .csv, else TSV")
    parser.add_argument("--split", default="train", help="BEIR folder: the qrels/SPLIT.tsv whose pairs to mine for")
    parser.add_argument("--anchor-column", default=None,
                        help="pairs file: the query column, name or 0-based index (default: the first column of its "
                             "header line or JSON keys; with --no-header, column 0)")
    parser.add_argument("--positive-column", default=None,
                        help="pairs file: the positive column, name or index (default: the second)")
    add_table_options(parser, rows="pairs file: mine only for rows with this value")
    parser.add_argument("--corpus", default=None,
                        help="more candidate passages: a BEIR corpus.jsonl(.gz), or a text file of one a line")
    parser.add_argument("--num-negatives", type=COUNT, default=3, help="negatives per pair (default 3)")
    parser.add_argument("--range-min", type=INDEX, default=0, help="skip the best N candidates (default 0)")
    parser.add_argument("--range-max", type=COUNT, default=None,
                        help="consider candidates up to this place (default: range-min + num-negatives, x10 with "
                             "a margin or a score limit, + the most positives of a query)")
    parser.add_argument("--margin", type=NON_NEGATIVE, default=None,
                        help="drop candidates scoring above the weakest positive minus this (absolute)")
    parser.add_argument("--relative-margin", type=NON_NEGATIVE, default=None,
                        help="drop candidates above positive - |positive| x this (0.05: NV-Retriever's 95%%)")
    parser.add_argument("--max-score", type=FINITE, default=None, help="drop candidates scoring above this")
    parser.add_argument("--min-score", type=FINITE, default=None, help="drop candidates scoring below this")
    parser.add_argument("--sampling", choices=("top", "random"), default="top",
                        help="the best kept candidates, or drawn at random from them (default top)")
    parser.add_argument("--seed", type=SEED, default=0, help="for --sampling random")
    parser.add_argument("--format", choices=("triplet", "n-tuple"), default="triplet",
                        help="a row per negative, or a row per pair with negative_1..N (default triplet)")
    parser.add_argument("--output-scores", action="store_true", help="add the scores [positive, negatives...]")
    parser.add_argument("--rescore", default=None, metavar="RERANKER",
                        help="rescore the candidates with this reranker folder (a cross-encoder with one output); "
                             "its scores, in [0, 1], then decide margins, score limits and order")
    parser.add_argument("--rescore-max-length", type=MAX_LENGTH, default=None,
                        help="tokens per (query, passage) pair of --rescore (default: its fine-tuning length, "
                             "else 512)")
    parser.add_argument("--query-prefix", default="", help='put before every query, e.g. "query: "')
    parser.add_argument("--passage-prefix", default="", help='put before every passage, e.g. "passage: "')
    parser.add_argument("--pooling", choices=("mean", "cls"), default=None, help="default: the model's, else mean")
    parser.add_argument("--max-length", type=MAX_LENGTH, default=None, help="tokens per text (default: the model's)")
    parser.add_argument("--batch-size", type=COUNT, default=None, help="at most this many texts a batch")
    parser.add_argument("--max-tokens-per-batch", type=COUNT, default=None,
                        help="padded tokens a batch (default: sized for the device)")
    add_device_option(parser)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    name_settings_as_flags(parser)


def read_input(args: argparse.Namespace) -> tuple[list[str], list[str], list[str]]:
    """(anchors, positives, extra corpus passages) from --data and --corpus."""
    from bert_kit.data import read_text
    from bert_kit.data.tables import parse_where, read_table, read_texts
    from bert_kit.retrieval.beir import read_beir, read_corpus
    from bert_kit.retrieval.mining import pairs_from_beir
    from bert_kit.retrieval.tuples import header_names

    corpus: list[str] = []
    data = Path(args.data)
    if data.is_dir():
        split = read_beir(data, args.split)
        anchors, positives = pairs_from_beir(split)
        corpus = split.corpus_texts
    else:
        anchors, positives = [], []
        text = read_text(data, "pairs file", args.encoding)
        # by default the first two columns of the header line or JSON keys, as the embedding task reads
        # a table (read by index, a header line was mined as a pair and a JSON record was refused)
        names = header_names(data, text, args.delimiter, args.header) or []
        defaults = names[:2] if len(names) >= 2 else ["0", "1"]
        columns = [given if given is not None else default
                   for given, default in zip([args.anchor_column, args.positive_column], defaults)]
        rows = read_table(data, columns, args.header, args.delimiter, parse_where(args.where), "pairs file",
                          args.encoding, text)
        for at, (anchor, positive) in rows:
            if not (isinstance(anchor, str) and isinstance(positive, str)):
                raise ValueError(f"{at}: the anchor and positive must be texts")
            anchors.append(anchor)
            positives.append(positive)
    if args.corpus:
        name = Path(args.corpus).name
        extra = read_corpus(args.corpus)[1] if name.endswith((".jsonl", ".jsonl.gz")) else \
            [t for t in read_texts(args.corpus, encoding=args.encoding) if t.strip()]
        corpus = corpus + extra
    return anchors, positives, corpus


@flag_messages
def run(args: argparse.Namespace) -> int:
    from bert_kit.retrieval.beir import beir_files

    t0 = time.time()
    check_output_file(args.output, "--output", inputs=[args.data, args.corpus, *beir_files(args.data)])
    anchors, positives, corpus = read_input(args)  # before torch and the model load
    from bert_kit.model_folder import read_model_metadata, resolve_model, sentence_transformers_settings
    from bert_kit.retrieval.mining import MiningSettings, mine_hard_negatives, write_rows

    settings = MiningSettings(args.num_negatives, args.range_min, args.range_max, args.margin, args.relative_margin,
                              args.max_score, args.min_score, args.sampling, args.seed, args.format)
    settings.window(1)  # a window too narrow for num_negatives is refused before the model loads
    model = resolve_model(args.model)
    reranker_folder = resolve_model(args.rescore) if args.rescore else None  # a bad name fails before any work
    from bert_kit.embeddings import SentenceEncoder  # torch: after the input was read
    from bert_kit.retrieval.rerank import Reranker, check_reranker_folder

    if reranker_folder is not None:  # not a reranker: said before the model loads and the corpus is embedded
        check_reranker_folder(reranker_folder)

    pooling = (args.pooling or read_model_metadata(model).get("pooling")
               or sentence_transformers_settings(model).get("pooling") or "mean")
    encoder = SentenceEncoder.from_pretrained(model, pooling, True, args.max_length, args.device,
                                              precision=args.precision, max_tokens_per_batch=args.max_tokens_per_batch)
    rescore = None
    if reranker_folder is not None:
        rescore = Reranker.from_pretrained(reranker_folder, args.rescore_max_length, encoder.device, args.precision,
                                           args.max_tokens_per_batch).score
    mined = mine_hard_negatives(encoder, anchors, positives, corpus, settings, args.query_prefix,
                                args.passage_prefix, rescore=rescore, batch_size=args.batch_size, show_progress=True)
    rows = mined.rows(args.format, args.output_scores)
    print(mined.summary())
    if not rows:  # an empty file would only fail later, in the training run that reads it
        print(f"mine-negatives: no {args.format} row to write: no pair kept a negative under these settings "
              "(see the counts above); lower --margin/--relative-margin/--range-min, raise --range-max or "
              f"--max-score{', or lower --num-negatives' if args.format == 'n-tuple' else ''}; {args.output} "
              "not written", file=sys.stderr)
        return 1
    out = write_rows(args.output, rows)
    print(f"wrote {len(rows)} {args.format} row(s) -> {out} ({time.time() - t0:.1f} s on {encoder.device}, "
          f"{encoder.precision}{f'; rescored by {args.rescore}' if rescore else ''})")
    return 0
