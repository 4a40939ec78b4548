"""Task heads on top of `BERTModel`. Each head returns logits; losses are plain functions
(`bert_kit.training.losses`). Parameter layout follows HF so checkpoints map one to one.

With MLM `labels` (B, T) in the -100 convention, the MLM decoder runs only at the N labelled
positions and returns (N, V) logits, in row-major order, so `labels[labels != -100]` lines up
with them: at 15% masking this skips ~85% of the largest matmul of pretraining.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from bert_kit.config import BertConfig
from bert_kit.kernels.packing import Packed
from bert_kit.model import BERTModel, BertPreTrainedModel, LayerNorm, activation

IGNORE_INDEX = -100


class MLMHead(nn.Module):
    """Transform (dense + GELU + LayerNorm), then the decoder tied to the word embeddings."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)  # weight tied by the owner

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V)."""
        return self.decoder(self.norm(self.act(self.dense(hidden))))


def masked_index(labels: torch.Tensor) -> torch.Tensor:
    """Flat positions (N,) of the labelled tokens in (B, T) labels; -100 marks the others.

    Computing it once (e.g. in the collator, on the CPU) and passing it as `masked_index` keeps
    data-dependent sizes out of a compiled graph: logits and targets then share one size.
    """
    return (labels.flatten() != IGNORE_INDEX).nonzero().squeeze(1)


def pad_masked(index: torch.Tensor, targets: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad (N,) masked positions and targets to a fixed `capacity` (index 0, target -100).

    With a fixed number of prediction slots per batch (as Google's max_predictions_per_seq)
    every tensor shape is static, so a compiled step never recompiles and can be a CUDA graph;
    the padded slots cost a little decoder work and are ignored by the loss.
    """
    n = index.shape[0]
    if n > capacity:
        raise ValueError(f"{n} masked positions exceed the capacity of {capacity} prediction slots")
    return (torch.cat([index, index.new_zeros(capacity - n)]),
            torch.cat([targets, targets.new_full((capacity - n,), IGNORE_INDEX)]))


def with_prediction_slots(batch: dict, share: float = 0.2, multiple: int = 64) -> dict:
    """`batch` plus masked_index and masked_labels (K,) padded to K fixed prediction slots.

    K = share of the batch's (B, T) positions, rounded up to `multiple` (or more when more are
    masked), so for a fixed batch shape every step has the same K: a compiled step never
    recompiles and can be a CUDA graph. Run it where the labels are, on the host, in the loader.
    """
    labels = batch["labels"]
    index = masked_index(labels)
    capacity = max(int(share * labels.numel() + 0.999999), index.shape[0])
    capacity = -(-capacity // multiple) * multiple
    index, targets = pad_masked(index, labels.flatten()[index], capacity)
    return {**batch, "masked_index": index, "masked_labels": targets}


def select_masked(hidden: torch.Tensor, labels: torch.Tensor | None,
                  index: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T, H) -> (N, H) at the labelled positions; unchanged when neither is given."""
    if index is None and labels is None:
        return hidden
    if labels is not None and not torch.compiler.is_compiling():
        if labels.shape != hidden.shape[:2]:
            raise ValueError(f"labels shape {tuple(labels.shape)} does not match input_ids {tuple(hidden.shape[:2])}")
        if labels.is_floating_point() or labels.dtype == torch.bool:
            raise TypeError(f"labels must be token ids (torch.long, -100 = not predicted), got {labels.dtype}")
    if index is None:
        index = masked_index(labels)
    return hidden.flatten(0, 1).index_select(0, index)


class _TiedMLM(BertPreTrainedModel):
    """Ties the MLM decoder weight to the word embeddings (one tensor, counted once)."""

    def tie_weights(self) -> None:
        self.mlm.decoder.weight = self.bert.embeddings.word_embeddings.weight


class BERTForMaskedLM(_TiedMLM):
    """BERT with the masked-language-model head."""

    hf_architecture = "BertForMaskedLM"

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BERTModel(config)
        self.mlm = MLMHead(config)
        self.apply(self._init_weights)
        self.tie_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                unpadded: bool | Packed = False, masked_index: torch.Tensor | None = None) -> torch.Tensor:
        """-> (B, T, V) logits, or (N, V) at the labelled positions when `labels` (B, T) or the
        flat `masked_index` (N,) is given."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids, unpadded=unpadded)
        return self.mlm(select_masked(hidden, labels, masked_index))


class BERTForPreTraining(_TiedMLM):
    """BERT with the MLM head and the next-sentence-prediction head (pretraining)."""

    hf_architecture = "BertForPreTraining"

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BERTModel(config)
        self.mlm = MLMHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2)  # 0 = B follows A, 1 = B is random (HF convention)
        self.apply(self._init_weights)
        self.tie_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                unpadded: bool | Packed = False, masked_index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (mlm_logits (B, T, V), or (N, V) with labels / masked_index, nsp_logits (B, 2))."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids, unpadded=unpadded)
        nsp_logits = self.nsp(self.bert.pool(hidden))
        return self.mlm(select_masked(hidden, labels, masked_index)), nsp_logits


class _Classifier(BertPreTrainedModel):
    """BERT + dropout + a linear layer to `num_labels` outputs (shared by the two heads below)."""

    def __init__(self, config: BertConfig, num_labels: int = 2, classifier_dropout: float | None = None):
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        self.config = config
        self.num_labels = num_labels
        self.bert = BERTModel(config)
        p = config.hidden_dropout_prob if classifier_dropout is None else classifier_dropout
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.apply(self._init_weights)


class BERTForSequenceClassification(_Classifier):
    """Pooled [CLS] -> dropout -> linear. num_labels=1 makes it a regression head (e.g. STS-B)."""

    hf_architecture = "BertForSequenceClassification"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, unpadded: bool | Packed = False) -> torch.Tensor:
        """-> logits (B, num_labels)."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids, unpadded=unpadded)
        return self.classifier(self.dropout(self.bert.pool(hidden)))


class BERTForTokenClassification(_Classifier):
    """Per-token linear classifier (NER, POS tagging)."""

    hf_architecture = "BertForTokenClassification"

    def __init__(self, config: BertConfig, num_labels: int = 9, classifier_dropout: float | None = None):
        super().__init__(config, num_labels, classifier_dropout)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, unpadded: bool | Packed = False) -> torch.Tensor:
        """-> logits (B, T, num_labels)."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids, unpadded=unpadded)
        return self.classifier(self.dropout(hidden))


class BERTForQuestionAnswering(BertPreTrainedModel):
    """Extractive QA: a linear layer gives start and end logits for every token."""

    hf_architecture = "BertForQuestionAnswering"

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BERTModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.apply(self._init_weights)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                unpadded: bool | Packed = False) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (start_logits (B, T), end_logits (B, T))."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids, unpadded=unpadded)
        start, end = self.qa_outputs(hidden).unbind(-1)
        return start, end


# HF architecture name -> our class (config.json "architectures"); `save_pretrained` writes the name
HEAD_CLASSES = {cls.hf_architecture: cls for cls in (BERTModel, BERTForPreTraining, BERTForMaskedLM,
                                                      BERTForSequenceClassification, BERTForTokenClassification,
                                                      BERTForQuestionAnswering)}
