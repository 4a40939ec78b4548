"""bert-kit: build, pretrain, fine-tune and evaluate BERT-style encoders.

Public names are imported lazily, so `import bert_kit` (and `bert_kit.config`) stays cheap
and works without torch; touching `bert_kit.BERTModel` imports the model module.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "BertConfig": "config",
    "create_model_config": "config",
    "BERTModel": "model",
    "LayerNorm": "model",
    "set_low_precision_residual": "kernels.residual",
    "GELU": "model",
    "FeedForward": "model",
    "MultiHeadAttention": "model",
    "TransformerEncoderBlock": "model",
    "BERTForPreTraining": "heads",
    "BERTForMaskedLM": "heads",
    "BERTForSequenceClassification": "heads",
    "BERTForTokenClassification": "heads",
    "BERTForQuestionAnswering": "heads",
    "get_tokenizer": "tokenizer",
    "train_tokenizer": "tokenizer_training",
    "WordPieceTokenizer": "tokenizer",
    "FastTokenizer": "tokenizer",
    "MLMDataset": "data.pretraining",
    "NSPDataset": "data.pretraining",
    "create_mlm_dataloader": "data.pretraining",
    "create_pretraining_dataloader": "data.pretraining",
    "ClassificationDataset": "data.classification",
    "create_classification_dataloader": "data.classification",
    "compute_mlm_loss": "training.losses",
    "compute_classification_loss": "training.losses",
    "compute_cosine_similarity_loss": "training.losses",
    "compute_cosent_loss": "training.losses",
    "compute_mlm_loader_loss": "training.losses",
    "compute_precision_recall_f1": "metrics",
    "compute_confusion_matrix": "metrics",
    "evaluate_classification_metrics": "metrics",
    "SentenceEncoder": "embeddings",
    "cosine_similarity": "embeddings",
    "FinetuneConfig": "tasks.finetuning",
    "finetune": "tasks.finetuning",
    "TextClassifier": "tasks.inference",
    "PretrainConfig": "tasks.pretraining",
    "pretrain": "tasks.pretraining",
    "AMPTrainer": "training.trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bert_kit' has no attribute {name!r}")
    value = getattr(import_module(f"bert_kit.{module}"), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
