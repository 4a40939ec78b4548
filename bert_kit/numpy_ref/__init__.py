"""bert_kit.numpy_ref: a BERT in plain NumPy with every backward pass written by hand.

Read it bottom-up: ``layers.py`` (Linear, Embedding, LayerNorm, GELU), ``encoder.py`` (embeddings,
self-attention, feed-forward, encoder layer), ``heads.py`` (pooler, MLM, NSP), ``model.py`` (whole
models and losses), ``data.py`` (synthetic batches), ``runner.py`` (training loop and CLI),
``checkpoint.py`` (HF-format weights). docs/numpy_ref.md derives every backward pass.

It is the float64 reference the torch engine is checked against, and a teaching model:
``python -m bert_kit.numpy_ref --config configs/numpy_ref.yaml`` trains it on synthetic data.
"""

from .checkpoint import hf_name_map, load_state_dict, read_config, state_dict
from .data import BertBatch, create_mlm_batch, create_nsp_pair_batch, generate_synthetic_bert_batches
from .encoder import (BertEmbeddings, BertEncoder, FeedForward, MultiHeadSelfAttention,
                      TransformerEncoderBlock, sinusoidal_positions)
from .heads import BertMLMHead, BertNSPHead, BertPooler
from .layers import (CLS_ID, GELU, MASK_ID, PAD_ID, SEP_ID, Embedding, LayerNorm, Linear, Module, ReLU,
                     Tanh, softmax)
from .model import BertBaseModel, BertForPretraining, BertModel, create_bert_model
from .runner import BertRunner, RunConfig, main

# Other names for the same classes: the torch engine's and the second API's.
MultiHeadAttention = MultiheadAttention = MultiHeadSelfAttention
BertBlock = BertLayer = TransformerEncoderBlock
MaskedLMHead, NSPHead = BertMLMHead, BertNSPHead
WordEmbedding = Embedding

__all__ = [
    "PAD_ID", "CLS_ID", "SEP_ID", "MASK_ID",
    "Module", "Linear", "Embedding", "LayerNorm", "GELU", "ReLU", "Tanh", "softmax",
    "BertEmbeddings", "MultiHeadSelfAttention", "FeedForward", "TransformerEncoderBlock", "BertEncoder",
    "sinusoidal_positions", "BertPooler", "BertMLMHead", "BertNSPHead",
    "BertBaseModel", "BertModel", "BertForPretraining", "create_bert_model",
    "BertBatch", "create_mlm_batch", "create_nsp_pair_batch", "generate_synthetic_bert_batches",
    "BertRunner", "RunConfig", "main",
    "hf_name_map", "state_dict", "load_state_dict", "read_config",
    "MultiHeadAttention", "MultiheadAttention", "BertBlock", "BertLayer", "MaskedLMHead", "NSPHead",
    "WordEmbedding",
]
