"""Jobs: pretraining, and fine-tuning on four tasks, each plugging what differs into the one loop.

| task                 | files                          | model (role)                   | best/ kept by |
| -------------------- | ------------------------------ | ------------------------------ | ------------- |
| classification       | TSV/CSV/JSONL/TXT text, label  | ForSequenceClassification      | accuracy (pearson if num_labels=1) |
| token-classification | CoNLL (word ... tag)           | ForTokenClassification         | entity f1     |
| qa                   | SQuAD v1.1 JSON                | ForQuestionAnswering           | f1            |
| similarity           | STS-B, or any pair file + score | cross-encoder: regression head | spearman      |
|                      |                                | bi-encoder: the encoder, cosine |               |

A task names its model by role; `bert_kit.families` gives the class of the model's architecture
(`BERTForSequenceClassification`, `ModernBertForSequenceClassification`, ...).

Tables are read in any layout of `bert_kit.data.tables` (header or not, columns by name or
index, a `where` filter); the data settings are checked by `data_settings.check_data_settings`.

`pretraining.py` is the MLM (+ NSP) job; `finetuning.py` runs any of the four tasks above;
`inference.py` loads a fine-tuned folder for `evaluate` and `predict`.
"""

from __future__ import annotations

from typing import Any

TASKS = ("classification", "token-classification", "qa", "similarity")


def task_classes() -> dict[str, type]:
    """Task name -> class (imported here, on demand: the task modules import torch)."""
    from bert_kit.tasks.classification import ClassificationTask
    from bert_kit.tasks.qa import QATask
    from bert_kit.tasks.similarity import SimilarityTask
    from bert_kit.tasks.token_classification import TokenClassificationTask

    return {"classification": ClassificationTask, "token-classification": TokenClassificationTask,
            "qa": QATask, "similarity": SimilarityTask}


def make_task(name: str, settings: Any) -> Any:
    """The `Task` object for `name`, reading its settings from `settings` (a FinetuneConfig)."""
    if name not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {name!r}")
    return task_classes()[name](settings)
