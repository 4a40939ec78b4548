"""Small GLUE files in each task's official layout (the `glue_data` folders), for the tests.

Every quirk of the release that a reader can trip on is here: CoLA without a header and with an
empty third column, SST-2's trailing spaces, MRPC's byte-order mark and `#1 String` columns,
fields that start with a `"` (quoting is never used), STS-B's ten columns, QQP's pair broken in
two lines by a line break inside a question, MNLI's 12-column train.tsv and 16-column dev files.
`EXPECTED[task]` is what a reader must find in the train file: (first text, second text, label)
of its first row, and its number of examples.
"""

from __future__ import annotations

from pathlib import Path

WORDS = "the cat sat on a mat while dogs ran past red houses near old trees".split()


def sentence(i: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(3 + i % 4)) + "."


def _write(path: Path, lines: list[str], final_newline: bool = True, bom: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + ("\n" if final_newline else "")
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode())


def write_task(root: Path, task: str, n: int = 12) -> None:
    """TASK's train and dev files under root, n rows each (dev: n // 2 + 2), in the release layout."""
    for split, rows in (("train", n), ("dev", n // 2 + 2)):
        if task == "cola":  # no header: source, label, original judgement (empty or *), sentence
            lines = [f"gj04\t{i % 2}\t{'' if i % 2 else '*'}\t{sentence(i)}" for i in range(rows)]
            lines[1] = f'gj04\t1\t\t"Quoted," she said {sentence(1)}'
            _write(root / "CoLA" / f"{split}.tsv", lines, final_newline=split == "train")  # dev: no final newline
        elif task == "sst2":
            lines = [f"{sentence(i)} \t{i % 2}" for i in range(rows)]  # a space ends each sentence
            _write(root / "SST-2" / f"{split}.tsv", ["sentence\tlabel"] + lines)
        elif task == "mrpc":  # a byte-order mark, the Quality column first
            lines = [f"{i % 2}\t{1000 + i}\t{2000 + i}\t{sentence(i)}\t{sentence(i + 1)}" for i in range(rows)]
            lines[0] = f'1\t1000\t2000\t{sentence(0)}\t"The {sentence(1)}'
            _write(root / "MRPC" / f"{split}.tsv", ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + lines, bom=True)
        elif task == "stsb":
            head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
            lines = [f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{sentence(i)}\t{sentence(i + 2)}\t"
                     f"{(i * 0.7) % 5:.3f}" for i in range(rows)]
            _write(root / "STS-B" / f"{split}.tsv", [head] + lines)
        elif task == "qqp":  # a question holding a line break splits its row in two lines
            lines = [f"{i}\t{2 * i}\t{2 * i + 1}\t{sentence(i)}?\t{sentence(i + 3)}?\t{i % 2}" for i in range(rows)]
            if split == "train":
                lines[2:3] = [f'2\t4\t5\t"How do I {sentence(2)}', f'"\tWas it {sentence(5)}?\t0']
            _write(root / "QQP" / f"{split}.tsv", ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"] + lines)
        elif task == "mnli":  # train: 12 columns; dev_matched / dev_mismatched: 16 (five annotator labels)
            labels = ("entailment", "neutral", "contradiction")
            parses = ("( ( The cat ) sat )\t( ( A dog ) ran )\t(ROOT (S (NP The cat) (VP sat)))\t"
                      "(ROOT (S (NP A dog) (VP ran)))")
            if split == "train":
                head = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t" \
                       "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label"
                lines = [f"{i}\t{31193 + i}\t{31193 + i}n\tgovernment\t{parses}\t{sentence(i)}\t{sentence(i + 1)}\t"
                         f"{labels[i % 3]}\t{labels[i % 3]}" for i in range(rows)]
                _write(root / "MNLI" / "train.tsv", [head] + lines)
                continue
            head = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t" \
                   "sentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label"
            for name, offset in (("dev_matched", 0), ("dev_mismatched", 1)):
                lines = [f"{i}\t{63735 + i}\t{63735 + i}n\tfiction\t{parses}\t{sentence(i + offset)}\t{sentence(i)}\t"
                         + "\t".join([labels[(i + offset) % 3]] * 5) + f"\t{labels[(i + offset) % 3]}"
                         for i in range(rows + offset)]
                _write(root / "MNLI" / f"{name}.tsv", [head] + lines)
        elif task in ("qnli", "rte", "wnli"):
            folder, head = {"qnli": ("QNLI", "index\tquestion\tsentence\tlabel"),
                            "rte": ("RTE", "index\tsentence1\tsentence2\tlabel"),
                            "wnli": ("WNLI", "index\tsentence1\tsentence2\tlabel")}[task]
            names = ("0", "1") if task == "wnli" else ("entailment", "not_entailment")
            lines = [f"{i}\t{sentence(i)}\t{sentence(i + 4)}\t{names[i % 2]}" for i in range(rows)]
            _write(root / folder / f"{split}.tsv", [head] + lines)
        else:
            raise ValueError(task)


def write_glue(root: Path, tasks: tuple[str, ...] = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte",
                                                         "wnli"), n: int = 12) -> Path:
    for task in tasks:
        write_task(root, task, n)
    return root


# (first text, second text, label id or score) of the first train row, and the train examples (n=12)
EXPECTED = {
    "cola": (sentence(0), None, 0, 12),
    "sst2": (sentence(0), None, 0, 12),
    "mrpc": (sentence(0), f'"The {sentence(1)}', 1, 12),
    "stsb": (sentence(0), sentence(2), 0.0, 12),
    "qqp": (sentence(0) + "?", sentence(3) + "?", 0, 11),  # the broken pair's two lines are left out
    "mnli": (sentence(0), sentence(1), 0, 12),  # entailment is id 0
    "qnli": (sentence(0), sentence(4), 0, 12),
    "rte": (sentence(0), sentence(4), 0, 12),
    "wnli": (sentence(0), sentence(4), 0, 12),
}
