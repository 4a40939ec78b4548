"""What checking data files costs: bert-kit's readers against the plainest reading of the same files.

Each row reads one real file the way a task does (layout detection, UTF-8 decoding with line
numbers, column lookup, label / answer / tag checks) and, as the reference, the least a script
could do without any check (split on tabs, json.load and flatten, str.split per line). The
tokenizer row trains WordPiece on WikiText-2 (2M words) with bert-kit's deterministic two-pass
`train_tokenizer` and, as the reference, one pass of the `tokenizers` trainer (what it did before:
a vocabulary that changes from process to process). Best of `--repeats` wall times, one process.

    python benchmarks/data_readers.py                       # data from ../shared/data
    python benchmarks/data_readers.py --repeats 5 --vocab-size 8000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_kit.data.classification import read_classification_file  # noqa: E402
from bert_kit.data.corpus import read_documents  # noqa: E402
from bert_kit.data.ner import read_conll  # noqa: E402
from bert_kit.data.squad import read_squad  # noqa: E402
from bert_kit.data.sts import read_sts  # noqa: E402
from bert_kit.tokenizer_files import DEFAULT_SPECIAL_TOKENS  # noqa: E402
from bert_kit.tokenizer_training import train_tokenizer  # noqa: E402


def best_time(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def plain_tsv(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t") for line in f][1:]


def plain_squad(path: Path) -> list[dict]:
    root = json.loads(path.read_text(encoding="utf-8"))
    return [{"id": q["id"], "context": p["context"], "question": q["question"], "answers": q["answers"]}
            for a in root["data"] for p in a["paragraphs"] for q in p["qas"]]


def plain_conll(path: Path) -> list[list[list[str]]]:
    sentences, words = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if not fields or fields[0] == "-DOCSTART-":
                if words:
                    sentences.append(words)
                words = []
            else:
                words.append(fields)
    return sentences + ([words] if words else [])


def plain_sts(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t")[4:7] for line in f]


def one_pass_trainer(path: str, vocab_size: int) -> int:
    """The `tokenizers` WordPiece trainer, one pass, as train_tokenizer ran before."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, trainers
    from tokenizers.models import WordPiece

    backend = Tokenizer(WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=2, limit_alphabet=1000,
                                        special_tokens=list(DEFAULT_SPECIAL_TOKENS.values()),
                                        continuing_subword_prefix="##", show_progress=False)
    backend.train([path], trainer)
    return backend.get_vocab_size()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vocab-size", type=int, default=30522)
    args = p.parse_args()
    d = args.data_dir
    rows = [
        ("SST-2 train.tsv (67,349 rows)", lambda: read_classification_file(d / "sst2" / "train.tsv").texts,
         lambda: plain_tsv(d / "sst2" / "train.tsv")),
        ("STS-B sts-train.csv (5,749 pairs)", lambda: read_sts(d / "stsb" / "sts-train.csv")[0],
         lambda: plain_sts(d / "stsb" / "sts-train.csv")),
        ("CoNLL-2003 train.txt (14,041 sentences)", lambda: read_conll(d / "conll2003" / "train.txt"),
         lambda: plain_conll(d / "conll2003" / "train.txt")),
        ("SQuAD dev-v1.1.json (10,570 questions)", lambda: read_squad(d / "squad-v1.1" / "dev-v1.1.json"),
         lambda: plain_squad(d / "squad-v1.1" / "dev-v1.1.json")),
    ]
    print(f"{'file':42s} {'bert-kit':>10s} {'reference':>10s} {'ratio':>6s}  rows")
    for name, ours, reference in rows:
        t_ours, out = best_time(ours, args.repeats)
        t_ref, ref = best_time(reference, args.repeats)
        assert len(out) == len(ref), (name, len(out), len(ref))
        print(f"{name:42s} {t_ours * 1e3:8.0f}ms {t_ref * 1e3:8.0f}ms {t_ours / t_ref:5.2f}x  {len(out)}")

    docs = read_documents(d / "wikitext-2" / "train.txt", mode="wikitext")
    with tempfile.TemporaryDirectory() as tmp:
        spilled = Path(tmp) / "wiki.txt"
        spilled.write_text("\n".join(text.replace("[UNK]", " ") for text in docs) + "\n", encoding="utf-8")
        t_ours, tok = best_time(lambda: train_tokenizer([spilled], vocab_size=args.vocab_size), args.repeats)
        t_ref, size = best_time(lambda: one_pass_trainer(str(spilled), args.vocab_size), args.repeats)
    print(f"{'train_tokenizer, WikiText-2 train':42s} {t_ours:9.1f}s {t_ref:9.1f}s {t_ours / t_ref:5.2f}x  "
          f"vocab {tok.vocab_size} / {size}")


if __name__ == "__main__":
    main()
