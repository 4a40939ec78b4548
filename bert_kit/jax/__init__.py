"""bert_kit.jax: the same BERT in JAX, as Flax NNX modules, its weights shared with the PyTorch side.

Read it in this order: ``model.py`` (the encoder and heads, mirroring ``bert_kit/model.py`` and
``heads.py`` name for name), ``weights.py`` (model folders in and out through ``bert_kit/hf.py``'s
one mapping), ``train.py`` (losses, AdamW, the jitted train step, data parallel over a ``Mesh``),
``engine.py`` (the engine that `bert-kit pretrain/finetune ... engine=jax` trains with, inside
bert-kit's one training loop; the jobs look it up by name, `bert_kit.tasks.engine_class`: not imported here).

Needs the ``jax`` extra: ``pip install "bert-kit[jax]"`` (jax, flax, optax). Nothing here imports torch.

    from bert_kit.jax import BERTForSequenceClassification
    model = BERTForSequenceClassification.from_pretrained("sentence-transformers/all-MiniLM-L6-v2", num_labels=2)
    logits = model(input_ids, attention_mask)            # (B, 2), eval mode: no dropout
    model.save_pretrained("out/")                        # loads in bert-kit PyTorch and transformers
"""

from .model import (HEAD_CLASSES, BERTForMaskedLM, BERTForPreTraining, BERTForQuestionAnswering,
                    BERTForSequenceClassification, BERTForTokenClassification, BERTModel, BertEmbeddings,
                    BertEncoder, BertPooler, FeedForward, LayerNorm, MLMHead, MultiHeadAttention,
                    TransformerEncoderBlock, attention)
from .train import (TrainState, cast, classification_loss, create_optimizer, data_sharding, decay_mask,
                    distributed_settings, init_train_state, initialize_distributed, lr_schedule, make_eval_step,
                    make_mesh, make_train_step, mlm_loss, nsp_loss, prediction_slots, replicated, shard_batch,
                    task_loss, token_classification_loss)
from .weights import load_torch_state_dict, torch_state_dict

__all__ = [
    "BertEmbeddings", "MultiHeadAttention", "FeedForward", "TransformerEncoderBlock", "BertEncoder", "BertPooler",
    "LayerNorm", "BERTModel", "MLMHead", "BERTForMaskedLM", "BERTForPreTraining", "BERTForSequenceClassification",
    "BERTForTokenClassification", "BERTForQuestionAnswering", "HEAD_CLASSES", "attention",
    "mlm_loss", "nsp_loss", "classification_loss", "token_classification_loss", "task_loss", "prediction_slots",
    "cast", "lr_schedule", "decay_mask", "create_optimizer", "TrainState", "init_train_state", "make_train_step",
    "make_eval_step", "make_mesh", "data_sharding", "replicated", "shard_batch", "distributed_settings",
    "initialize_distributed",
    "torch_state_dict", "load_torch_state_dict",
]
