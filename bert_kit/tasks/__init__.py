"""Jobs: pretraining, and fine-tuning on six tasks, each plugging what differs into the one loop.

| task                 | files                          | model (role)                   | best/ kept by |
| -------------------- | ------------------------------ | ------------------------------ | ------------- |
| classification       | TSV/CSV/JSONL/TXT text, label  | ForSequenceClassification      | accuracy (pearson if num_labels=1, |
|                      | (or labels: several per text)  |                                | f1 for several labels per text)    |
| token-classification | CoNLL (word ... tag)           | ForTokenClassification         | entity f1     |
| qa                   | SQuAD v1.1 JSON                | ForQuestionAnswering           | f1            |
| similarity           | STS-B, or any pair file + score | cross-encoder: regression head | spearman      |
|                      |                                | bi-encoder: the encoder, cosine |               |
| embedding            | text tuples (tables, NLI, BEIR  | Model, in an EmbeddingModel:   | ndcg@10 (BEIR) |
|                      | qrels, mined negatives)        | pooled; in-batch negatives     | spearman (STS) |
| reranker             | (query, passage, label), tuples | ForSequenceClassification, one | ndcg@10       |
|                      | or BEIR qrels                  | output: BCE or listwise        |               |

A task names its model by role; `bert_kit.families` gives the class of the model's architecture
(`BERTForSequenceClassification`, `ModernBertForSequenceClassification`, ...).

Tables are read in any layout of `bert_kit.data.tables` (header or not, columns by name or
index, a `where` filter); the data settings are checked by `data_settings.check_data_settings`.

`pretraining.py` is the MLM (+ NSP) job; `finetuning.py` runs any of the six tasks above;
`inference.py` loads a fine-tuned folder for `evaluate` and `predict`. A job trains with the
engine its `engine:` setting names (`engine_class`): PyTorch, or JAX (`bert_kit/jax/engine.py`).
"""

from __future__ import annotations

from typing import Any, Callable

TASKS = ("classification", "token-classification", "qa", "similarity", "embedding", "reranker")
PREDICT_TASKS = TASKS[:4]  # what `bert-kit predict` runs (an embedding model: `bert-kit embed`; a reranker: /rerank)

# The validation metrics each task reports: what `metric` may name to choose best/ (checked with the
# settings, before any model or data is read; `bert_kit.metrics.higher_is_better` says which way).
# f1, precision and recall of classification are macro averages; `f1_<label>` is one label's F1.
CLASS_METRICS = ("accuracy", "f1", "precision", "recall", "f1_micro", "precision_micro", "recall_micro",
                 "f1_weighted", "precision_weighted", "recall_weighted", "mcc", "loss")
# several labels per text: the averages above over labels, per text (samples), and whole label sets
MULTI_LABEL_METRICS = ("f1", "precision", "recall", "f1_micro", "precision_micro", "recall_micro", "f1_samples",
                       "precision_samples", "recall_samples", "f1_weighted", "precision_weighted",
                       "recall_weighted", "subset_accuracy", "hamming_loss", "loss")
SCORE_METRICS = ("pearson", "spearman", "mse")  # regression (a classifier with one output), a cross-encoder
PER_LABEL_METRICS = ("f1_",)  # + a label's name: that label's own score (classification)
# retrieval (`bert_kit.retrieval.metrics`): of a BEIR split's search, or of a reranker's order of a query's candidates
RANK_METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100", "map@100")
METRICS = {"classification": tuple(dict.fromkeys(CLASS_METRICS + MULTI_LABEL_METRICS + SCORE_METRICS)),
           "token-classification": ("f1", "precision", "recall", "accuracy"),  # entity-level; accuracy per word
           "qa": ("f1", "exact_match"),
           "similarity": SCORE_METRICS,  # a bi-encoder: pearson and spearman
           "embedding": RANK_METRICS + SCORE_METRICS[:2],  # on a BEIR folder, or on an STS file
           "reranker": RANK_METRICS}


def metric_names(task: str, bi_encoder: bool = False, dims: tuple[int, ...] | list[int] = ()) -> tuple[str, ...]:
    """The validation metrics `task` reports (a bi-encoder's similarity: no mse; an embedding model
    trained at Matryoshka `dims`: each metric at each width d too, as `ndcg@10_dim{d}`)."""
    names = SCORE_METRICS[:2] if task == "similarity" and bi_encoder else METRICS[task]
    if task == "embedding":
        names = names + tuple(f"{name}_dim{d}" for d in dims for name in names)
    return names


def task_classes() -> dict[str, type]:
    """Task name -> class (imported here, on demand: the task modules import torch)."""
    from bert_kit.tasks.classification import ClassificationTask
    from bert_kit.tasks.embedding import EmbeddingTask
    from bert_kit.tasks.qa import QATask
    from bert_kit.tasks.reranker import RerankerTask
    from bert_kit.tasks.similarity import SimilarityTask
    from bert_kit.tasks.token_classification import TokenClassificationTask

    return {"classification": ClassificationTask, "token-classification": TokenClassificationTask,
            "qa": QATask, "similarity": SimilarityTask, "embedding": EmbeddingTask, "reranker": RerankerTask}


def make_task(name: str, settings: Any) -> Any:
    """The `Task` object for `name`, reading its settings from `settings` (a FinetuneConfig)."""
    if name not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {name!r}")
    return task_classes()[name](settings)


def _torch_engine() -> type:
    from bert_kit.training.engine import TorchEngine

    return TorchEngine


def _jax_engine() -> type:
    try:
        from bert_kit.jax.engine import JaxEngine
    except ModuleNotFoundError as e:  # the optional extra
        raise ImportError(f'engine=jax needs {e.name}: pip install "bert-kit[jax]"') from None
    return JaxEngine


# `engine:` setting -> the loader of its `bert_kit.training.engine.Engine` class (imported on demand:
# jax only for engine=jax). A new engine adds its loader here.
ENGINES: dict[str, Callable[[], type]] = {"torch": _torch_engine, "jax": _jax_engine}


def engine_class(name: str) -> type:
    """The engine class that trains a job for `engine: name`."""
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {tuple(ENGINES)}, got {name!r}")
    return ENGINES[name]()
