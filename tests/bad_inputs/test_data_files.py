"""Bad input, data files: every reader behind `finetune`, `evaluate`, `predict`, `embed`, `pretrain`
and `tokenizer train`, fed one bad file (or one bad data setting) at a time.

Each case asserts the exact outcome a user sees: one error line naming the file and line (or
the setting and its value) and exit code 1, no traceback; or, for input that is valid but awkward
(a byte-order mark, CRLF line ends, a header-less file, bad answers with skip_bad_answers=true),
the correct result. Categories: encodings, table layout, labels, CoNLL, SQuAD, similarity
scores, data settings, corpora and tokenizer training, inference inputs.

Commands run in-process in a fresh folder (the `cli` fixture), on a random 2-layer encoder
with MiniLM's vocabulary; a bad file stops a run before its first step.
Run: .venv/bin/python -m pytest tests/bad_inputs/test_data_files.py -q
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import torch

from bert_kit.config import BertConfig
from bert_kit.heads import BERTForQuestionAnswering, BERTForSequenceClassification
from bert_kit.model import BERTModel
from bert_kit.model_folder import write_model_metadata
from bert_kit.tokenizer import get_tokenizer

TINY = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=128)
LATIN1 = "caf\u00e9".encode("latin-1")  # b"caf\xe9": not UTF-8
BOM = b"\xef\xbb\xbf"


@pytest.fixture(scope="module")
def folders(tmp_path_factory, minilm_path):
    """name -> model folder: "encoder" (to fine-tune), "classifier", "qa" and "bi-encoder" (fine-tuned)."""
    tokenizer = get_tokenizer(minilm_path)
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    made = {"encoder": (BERTModel(TINY), {}),
            "classifier": (BERTForSequenceClassification(TINY, num_labels=2),
                           {"task": "classification", "label_names": ["neg", "pos"], "max_length": 32}),
            "qa": (BERTForQuestionAnswering(TINY), {"task": "qa", "max_length": 64, "doc_stride": 16, "max_query_length": 16}),
            "bi-encoder": (BERTModel(TINY), {"task": "similarity", "similarity_mode": "bi-encoder", "max_length": 32})}
    out = {}
    for name, (model, meta) in made.items():
        folder = root / name
        if "label_names" in meta:
            model.id2label = {str(i): n for i, n in enumerate(meta["label_names"])}
        model.save_pretrained(folder)
        tokenizer.save(folder)
        if meta:
            write_model_metadata(folder, meta)
        out[name] = folder
    return out


def write_files(files: dict[str, str | bytes]) -> None:
    """Write each file into the working directory (the test's folder)."""
    for name, content in files.items():
        data = content if isinstance(content, bytes) else content.encode("utf-8")
        with open(name, "wb") as f:
            f.write(data)


def tsv(*rows: str, header: str | None = "sentence\tlabel") -> str:
    return "".join(line + "\n" for line in ([header] if header else []) + list(rows))


@dataclass
class Case:
    """One bad input to `bert-kit finetune`: the files written, the task and settings, and the
    pieces the one error line must hold."""

    files: dict[str, str | bytes]
    needles: tuple[str, ...]
    task: str = "classification"
    settings: list[str] = field(default_factory=list)
    train_file: str = "train.tsv"


GOOD_ROWS = ("a fine film\t1", "so dull\t0", "great fun\t1")
SQUAD_CONTEXT = "The Normans were a people in Normandy, France."


def squad(qas, context=SQUAD_CONTEXT) -> str:
    return json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]})


def qa(qid="q1", text="Normans", start=4):
    return {"id": qid, "question": "Who?", "answers": [{"text": text, "answer_start": start}]}


STS_ROW = "main-captions\tMSRvid\t2012test\t0001\t{}\tA man plays.\tA man is playing.\n"
PAIRS = "a,b,score,split\nx y,x z,4.5,train\np q,p r,1,dev\n"
PAIR_SETTINGS = ["text_column=a", "text_pair_column=b", "label_column=score", "score_range=[1, 5]"]

MULTI = ("price,quality", "price", "quality,service", "price,service")  # the labels of a multi-label file
FINETUNE_CASES = {
    # ---- encodings: every reader names the file and the line of the first bad byte
    "tsv-latin1": Case({"train.tsv": tsv(*GOOD_ROWS).encode() + LATIN1 + b"\t0\n"},
                       ("train.tsv:5: not UTF-8 text (byte 0xe9 at column 4)", "name its encoding with encoding=latin-1")),
    "tsv-utf16-as-utf8": Case({"train.tsv": tsv(*GOOD_ROWS).encode("utf-16")},
                              ("train.tsv:1: not UTF-8 text (byte 0xff at column 1)", "encoding=utf-16")),
    "tsv-not-cp1252": Case({"train.tsv": tsv(*GOOD_ROWS).encode() + b"\x81\t0\n"},
                           ("train.tsv:5: not cp1252 text (byte 0x81 at column 1)",), settings=["encoding=cp1252"]),
    "csv-utf16": Case({"train.csv": "sentence,label\na,1\n".encode("utf-16")}, ("train.csv:1: not UTF-8 text (byte 0xff",),
                      train_file="train.csv"),
    "jsonl-latin1": Case({"train.jsonl": b'{"sentence": "ok", "label": 1}\n{"sentence": "' + LATIN1 + b'", "label": 0}\n'},
                         ("train.jsonl:2: not UTF-8 text",), train_file="train.jsonl"),
    "tsv-nul-byte": Case({"train.tsv": tsv("a\x00b\t1")}, ("train.tsv:2: NUL byte: this is a binary file",)),
    "conll-latin1": Case({"train.txt": b"EU B-ORG\n\n" + LATIN1 + b" O\n"}, ("train.txt:3: not UTF-8 text",),
                         task="token-classification", train_file="train.txt"),
    "squad-latin1": Case({"train.json": squad([qa()]).replace("Normans were", "Normans w\u00e9re").encode("latin-1")},
                         ("train.json:1: not UTF-8 text (byte 0xe9",), task="qa", train_file="train.json"),
    "sts-latin1": Case({"sts.csv": STS_ROW.format("4.0").encode() + STS_ROW.format("3.0").encode("utf-16")},
                       ("sts.csv:2: not UTF-8 text",), task="similarity", train_file="sts.csv"),
    "pairs-latin1": Case({"pairs.csv": PAIRS.encode() + b"x," + LATIN1 + b",2,train\n"}, ("pairs.csv:4: not UTF-8 text",),
                         task="similarity", settings=PAIR_SETTINGS, train_file="pairs.csv"),
    "binary-train-file": Case({"train.tsv": bytes(range(256))}, ("train.tsv:2: not UTF-8 text (byte 0x80 at column 118)",)),
    # ---- table layout
    "header-only-tsv": Case({"train.tsv": "sentence\tlabel\n"}, ("train.tsv: only a header line, no data rows",)),
    "empty-tsv": Case({"train.tsv": ""}, ("train.tsv: the file is empty",)),
    "blank-lines-only": Case({"train.tsv": "\n\r\n \n"}, ("train.tsv: the file is empty",)),
    "short-row": Case({"train.tsv": tsv("a\t1", "b")}, ("train.tsv:3: row has 1 fields but the header has 2",)),
    "long-row": Case({"train.tsv": tsv("a\t1\textra")}, ("train.tsv:2: row has 3 fields but the header has 2",)),
    "no-such-column": Case({"train.tsv": tsv("a\t1", header="text\tlabel")},
                           ("train.tsv:1: header has no column 'sentence'", "set header=false")),
    "txt-of-comma-columns": Case({"train.txt": "text,label\ngood,1\n"},
                                 ("train.txt: a .txt file holds one text per line and no label column",
                                  "set delimiter=comma to read it as columns"),
                                 settings=["text_column=text"], train_file="train.txt"),
    "headerless-file-by-name": Case({"train.tsv": tsv("a fine film\t1", header=None)},
                                    ("train.tsv:1: header has no column 'sentence'",)),
    "index-out-of-range": Case({"train.tsv": tsv(*GOOD_ROWS, header=None)},
                               ("train.tsv: column index 4 is out of range: rows have 2 field(s)",),
                               settings=["text_column=4", "label_column=1"]),
    "name-without-header": Case({"train.tsv": tsv(*GOOD_ROWS, header=None)},
                                ("train.tsv: column 'sentence' is a name but the file is read without a header",),
                                settings=["header=false"]),
    "header-names-twice": Case({"train.tsv": tsv("a\t1", header="sentence\tsentence")},
                               ("train.tsv:1: the header names column 'sentence' twice",),
                               settings=["label_column=1", "header=true"]),
    "csv-unclosed-quote": Case({"train.csv": 'sentence,label\nok,1\n"never closed,0\nb,1\n'},
                               ("train.csv:3: bad quoting (unexpected end of data)",), train_file="train.csv"),
    "jsonl-bad-json": Case({"train.jsonl": '{"sentence": "a", "label": 1}\n{"sentence": "b", label: 0}\n'},
                           ("train.jsonl:2: invalid JSON",), train_file="train.jsonl"),
    "jsonl-missing-key": Case({"train.jsonl": '{"sentence": "a", "label": 1}\n{"text": "b", "label": 0}\n'},
                              ("train.jsonl:2: missing key 'sentence'",), train_file="train.jsonl"),
    "jsonl-text-number": Case({"train.jsonl": '{"sentence": 42, "label": 1}\n'},
                              ("train.jsonl:1: column 'sentence' holds int, expected a text",), train_file="train.jsonl"),
    "jsonl-text-null": Case({"train.jsonl": '{"sentence": null, "label": 1}\n'},
                            ("train.jsonl:1: column 'sentence' holds null, expected a text",), train_file="train.jsonl"),
    "jsonl-not-object": Case({"train.jsonl": '"a"\n'}, ("train.jsonl:1: expected a JSON object, got str",),
                             train_file="train.jsonl"),
    "where-keeps-nothing": Case({"train.tsv": tsv("a\t1\tTRAIN", "b\t0\tDEV", header="sentence\tlabel\tsplit")},
                                ("train.tsv: no row has 'split' = 'train'", "that column holds 'DEV', 'TRAIN'"),
                                settings=["where={split: train}"]),
    "where-missing-column": Case({"train.tsv": tsv(*GOOD_ROWS)}, ("train.tsv:1: header has no column 'fold'",),
                                 settings=["where={fold: 1}"]),
    "txt-without-label-pattern": Case({"train.txt": "a fine film\n"},
                                      ("train.txt: a .txt file holds one text per line and no label column",),
                                      train_file="train.txt"),
    "label-pattern-no-match": Case({"train.txt": "__label__pos fine\nno label\n"},
                                   ("train.txt:2: text 'no label' does not match label_pattern",),
                                   settings=[r"label_pattern=__label__(?P<label>\S+) (?P<text>.*)"],
                                   train_file="train.txt"),
    "missing-train-file": Case({}, ("train_file=nope.tsv: file not found",), train_file="nope.tsv"),
    "train-file-is-a-folder": Case({}, ("train_file=.: is a folder, not a file",), train_file="."),
    # ---- labels
    "fraction-among-classes": Case({"train.tsv": tsv("a\t0", "b\t1", "c\t0.5")},
                                   ("train.tsv:4: label '0.5' is fractional but the other labels are integer classes",
                                    "set num_labels=1")),
    "fraction-with-num-labels": Case({"train.tsv": tsv("a\t0", "b\t0.5")},
                                     ("train.tsv:3: label '0.5' is fractional but num_labels=2 asks for class ids",),
                                     settings=["num_labels=2"]),
    "fraction-with-label-names": Case({"train.tsv": tsv("a\t0", "b\t0.5")},
                                      ("train.tsv:3: label '0.5' is not one of label_names ['neg', 'pos']",),
                                      settings=["label_names=[neg, pos]"]),
    "nan-label": Case({"train.tsv": tsv("a\t0", "b\tnan")}, ("train.tsv:3: label 'nan' is not a finite number",)),
    "inf-label-regression": Case({"train.tsv": tsv("a\t0.5", "b\t-inf")}, ("train.tsv:3: label '-inf' is not a finite",),
                                 settings=["num_labels=1"]),
    "json-null-label": Case({"train.jsonl": '{"sentence": "a", "label": 1}\n{"sentence": "b", "label": null}\n'},
                            ("train.jsonl:2: label is null",), train_file="train.jsonl"),
    "json-true-label": Case({"train.jsonl": '{"sentence": "a", "label": true}\n{"sentence": "b", "label": 0}\n'},
                            ("train.jsonl:1: label true is a boolean; write 0/1 or a class name",),
                            train_file="train.jsonl"),
    # label sets where one label per row is asked for (classification.multi_label=false): every
    # combination would become a class of its own
    "json-list-label": Case({"train.jsonl": '{"sentence": "a", "label": [1]}\n'},
                            ("train.jsonl:1: column 'label' holds a JSON list of labels ([1])",
                             "several labels per row, but classification.multi_label=false reads one label per row"),
                            settings=["classification.multi_label=false"], train_file="train.jsonl"),
    "multi-label-csv": Case({"train.csv": "text,labels\n" + "".join(
                                f'review {i},"{MULTI[i % 4]}"\n' for i in range(12))},
                            ("train.csv:2: column 'labels' holds lists of labels ('price,quality', separated by ',', "
                             "in 9 of 12 rows)", "leave out multi_label to read them as label sets"),
                            settings=["text_column=text", "label_column=labels", "classification.multi_label=false"],
                            train_file="train.csv"),
    "multi-label-jsonl": Case({"train.jsonl": '{"t": "a", "tags": ["price", "quality"]}\n{"t": "b", "tags": "x"}\n'},
                              ("train.jsonl:1: column 'tags' holds a JSON list of labels", "multi_label=false"),
                              settings=["text_column=t", "label_column=tags", "classification.multi_label=false"],
                              train_file="train.jsonl"),
    "multi-label-semicolons": Case({"train.tsv": tsv("a\tpos;neg", "b\tneg", "c\tneg;pos")},
                                   ("train.tsv:2: column 'label' holds lists of labels ('pos;neg', separated by ';'",),
                                   settings=["classification.multi_label=false"]),
    # label sets: errors name the line
    "label-set-empty-item": Case({"train.jsonl": '{"sentence": "a", "label": "joy,,anger"}\n{"sentence": "b", '
                                                 '"label": []}\n'},
                                 ("train.jsonl:1: label list 'joy,,anger' holds an empty label between ','s",),
                                 train_file="train.jsonl"),
    "label-set-name-among-ids": Case({"train.jsonl": '{"sentence": "a", "label": [0, 2]}\n{"sentence": "b", '
                                                     '"label": ["joy"]}\n'},
                                     ("train.jsonl:2: label 'joy' is a name but other labels are ids",),
                                     train_file="train.jsonl"),
    "label-columns-not-0-or-1": Case({"train.csv": "text,anger,joy\na,0,1\nb,-1,0\n"},
                                     ("train.csv:3: label column 'anger' holds -1: each label column holds 1",),
                                     settings=["text_column=text", "classification.label_columns=[anger, joy]"],
                                     train_file="train.csv"),
    "empty-label": Case({"train.tsv": tsv("a\t1", "b\t ")}, ("train.tsv:3: empty label",)),
    "negative-label": Case({"train.tsv": tsv("a\t1", "b\t-1")}, ("train.tsv:3: label -1 is negative",)),
    "label-beyond-num-labels": Case({"train.tsv": tsv("a\t1", "b\t2")},
                                    ("train.tsv:3: label 2 is outside the num_labels=2 classes 0..1",),
                                    settings=["num_labels=2"]),
    "three-labels-two-names": Case({"train.tsv": tsv("a\t0", "b\t1", "c\t2")},
                                   ("train.tsv:4: label '2' is not one of label_names ['neg', 'pos'] nor a class id 0..1",),
                                   settings=["label_names=[neg, pos]"]),
    "name-outside-label-names": Case({"train.tsv": tsv("a\tpos", "b\tneutral")},
                                     ("train.tsv:3: label 'neutral' is not one of label_names",),
                                     settings=["label_names=[neg, pos]"]),
    "header-read-as-data": Case({"train.tsv": tsv("sentence\tlabel", *GOOD_ROWS, header=None)},
                                ("train.tsv:1: label 'label' is not a number but the other labels are numbers",
                                 "set header=true"), settings=["text_column=0", "label_column=1"]),
    "labels-differ-in-case": Case({"train.tsv": tsv("a\tPositive", "b\tneg", "c\tpositive")},
                                  ("train.tsv:4: label 'positive' differs from label 'Positive' (train.tsv:2) only in "
                                   "case", "list both in label_names")),
    "number-among-names": Case({"train.tsv": tsv("a\tpos", "b\tneg", "c\t1")},
                               ("train.tsv:4: label '1' is a number but the other labels are class names",)),
    "one-class-only": Case({"train.tsv": tsv("a\tpos", "b\tpos")}, ("train.tsv: every label is 'pos'",)),
    "names-vs-num-labels": Case({"train.tsv": tsv("a\tx", "b\ty", "c\tz")},
                                ("train.tsv: 3 class names ['x', 'y', 'z'] but num_labels=2",), settings=["num_labels=2"]),
    "name-in-regression": Case({"train.tsv": tsv("a\t0.5", "b\thigh")},
                               ("train.tsv:3: label 'high' is not a number; num_labels=1 means regression",),
                               settings=["num_labels=1"]),
    "validation-class-unseen": Case({"train.tsv": tsv("a\tpos", "b\tneg"), "dev.tsv": tsv("c\tpos", "d\tmixed")},
                                    ("dev.tsv:3: label 'mixed' is not one of label_names ['neg', 'pos']",),
                                    settings=["validation_file=dev.tsv"]),
    "validation-id-too-big": Case({"train.tsv": tsv(*GOOD_ROWS), "dev.tsv": tsv("c\t1", "d\t7")},
                                  ("dev.tsv:3: label '7' is not one of label_names ['0', '1'] nor a class id 0..1",),
                                  settings=["validation_file=dev.tsv"]),
    # ---- CoNLL
    "conll-one-column": Case({"train.txt": "EU B-ORG\nrejects\n"}, ("train.txt:2: expected a word and a tag",),
                             task="token-classification", train_file="train.txt"),
    "conll-ragged-columns": Case({"train.txt": "EU NNP B-ORG\n\nNew York NNP B-LOC\n"},
                                 ("train.txt:3: 4 columns but line 1 has 3", "a word with a space in it?"),
                                 task="token-classification", train_file="train.txt"),
    "conll-tag-not-in-names": Case({"train.txt": "EU B-ORG\nrejects O\n\nPeter B-PERSON\n"},
                                   ("train.txt:4: tag 'B-PERSON' is not one of label_names ['O', 'B-ORG', 'B-PER']",),
                                   task="token-classification", settings=["label_names=[O, B-ORG, B-PER]"],
                                   train_file="train.txt"),
    "conll-empty": Case({"train.txt": "-DOCSTART- -X- O\n\n"}, ("train.txt: no sentences",),
                        task="token-classification", train_file="train.txt"),
    "conll-no-tag-column": Case({"train.txt": "EU NNP B-ORG\n"}, ("train.txt:1: no tag_column 5",),
                                task="token-classification", settings=["tag_column=5"], train_file="train.txt"),
    "conll-validation-tag-unseen-in-training": Case({"train.txt": "EU B-ORG\nrejects O\n", "dev.txt": "Peter B-PER\n"},
                                                    ("dev.txt:1: tag 'B-PER' is not one of the training file's tags "
                                                     "['O', 'B-ORG']: the model has no output for it",),
                                                    task="token-classification", settings=["validation_file=dev.txt"],
                                                    train_file="train.txt"),
    "all-texts-control-characters": Case({"train.tsv": tsv("\x01\x02\t1", " \x7f\t0")},
                                         ("train.tsv: every example's text is blank or only control characters",)),
    "conll-validation-tag-unknown": Case({"train.txt": "EU B-ORG\n", "dev.txt": "Peter B-PERSON\n"},
                                         ("dev.txt:1: tag 'B-PERSON' is not one of label_names",),
                                         task="token-classification",
                                         settings=["label_names=[O, B-ORG]", "validation_file=dev.txt"],
                                         train_file="train.txt"),
    # ---- SQuAD
    "squad-start-outside": Case({"train.json": squad([qa(start=99)])},
                                ("train.json: question 'q1'", "answer_start 99 is outside the context (46 characters)"),
                                task="qa", train_file="train.json"),
    "squad-negative-start": Case({"train.json": squad([qa(start=-3)])}, ("answer_start -3 is outside the context",),
                                 task="qa", train_file="train.json"),
    "squad-text-mismatch": Case({"train.json": squad([qa(text="Normandy", start=4)])},
                                ("train.json: question 'q1'", "answer 'Normandy' does not match the context at "
                                 "answer_start 4 ('Normans ')"), task="qa", train_file="train.json"),
    "squad-fractional-start": Case({"train.json": squad([qa(start=4.5)])},
                                   ("question 'q1'", "answer_start 4.5 is not a whole character offset"),
                                   task="qa", train_file="train.json"),
    "squad-empty-answer": Case({"train.json": squad([qa(text="")])}, ("question 'q1'", "the answer text is empty"),
                               task="qa", train_file="train.json"),
    "squad-start-string": Case({"train.json": squad([qa(start="4")])},
                               ("answers[0].answer_start should be an integer or a number, got a string",),
                               task="qa", train_file="train.json"),
    "squad-start-bool": Case({"train.json": squad([qa(start=True)])},
                             ("answer_start should be an integer or a number, got a boolean",),
                             task="qa", train_file="train.json"),
    "squad-text-number": Case({"train.json": squad([qa(text=7)])}, ("answers[0].text should be a string, got an integer",),
                              task="qa", train_file="train.json"),
    "squad-question-null": Case({"train.json": squad([{"id": "q", "question": None, "answers": []}])},
                                ("qas[0].question should be a string, got null",), task="qa", train_file="train.json"),
    "squad-answers-object": Case({"train.json": squad([{"id": "q", "question": "?", "answers": {"text": "x"}}])},
                                 ("qas[0].answers should be an array, got an object",), task="qa",
                                 train_file="train.json"),
    "squad-context-number": Case({"train.json": squad([qa()], context=12)},
                                 ("paragraphs[0].context should be a string, got an integer",), task="qa",
                                 train_file="train.json"),
    "squad-data-object": Case({"train.json": '{"data": {"title": "t"}}'}, ("top level.data should be an array",),
                              task="qa", train_file="train.json"),
    "squad-duplicate-ids": Case({"train.json": squad([qa("same"), qa("same")])},
                                ("question id 'same' appears twice", "ids must be unique"), task="qa",
                                train_file="train.json"),
    "squad-missing-id": Case({"train.json": squad([{"question": "?", "answers": []}])},
                             ("data[0].paragraphs[0].qas[0] has no key 'id'",), task="qa", train_file="train.json"),
    "squad-invalid-json": Case({"train.json": '{"data": [\n {"title": }]}'}, ("train.json:2: invalid JSON",),
                               task="qa", train_file="train.json"),
    # ---- similarity scores
    "sts-score-above-5": Case({"sts.csv": STS_ROW.format("4.0") + STS_ROW.format("5.2")},
                              ("sts.csv:2: score '5.2' is outside the score range [0, 5]",),
                              task="similarity", train_file="sts.csv"),
    "sts-score-negative": Case({"sts.csv": STS_ROW.format("-1")}, ("sts.csv:1: score '-1' is outside the score range",),
                               task="similarity", train_file="sts.csv"),
    "sts-score-nan": Case({"sts.csv": STS_ROW.format("nan")}, ("sts.csv:1: score 'nan' is not finite",),
                          task="similarity", train_file="sts.csv"),
    "sts-short-row": Case({"sts.csv": "g\tf\t2012\t1\t4.0\tonly one\n"}, ("sts.csv:1: expected at least 7",),
                          task="similarity", train_file="sts.csv"),
    "pairs-below-range": Case({"pairs.csv": PAIRS + "u,v,0.5,train\n"},
                              ("pairs.csv:4: score '0.5' is outside the score range [1, 5]",),
                              task="similarity", settings=PAIR_SETTINGS, train_file="pairs.csv"),
    "pairs-score-word": Case({"pairs.csv": PAIRS + "u,v,high,train\n"}, ("pairs.csv:4: score 'high' is not a number",),
                             task="similarity", settings=PAIR_SETTINGS, train_file="pairs.csv"),
    "pairs-score-empty": Case({"pairs.csv": PAIRS + "u,v,,train\n"}, ("pairs.csv:4: score '' is not a number",),
                              task="similarity", settings=PAIR_SETTINGS, train_file="pairs.csv"),
    "pairs-default-range": Case({"pairs.csv": PAIRS + "u,v,7,train\n"},
                                ("pairs.csv:4: score '7' is outside the score range [0, 5]",
                                 "declare the file's range with score_range"),
                                task="similarity", settings=PAIR_SETTINGS[:3], train_file="pairs.csv"),
}


@pytest.mark.parametrize("case", list(FINETUNE_CASES.values()), ids=list(FINETUNE_CASES))
def test_bad_training_file(cli, folders, case):
    write_files(case.files)
    out = cli("finetune", f"task={case.task}", f"model={folders['encoder']}", f"train_file={case.train_file}",
              "output_dir=run", "max_steps=1", "device=cpu", "max_length=64", "max_query_length=16", "doc_stride=16", *case.settings)
    out.one_line_error(*case.needles, code=2)  # a wrong input


# ---- data settings: stopped before anything is read, naming the key and the value
SETTING_CASES = {
    "max_train_examples=-1": ["max_train_examples=-1 is out of range: expected an integer >= 1 or null"],
    "max_train_examples=0": ["max_train_examples=0 is out of range"],
    "max_eval_examples=-5": ["max_eval_examples=-5 is out of range"],
    "squad_train_articles=0": ["qa.train_articles=0 is out of range"],  # the old key, checked where it went
    "qa.train_articles=0": ["qa.train_articles=0 is out of range"],
    "num_labels=0": ["num_labels=0 is out of range: expected an integer >= 1 or null (1 = regression)"],
    "num_labels=-2": ["num_labels=-2 is out of range"],
    "label_names=[only]": ["label_names must name two or more classes, got ['only']"],
    "label_names=[a, b, a]": ["label_names=['a', 'b', 'a'] must be distinct names"],
    "label_names=[a, b]|num_labels=3": ["num_labels=3 contradicts the 2 label_names ['a', 'b']"],
    "label_pattern=(?P<label>\\w+": ["label_pattern '(?P<label>\\\\w+' is not a regular expression"],
    "label_pattern=(\\w+) (.*)": ["has no group named 'label'"],
    "label_pattern=(?P<label>\\w+) (?P<txt>.*)": ["has no group named 'text'"],
    "label_pattern=(?P<label>.) (?P<text>.*)|task=token-classification": ["label_pattern reads labels of classification"],
    "delimiter=;;": ["delimiter must be one character (or tab, comma, semicolon, pipe), got ';;'"],
    "where=train": ["where: expected a mapping (key: value), got 'train'"],
    "where={split: {a: 1}}": ["where.split: expected str | list[str], got {'a': 1}"],
    "validation_where={}": ["validation_where must be a mapping of column to value"],
    "where={split: train}|task=token-classification": ["where / validation_where filter the rows of TSV/CSV/JSONL files",
                                                       "task token-classification"],
    "where={split: train}|task=similarity": ["where / validation_where on a similarity file need its columns"],
    "score_range=[5, 1]": ["similarity.score_range must be [low, high] with finite low < high, got [5.0, 1.0]"],
    "similarity.score_range=[0, .inf]": ["similarity.score_range must be [low, high] with finite low < high"],
    "similarity={score_range: [3]}": ["similarity.score_range must be [low, high]"],
    "text_pair_column=sentence": ["text_pair_column and text_column are both 'sentence'"],
    "label_column=sentence": ["label_column 'sentence' is also a text column"],
    "text_column=-1": ["text_column must be a 0-based column index (>= 0) or a name, got -1"],
    "tag_column=0": ["ner.tag_column and ner.word_column are both 0"],
    "ner.word_column=-1": ["ner.tag_column and ner.word_column are both -1"],
    "encoding=utf9": ["encoding='utf9' is not a known text encoding: name a Python codec"],
    "encoding=base64": ["encoding='base64' is not a known text encoding"],
}


@pytest.mark.parametrize("settings", list(SETTING_CASES), ids=list(SETTING_CASES))
def test_bad_data_setting(cli, folders, settings):
    write_files({"train.tsv": tsv(*GOOD_ROWS)})
    out = cli("finetune", f"model={folders['encoder']}", "train_file=train.tsv", "output_dir=run", "max_steps=1",
              "device=cpu", *settings.split("|"))
    assert out.code in (1, 2)  # a usage error or a failed run: never a traceback, never a run
    out.one_line_error(*SETTING_CASES[settings])
    assert not (out.err and "Traceback" in out.err)


# ---- evaluate, predict and embed inputs
INFERENCE_CASES = {
    "predict-txt-latin1": ("classifier", ["predict", "--input", "in.txt", "--output", "out.jsonl"],
                           {"in.txt": b"fine\n" + LATIN1 + b"\n"}, ("in.txt:2: not UTF-8 text (byte 0xe9",)),
    "predict-empty-txt": ("classifier", ["predict", "--input", "in.txt", "--output", "out.jsonl"],
                          {"in.txt": b""}, ("in.txt: no lines to read (the file is empty)",)),
    "predict-tsv-header-only": ("classifier", ["predict", "--input", "in.tsv", "--output", "out.jsonl"],
                                {"in.tsv": "sentence\n"}, ("in.tsv: only a header line, no data rows",)),
    "predict-where-no-row": ("classifier", ["predict", "--input", "in.tsv", "--output", "o.jsonl",
                                            "--where", "split=test"],
                             {"in.tsv": "sentence\tsplit\na\tTest\n"}, ("in.tsv: no row has 'split' = 'test'",)),
    "predict-bad-where-flag": ("classifier", ["predict", "--input", "in.tsv", "--output", "o.jsonl", "--where", "test"],
                               {"in.tsv": "sentence\na\n"}, ("--where 'test' is not COLUMN=VALUE",)),
    "predict-qa-duplicate-ids": ("qa", ["predict", "--input", "q.jsonl", "--output", "out.jsonl"],
                                 {"q.jsonl": '{"id": 1, "question": "a?", "context": "b"}\n'
                                             '{"id": "1", "question": "c?", "context": "d"}\n'},
                                 ("q.jsonl:2: id '1' is already used on line 1",)),
    "predict-qa-question-number": ("qa", ["predict", "--input", "q.jsonl", "--output", "out.jsonl"],
                                   {"q.jsonl": '{"question": 5, "context": "b"}\n'},
                                   ("q.jsonl:1: 'question' is int, expected a text",)),
    "predict-qa-squad-bad-answer": ("qa", ["predict", "--input", "dev.json", "--output", "out.jsonl"],
                                    {"dev.json": squad([qa(start=7)])},
                                    ("dev.json: question 'q1'", "does not match", "or set --skip-bad-answers to leave")),
    "predict-pairs-three-columns": ("bi-encoder", ["predict", "--input", "p.txt", "--output", "o.jsonl"],
                                    {"p.txt": "a\tb\tc\n"}, ("p.txt:1: expected 2 tab-separated sentences, got 3",
                                                             "--text-pair-column")),
    "predict-pairs-jsonl-number": ("bi-encoder", ["predict", "--input", "p.jsonl", "--output", "o.jsonl"],
                                   {"p.jsonl": '{"sentence1": "a", "sentence2": 3}\n'},
                                   ("p.jsonl:1: 'sentence1' and 'sentence2' must be texts",)),
    "evaluate-latin1": ("classifier", ["evaluate", "--data", "dev.tsv", "--output", "e.json"],
                        {"dev.tsv": tsv("a\t1").encode() + LATIN1 + b"\t0\n"},
                        ("dev.tsv:3: not UTF-8 text", "name its encoding with --encoding latin-1")),
    "evaluate-unknown-encoding": ("classifier", ["evaluate", "--data", "dev.tsv", "--encoding", "utf9"],
                                  {"dev.tsv": tsv("a\t1")}, ("--encoding 'utf9' is not a known text encoding",)),
    "evaluate-no-such-column": ("classifier", ["evaluate", "--data", "dev.tsv", "--output", "e.json"],
                                {"dev.tsv": tsv("a\t1", header="text\tlabel")},
                                ("dev.tsv:1: header has no column 'sentence'", "set --no-header and give columns")),
    "evaluate-label-outside-model": ("classifier", ["evaluate", "--data", "dev.tsv", "--output", "e.json"],
                                     {"dev.tsv": tsv("a\t1", "b\t2")},
                                     ("dev.tsv:3: label '2' is not one of label_names ['neg', 'pos'] nor a class id",)),
    "evaluate-pairs-out-of-range": ("bi-encoder", ["evaluate", "--data", "p.csv", "--output", "e.json",
                                                   "--text-column", "a", "--text-pair-column", "b", "--label-column",
                                                   "score", "--score-range", "1", "5"],
                                    {"p.csv": PAIRS + "u,v,9,dev\n"},
                                    ("p.csv:4: score '9' is outside the score range [1, 5]",)),
    "evaluate-squad-duplicate": ("qa", ["evaluate", "--data", "dev.json", "--output", "e.json"],
                                 {"dev.json": squad([qa("x"), qa("x")])}, ("question id 'x' appears twice",)),
    "embed-latin1": ("bi-encoder", ["embed", "--input", "in.txt", "--output", "v.npy"],
                     {"in.txt": b"ok\n" + LATIN1 + b"\n"}, ("in.txt:2: not UTF-8 text", "--encoding latin-1")),
    "embed-txt-comma-columns": ("bi-encoder", ["embed", "--input", "in.txt", "--output", "v.npy", "--text-column", "t"],
                                {"in.txt": "id,t\n1,ok\n"}, ("in.txt:1: no column 't': a .txt file is one text per "
                                                              "line", "set --delimiter comma to read it as columns")),
    "predict-missing-input": ("classifier", ["predict", "--input", "nope.txt", "--output", "o.jsonl"], {},
                              ("input file not found: nope.txt",)),
    "embed-empty": ("bi-encoder", ["embed", "--input", "in.txt", "--output", "v.npy"], {"in.txt": b""},
                    ("in.txt: no lines to read",)),
    "embed-folder-input": ("bi-encoder", ["embed", "--input", ".", "--output", "v.npy"], {},
                           ("input file is a folder, not a file: .",)),
    "embed-column-missing": ("bi-encoder", ["embed", "--input", "in.csv", "--output", "v.npy", "--text-column", "text"],
                             {"in.csv": "sentence,id\na,1\n"}, ("in.csv:1: header has no column 'text'",)),
    "embed-column-number": ("bi-encoder", ["embed", "--input", "in.jsonl", "--output", "v.npy", "--text-column", "t"],
                            {"in.jsonl": '{"t": "ok"}\n{"t": 12}\n'}, ("in.jsonl:2: column 't' holds int",)),
}


@pytest.mark.parametrize("case", list(INFERENCE_CASES.values()), ids=list(INFERENCE_CASES))
def test_bad_inference_input(cli, folders, case):
    model, argv, files, needles = case
    write_files(files)
    out = cli(*argv, "--model", str(folders[model]), "--device", "cpu")
    out.one_line_error(*needles, code=2)


# ---- pretraining corpora and tokenizer training
def test_pretrain_corpus_not_utf8(cli, folders):
    write_files({"corpus.txt": b"first document\n\nsecond " + LATIN1 + b"\n"})
    out = cli("pretrain", f"model={folders['encoder']}", "train_files=[corpus.txt]", "output_dir=run", "max_steps=1",
              "device=cpu", "nsp=false", "batch_size=2", "max_length=32")
    out.one_line_error("corpus.txt:3: not UTF-8 text (byte 0xe9 at column 11)", code=2)


def test_pretrain_jsonl_text_not_a_string(cli, folders):
    write_files({"corpus.jsonl": '{"text": "a document"}\n{"text": 7}\n'})
    out = cli("pretrain", f"model={folders['encoder']}", "train_files=[corpus.jsonl]", "corpus_format=jsonl",
              "output_dir=run", "max_steps=1", "device=cpu", "nsp=false")
    out.one_line_error("corpus.jsonl:2: field 'text' is int, not str", code=2)


@pytest.mark.parametrize("data,fmt,needle", [
    (bytes(range(256)) * 8, "text", "weights.bin:2: not UTF-8 text (byte 0x80 at column 118)"),
    (b"text\n" * 3 + b"\x00\x01\x02", "lines", "weights.bin:4: NUL byte: this is a binary file"),
    (b" = T = \n ok " + LATIN1 + b" \n", "wikitext", "weights.bin:2: not UTF-8 text"),
    (b'{"text": "ok"}\n{"text": "' + LATIN1 + b'"}\n', "jsonl", "weights.bin:2: not UTF-8 text"),
])
def test_tokenizer_train_on_a_binary_or_non_utf8_file(cli, data, fmt, needle):
    write_files({"weights.bin": data})
    out = cli("tokenizer", "train", "--files", "weights.bin", "--vocab-size", "100", "--output", "tok", "--format", fmt)
    out.one_line_error(needle, code=2)


# ---- awkward but valid: the correct result
def test_bom_crlf_headerless_tsv_trains_on_every_row(cli, folders, tmp_path):
    write_files({"train.tsv": BOM + b"1\ta fine film\r\n0\tso dull\r\n1\tgreat fun\r\n"})
    out = cli("finetune", f"model={folders['encoder']}", "train_file=train.tsv", "output_dir=run", "max_steps=1",
              "device=cpu", "text_column=1", "label_column=0", "--output", "r.json")
    assert out.code == 0, out.err
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["train_examples"] == 3 and results["steps"] == 1


def test_latin1_files_train_with_their_encoding(cli, folders, tmp_path):
    write_files({"train.tsv": tsv(*GOOD_ROWS).encode() + LATIN1 + b"\t0\n",
                 "train.txt": b"EU B-ORG\n\n" + LATIN1 + b" O\n"})
    out = cli("finetune", f"model={folders['encoder']}", "train_file=train.tsv", "output_dir=run", "max_steps=1",
              "device=cpu", "encoding=latin-1", "--output", "r.json")
    assert out.code == 0, out.err
    assert json.loads((tmp_path / "r.json").read_text())["train_examples"] == 4
    out = cli("finetune", "task=token-classification", f"model={folders['encoder']}", "train_file=train.txt",
              "output_dir=ner", "max_steps=1", "device=cpu", "encoding=latin-1", "--output", "n.json")
    assert out.code == 0, out.err
    assert json.loads((tmp_path / "n.json").read_text())["train_examples"] == 2


def test_texts_of_control_characters_are_left_out_of_training_and_counted(cli, folders, tmp_path):
    write_files({"train.tsv": tsv("a fine film\t1", "\x01\x02\x03\t0", "so dull\t0", "\u200b \t1", "great\t1")})
    out = cli("finetune", f"model={folders['encoder']}", "train_file=train.tsv", "output_dir=run", "max_steps=1",
              "device=cpu", "--output", "r.json")
    assert out.code == 0, out.err
    assert ("train.tsv: left out 2 example(s) whose text is blank or only control characters (line 3, 5): they give "
            "the model no token to learn from") in out.err
    assert json.loads((tmp_path / "r.json").read_text())["train_examples"] == 3


def test_conll_with_a_byte_order_mark_is_not_a_bogus_sentence(cli, folders, tmp_path):
    conll = "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n"
    write_files({"train.txt": BOM + conll.replace("\n", "\r\n").encode()})
    out = cli("finetune", "task=token-classification", f"model={folders['encoder']}", "train_file=train.txt",
              "output_dir=run", "max_steps=1", "device=cpu", "--output", "r.json")
    assert out.code == 0, out.err
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["train_examples"] == 2  # two sentences; the marker line is no word
    labels = json.loads((tmp_path / "run" / "best" / "config.json").read_text())["id2label"]
    assert sorted(labels.values()) == ["B-ORG", "B-PER", "O"]


def test_skip_bad_answers_trains_on_the_good_ones(cli, folders, tmp_path):
    write_files({"train.json": squad([qa("good"), qa("bad", start=9), qa("also", "France", 39)])})
    out = cli("finetune", "task=qa", f"model={folders['encoder']}", "train_file=train.json", "output_dir=run",
              "max_steps=1", "device=cpu", "max_length=64", "max_query_length=16", "doc_stride=16", "skip_bad_answers=true",
              "--output", "r.json")
    assert out.code == 0, out.err
    assert "train.json: skipped 1 answer(s) that do not match their context; dropped 1 question(s)" in out.err
    assert json.loads((tmp_path / "r.json").read_text())["num_train_features"] == 2


def test_unicode_line_separator_inside_a_line_is_one_prediction(cli, folders, tmp_path):
    write_files({"in.txt": "one\u2028still one\nsecond\x0cline\n"})
    out = cli("predict", "--model", str(folders["classifier"]), "--input", "in.txt", "--output", "out.jsonl",
              "--device", "cpu")
    assert out.code == 0, out.err
    lines = (tmp_path / "out.jsonl").read_text(encoding="utf-8").split("\n")[:-1]  # splitlines would cut at U+2028
    texts = [json.loads(line)["text"] for line in lines]
    assert texts == ["one\u2028still one", "second\x0cline"]


def test_wikitext_unk_is_one_unknown_token(folders, tmp_path):
    from bert_kit.data.token_cache import tokenize_to_cache

    path = tmp_path / "wiki.txt"
    path.write_text(" = A = \n the <unk> of <unk> \n", encoding="utf-8")
    tokenizer = get_tokenizer(folders["encoder"])
    cache = tokenize_to_cache(path, tokenizer, tmp_path / "cache", mode="wikitext", progress=False)
    assert cache.document(0).tolist() == tokenizer.encode("the [UNK] of [UNK]")[1:-1]
    assert cache.document(0).tolist().count(tokenizer.unk_token_id) == 2
    # and the masked LM is never asked to predict it: [UNK] is a special token to the masking
    from bert_kit.data.masking import DataCollatorForMLM

    ids = [tokenizer.cls_token_id] + [tokenizer.unk_token_id, 1996] * 200 + [tokenizer.sep_token_id]
    batch = DataCollatorForMLM(tokenizer, mask_probability=0.5, seed=0)([ids] * 4)
    chosen = batch["labels"] != -100
    assert chosen.sum() > 300 and not (batch["labels"][chosen] == tokenizer.unk_token_id).any()


def test_head_and_label_names_disagree(cli, folders, tmp_path, minilm_path):
    """A folder whose id2label names fewer classes than its head has outputs (written by hand, or
    by an older version that trained three outputs for two label_names) is refused, not used to
    report probabilities that sum to 0.67."""
    folder = tmp_path / "three_outputs"
    model = BERTForSequenceClassification(TINY, num_labels=3)
    with pytest.raises(ValueError, match="id2label names 2 labels"):  # refused from Python at once
        model.id2label = {"0": "neg", "1": "pos"}
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = {"0": "neg", "1": "pos"}  # written by hand
    (folder / "config.json").write_text(json.dumps(config))
    get_tokenizer(minilm_path).save(folder)
    write_model_metadata(folder, {"task": "classification"})
    write_files({"in.txt": "fine\n"})
    out = cli("predict", "--model", str(folder), "--input", "in.txt", "--output", "o.jsonl", "--device", "cpu")
    out.one_line_error("the head has 3 outputs but config.json names 2 labels ['neg', 'pos']", code=2)


def test_embed_a_column_of_a_table(cli, folders, tmp_path):
    import numpy as np

    write_files({"in.csv": BOM + b"id,text,split\r\n1,a fine film,train\r\n2,so dull,test\r\n3,great,test\r\n"})
    out = cli("embed", "--model", str(folders["bi-encoder"]), "--input", "in.csv", "--output", "v.npy",
              "--text-column", "text", "--where", "split=test", "--device", "cpu", "--max-length", "32")
    assert out.code == 0, out.err
    vectors = np.load(tmp_path / "v.npy")
    assert vectors.shape == (2, 32)
    write_files({"one.txt": "so dull\n"})
    alone = cli("embed", "--model", str(folders["bi-encoder"]), "--input", "one.txt", "--output", "w.npy",
                "--device", "cpu", "--max-length", "32")
    assert alone.code == 0, alone.err
    np.testing.assert_allclose(vectors[0], np.load(tmp_path / "w.npy")[0], atol=1e-6)


# ---- long texts: every command that cuts them to max_length says how many, once, before the work
LONG = "the film starts slowly " * 12 + "and the end is great"  # 55 tokens with [CLS] and [SEP]


def truncation_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "were longer than" in line]


def test_long_texts_are_cut_and_counted_by_every_command(cli, folders, tmp_path):
    import numpy as np

    short = ["a fine film", "so dull", "great fun", "awful"]
    write_files({"train.tsv": tsv(*(f"{t}\t{i % 2}" for i, t in enumerate(short + [LONG, LONG + " indeed"]))),
                 "in.txt": "\n".join(short + [LONG]) + "\n",
                 "pairs.tsv": "a fine film\tgreat fun\n" + f"{LONG}\tso dull\n"})
    expected = "2 of 6 texts were longer than max_length 32 and were cut (median 55 tokens, longest 56)"
    run = cli("finetune", "task=classification", f"model={folders['encoder']}", "train_file=train.tsv",
              "validation_file=train.tsv", "output_dir=run", "max_steps=1", "device=cpu", "max_length=32")
    assert run.code == 0, run.err
    assert truncation_lines(run.err) == [f"train.tsv: {expected}; set max_length higher (up to the model's 128 "
                                         "positions) to keep more of each"] * 2  # the training and validation file
    flags = ["--model", str(folders["classifier"]), "--device", "cpu"]
    evaluated = cli("evaluate", *flags, "--data", "train.tsv")
    assert evaluated.code == 0 and truncation_lines(evaluated.err) == [
        f"train.tsv: {expected.replace('max_length', '--max-length')}; set --max-length higher (up to the model's "
        "128 positions) to keep more of each"], evaluated.err
    predicted = cli("predict", *flags, "--input", "in.txt", "--output", "p.jsonl")
    assert predicted.code == 0 and len(truncation_lines(predicted.err)) == 1, predicted.err
    assert "in.txt: 1 of 5 texts were longer than --max-length 32" in predicted.err
    records = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["truncated"] for r in records] == [False] * 4 + [True]  # each cut row is marked
    embedded = cli("embed", "--model", str(folders["bi-encoder"]), "--input", "in.txt", "--output", "v.npy",
                   "--device", "cpu")
    assert embedded.code == 0 and np.load(tmp_path / "v.npy").shape == (5, 32)
    assert truncation_lines(embedded.err) == ["in.txt: 1 of 5 texts were longer than --max-length 32 and were cut "
                                              "(median 55 tokens, longest 55); set --max-length higher (up to the "
                                              "model's 128 positions) to keep more of each"]
    pairs = cli("predict", "--model", str(folders["bi-encoder"]), "--device", "cpu", "--input", "pairs.tsv",
                "--output", "s.jsonl")
    assert pairs.code == 0 and "pairs.tsv: 1 of 2 pairs were longer than --max-length 32" in pairs.err, pairs.err
    assert [json.loads(line)["truncated"] for line in (tmp_path / "s.jsonl").read_text().splitlines()] == [False, True]
    # QA reads long contexts in windows but cuts questions to max_query_length (16 for this folder)
    write_files({"q.jsonl": json.dumps({"question": "who " * 30 + "?", "context": SQUAD_CONTEXT}) + "\n" +
                 json.dumps({"question": "Who?", "context": SQUAD_CONTEXT * 20}) + "\n"})
    answered = cli("predict", "--model", str(folders["qa"]), "--device", "cpu", "--input", "q.jsonl", "--output",
                   "a.jsonl")
    assert answered.code == 0 and truncation_lines(answered.err) == [
        "q.jsonl: 1 of 2 questions were longer than max_query_length 16 and were cut (median 31 tokens, longest 31); "
        "set max_query_length higher to keep more of each"], answered.err
    # nothing cut, nothing said
    quiet = cli("evaluate", *flags, "--data", "train.tsv", "--max-length", "128", "--output", "e.json")
    assert quiet.code == 0 and not truncation_lines(quiet.err)
