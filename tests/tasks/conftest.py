"""Fixtures shared by the fine-tuning tests."""

import pytest
import torch

from bert_kit.config import BertConfig
from bert_kit.model import BERTModel
from bert_kit.tokenizer import get_tokenizer

TINY = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=384, hidden_dropout_prob=0.1)


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory, minilm_path):
    """A random tiny encoder folder (2 layers, width 32) with MiniLM's tokenizer, as a pretraining
    run would leave it."""
    folder = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    BERTModel(TINY).save_pretrained(folder)
    get_tokenizer(minilm_path).save(folder)
    return folder
