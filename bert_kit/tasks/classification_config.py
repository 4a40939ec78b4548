"""`ClassificationSettings`: what only sequence classification reads, the `classification:` group of a
`FinetuneConfig` (plain Python, no torch: checked with the other settings before any data is read).

    classification:
      multi_label: true             # several labels per text: sigmoid outputs, binary cross-entropy
      label_names_file: ${BERT_KIT_DATA}/goemotions/emotions.txt
      threshold: tune               # per label, on the validation set; saved with the model
      class_weights: balanced       # n_rows / (n_classes * count), as scikit-learn; a list of weights too
      long_text: chunks             # score every window of a long text, and pool the window logits
      chunk_stride: 32

On the command line: `classification.threshold=tune`, `classification.class_weights=[1, 4]`.
docs/finetuning.md describes each; `bert_kit.tasks.classification` is the task that reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bert_kit.checks import ConfigError, Range, check_settings, fraction, non_negative
from bert_kit.data.tables import column_ref

_DELIMITER_NAMES = {"comma": ",", "semicolon": ";", "pipe": "|", "space": " "}


@dataclass
class ClassificationSettings:
    """Sequence classification (task: classification): several labels per text, imbalanced classes, long texts."""

    # several labels per text (label sets)
    multi_label: bool | None = None
    """several labels per text: sigmoid outputs with binary cross-entropy (saved as HF's problem_type
    multi_label_classification). Default: detected from the labels (JSON lists, lists such as
    "joy,anger" in most rows or made of labels found alone, or label_columns); false refuses lists"""
    label_delimiter: str | None = None  # what separates the labels of a row: default the one of , ; | the labels hold
    label_columns: list[int | str] | None = None  # one 0/1 column per label (SemEval, Jigsaw), named by its column
    label_names_file: str | None = None  # a file naming the label ids 0, 1, ... one per line (GoEmotions' emotions.txt)
    threshold: float | Literal["tune"] = 0.5
    """multi-label: a label is predicted where its probability reaches this. tune: per label, the
    threshold of the best F1 on the validation set at each evaluation (a grid of 0.05 steps); saved
    with the model, used by evaluate, predict and serve"""
    # imbalanced classes
    class_weights: Literal["balanced"] | list[float] | None = None
    """weigh the loss per class. balanced: n_rows / (n_classes * rows of the class), as scikit-learn;
    multi-label: each label's pos_weight, its negative rows / its positive rows. Or one weight per class"""
    # texts longer than max_length
    long_text: Literal["truncate", "chunks"] = "truncate"
    """truncate: the first max_length tokens of a text. chunks: windows of max_length tokens over the
    whole text, each trained on as an example with its text's label; evaluation, predict and serve
    pool the windows' logits into one prediction per text"""
    chunk_stride: int | None = None  # chunks: tokens shared by consecutive windows (default a quarter of the window)
    chunk_pooling: Literal["mean", "max"] = "mean"  # chunks: how the windows' logits make the text's

    def __post_init__(self) -> None:
        check_settings(self, {"chunk_stride": non_negative(integer=True, optional=True)}, prefix="classification.")
        if not isinstance(self.threshold, str):
            fraction(low_open=True, high_open=True).check("classification.threshold", self.threshold)
        if isinstance(self.class_weights, list):
            if not self.class_weights:
                raise ConfigError("classification.class_weights=[] must hold one weight per class (or be balanced)")
            Range(0, low_open=True).check("classification.class_weights", self.class_weights)
        if self.label_delimiter is not None:
            self.label_delimiter = _DELIMITER_NAMES.get(self.label_delimiter, self.label_delimiter)
            if not self.label_delimiter or "\n" in self.label_delimiter or "\r" in self.label_delimiter:
                raise ConfigError(f"classification.label_delimiter={self.label_delimiter!r} must be a non-empty "
                                  "text on one line, such as , or ;")
        if self.label_columns is not None:
            columns = [column_ref(c, "classification.label_columns") for c in self.label_columns]
            if len(columns) < 2 or len(set(columns)) != len(columns):
                raise ConfigError(f"classification.label_columns={self.label_columns!r} must name two or more "
                                  "distinct columns, one 0/1 column per label")
            if self.multi_label is False:
                raise ConfigError("classification.label_columns holds one 0/1 column per label: a multi-label "
                                  "layout, but multi_label is false")
            self.label_columns = columns
        if self.label_names_file is not None and isinstance(self.label_names_file, Path):
            self.label_names_file = str(self.label_names_file)

    @property
    def tuned(self) -> bool:
        """Whether the thresholds are tuned on the validation set."""
        return self.threshold == "tune"


def read_label_names_file(path: str | Path, encoding: str = "utf-8") -> list[str]:
    """The label names of `path`, one per line in id order (blank lines at the end dropped): a
    file such as GoEmotions' emotions.txt. Names must be distinct, two or more."""
    from bert_kit.checks import check_input_path

    check_input_path("classification.label_names_file", path)
    lines = Path(path).read_text(encoding=encoding).splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    names = [line.strip() for line in lines]
    blank = next((i for i, name in enumerate(names) if not name), None)
    if blank is not None:
        raise ConfigError(f"{path}:{blank + 1}: a blank line among the label names (one name per line, in id order)")
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            raise ConfigError(f"{path}:{i + 1}: label name {name!r} is already on line {seen[name] + 1}")
        seen[name] = i
    if len(names) < 2:
        raise ConfigError(f"{path}: names {len(names)} label(s); a classifier needs two or more")
    return names
