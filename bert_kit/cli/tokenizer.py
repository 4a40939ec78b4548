"""`bert-kit tokenizer`: train a WordPiece vocabulary, or look at how a tokenizer splits text.

    bert-kit tokenizer train --files corpus.txt more.txt --vocab-size 30522 --output my-tokenizer
    bert-kit tokenizer encode --tokenizer my-tokenizer "Tokenization of unusual words"

The trained folder holds tokenizer.json, vocab.txt and tokenizer_config.json, loadable by
`get_tokenizer` and by `transformers.BertTokenizerFast`. Special tokens get the first ids:
[PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4. --output is a new or empty folder, or one an
earlier `tokenizer train` wrote; never a model folder (a new vocabulary would silently change
what its embedding rows mean).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

FORMATS = {"text": "blank_line", "lines": "line", "jsonl": "jsonl", "wikitext": "wikitext"}
WRITTEN = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")  # what WordPieceTokenizer.save writes
MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "model.onnx")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bert_kit.cli.options import INDEX, name_settings_as_flags

    sub = parser.add_subparsers(dest="tokenizer_command", metavar="ACTION")
    sub.required = True
    train = sub.add_parser("train", help="train a WordPiece vocabulary on text files")
    train.add_argument("--files", nargs="+", required=True, help="text files, folders or globs")
    train.add_argument("--vocab-size", type=int, default=30522, help="vocabulary size (default 30522)")
    train.add_argument("--output", required=True, help="folder to write the tokenizer into")
    train.add_argument("--min-frequency", type=INDEX, default=2, help="drop merges seen fewer times (default 2)")
    train.add_argument("--cased", action="store_true", help="keep case and accents (default: lowercase)")
    train.add_argument("--format", choices=sorted(FORMATS), default="text",
                       help="text / lines are read as they are; jsonl and wikitext are parsed into documents")
    train.add_argument("--text-field", default="text", help="JSONL field holding the text")
    train.add_argument("--encoding", default=None,
                       help="text encoding of the files, a Python codec name such as latin-1 or cp1252 "
                            "(default utf-8, with or without a byte-order mark)")
    name_settings_as_flags(train)  # messages advise --encoding, not encoding=
    encode = sub.add_parser("encode", help="print the tokens and ids of a text")
    encode.add_argument("--tokenizer", required=True, help="tokenizer folder")
    encode.add_argument("text", nargs="+", help="text(s) to encode")


def _train(args: argparse.Namespace) -> int:
    from bert_kit.data import DEFAULT_ENCODING, check_encoding, check_text_file
    from bert_kit.checks import ConfigError
    from bert_kit.data.corpus import iter_documents, resolve_files
    from bert_kit.outputs import OutputFolder
    from bert_kit.tokenizer_training import train_tokenizer

    if args.vocab_size < 6:
        raise ConfigError(f"--vocab-size must leave room beyond the 5 special tokens, got {args.vocab_size}")
    model_files = [n for n in MODEL_FILES if (Path(args.output) / n).exists()]
    if model_files:
        raise ConfigError(f"--output {args.output} holds a model ({', '.join(model_files)}): a new vocabulary there "
                          "would change what its embedding rows mean; train the tokenizer into a new folder")
    encoding = check_encoding(args.encoding)
    out = OutputFolder(args.output, "--output", "bert-kit tokenizer train")
    files = resolve_files(args.files)  # names a missing file before any work
    start = time.time()
    opts = dict(vocab_size=args.vocab_size, lowercase=not args.cased, min_frequency=args.min_frequency)
    compressed = any(f.suffix.lower() in (".xz", ".lzma", ".gz", ".bz2") for f in files)
    if args.format in ("text", "lines") and not compressed and encoding == DEFAULT_ENCODING:
        for f in files:  # the Rust reader's errors name no file: a binary or non-UTF-8 file, by line
            check_text_file(f)
        tokenizer = train_tokenizer([str(f) for f in files], **opts)  # the Rust reader: fast, parallel
    else:  # parsed, compressed or another encoding: Python reads the documents (the Rust reader takes UTF-8)
        documents = iter_documents(files, FORMATS[args.format], args.text_field, encoding)
        tokenizer = train_tokenizer(texts=documents, **opts)
    out.prepare()
    tokenizer.save(args.output)
    out.commit(WRITTEN)
    print(f"trained a {tokenizer.vocab_size}-token WordPiece vocabulary on {len(files)} file(s) "
          f"in {time.time() - start:.1f}s; saved to {args.output}")
    if tokenizer.vocab_size < args.vocab_size:
        print(f"(the corpus supports fewer than the {args.vocab_size} tokens asked for)")
    return 0


def _encode(args: argparse.Namespace) -> int:
    from bert_kit.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(args.tokenizer)
    for text in args.text:
        ids = tokenizer.encode(text)
        print(" ".join(tokenizer.convert_ids_to_tokens(ids)))
        print(" ".join(map(str, ids)))
    return 0


def run(args: argparse.Namespace) -> int:
    from bert_kit.cli.options import flag_messages

    return flag_messages(_train)(args) if args.tokenizer_command == "train" else _encode(args)
