"""SentenceEncoder and `bert-kit embed`: parity with sentence-transformers on the real
all-MiniLM-L6-v2 weights and STS-B sentences, order preservation, pooling, bert-kit folders.

Run: .venv/bin/python -m pytest tests/test_embeddings.py -q
"""

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from bert_kit.cli import main as cli_main
from bert_kit.config import BertConfig
from bert_kit.embeddings import SentenceEncoder, cosine_similarity, embed, mean_pool, pool
from bert_kit.heads import BERTForSequenceClassification
from bert_kit.tokenizer import get_tokenizer

st = pytest.importorskip("sentence_transformers")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def sts_sentences(data_dir):
    from bert_kit.data.sts import read_sts

    s1, s2, _ = read_sts(data_dir / "stsb" / "sts-dev.csv")
    # a mix of short and long sentences, in file order (not sorted)
    return s1[:40] + s2[:40]


@pytest.fixture(scope="module")
def encoder(minilm_path):
    return SentenceEncoder.from_pretrained(minilm_path, device="cpu")


def test_mean_pooling_matches_sentence_transformers(minilm_path, encoder, sts_sentences):
    reference = st.SentenceTransformer(str(minilm_path), device="cpu")
    expect = reference.encode(sts_sentences, batch_size=16, convert_to_numpy=True)
    got = encoder.encode(sts_sentences, batch_size=16)
    assert got.shape == (len(sts_sentences), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_cls_pooling_matches_sentence_transformers(minilm_path, sts_sentences):
    from sentence_transformers.models import Pooling, Transformer

    body = Transformer(str(minilm_path), max_seq_length=256)
    reference = st.SentenceTransformer(modules=[body, Pooling(384, pooling_mode="cls")], device="cpu")
    texts = sts_sentences[:24]
    expect = reference.encode(texts, batch_size=8, convert_to_numpy=True)
    got = SentenceEncoder.from_pretrained(minilm_path, pooling="cls", normalize=False).encode(texts, batch_size=8)
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-5)


def test_order_is_preserved_and_batching_does_not_matter(encoder, sts_sentences):
    texts = sts_sentences[:30]
    full = encoder.encode(texts, batch_size=7)
    perm = np.random.default_rng(0).permutation(len(texts))
    shuffled = encoder.encode([texts[i] for i in perm], batch_size=30)
    np.testing.assert_allclose(shuffled, full[perm], rtol=0, atol=1e-5)
    one = encoder.encode(texts[3])  # a single str gives one (hidden,) vector
    assert one.shape == (384,)
    np.testing.assert_allclose(one, full[3], rtol=0, atol=1e-5)


def test_unpadded_path_equals_padded(minilm_path, sts_sentences):
    texts = sts_sentences[:20]
    fast = SentenceEncoder.from_pretrained(minilm_path, unpadded=True).encode(texts, batch_size=20)
    slow = SentenceEncoder.from_pretrained(minilm_path, unpadded=False).encode(texts, batch_size=20)
    np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-5)


def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])  # (1, 3, 2), last is padding
    mask = torch.tensor([[1, 1, 0]])
    assert_close(mean_pool(hidden, mask), torch.tensor([[2.0, 3.0]]), rtol=0, atol=0)
    assert_close(pool(hidden, mask, "cls"), torch.tensor([[1.0, 2.0]]), rtol=0, atol=0)
    with pytest.raises(ValueError, match="pooling"):
        pool(hidden, mask, "max")


def test_bert_kit_checkpoint_folder(tmp_path, minilm_path):
    """A fine-tuned bert-kit folder (head + tokenizer) embeds with its encoder; the head is ignored."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    model = BERTForSequenceClassification(config, num_labels=3).eval()
    model.save_pretrained(tmp_path)
    tokenizer = get_tokenizer(minilm_path)
    tokenizer.save(tmp_path)
    texts = ["a short one", "a somewhat longer sentence than the first", "x"]
    got = SentenceEncoder.from_pretrained(tmp_path, normalize=False, max_length=64).encode(texts)
    enc = tokenizer(texts, max_length=64)
    with torch.no_grad():
        hidden = model.bert(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    expect = mean_pool(hidden, enc["attention_mask"]).numpy()
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-5)
    # the module-level helper caches the encoder and gives the same (normalised) vectors
    normed = embed(texts, tmp_path, max_length=64)
    np.testing.assert_allclose(normed, expect / np.linalg.norm(expect, axis=1, keepdims=True), atol=1e-5)


def test_cosine_similarity():
    a = np.array([[1.0, 0.0], [1.0, 1.0]])
    b = np.array([[2.0, 0.0], [0.0, 3.0], [-1.0, -1.0]])
    expect = np.array([[1.0, 0.0, -np.sqrt(0.5)], [np.sqrt(0.5), np.sqrt(0.5), -1.0]])
    np.testing.assert_allclose(cosine_similarity(a, b), expect, atol=1e-12)
    np.testing.assert_allclose(cosine_similarity(torch.tensor(a), b[0]), expect[:, :1], atol=1e-12)
    with pytest.raises(ValueError, match="widths"):
        cosine_similarity(a, np.ones((1, 3)))


def test_embed_cli_writes_npy(tmp_path, minilm_path, encoder, sts_sentences, capsys):
    texts = sts_sentences[:12]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "emb.npy"
    rc = cli_main(["embed", "--model", str(minilm_path), "--input", str(tmp_path / "texts.txt"),
                   "--output", str(out), "--batch-size", "5"])
    assert rc == 0 and "embedded 12 texts" in capsys.readouterr().out
    np.testing.assert_allclose(np.load(out), encoder.encode(texts), rtol=0, atol=1e-5)
    # user errors are one line and exit code 1
    rc = cli_main(["embed", "--model", str(tmp_path / "nope"), "--input", str(tmp_path / "texts.txt"),
                   "--output", str(out)])
    assert rc == 2 and "model folder not found" in capsys.readouterr().err


def test_bad_arguments(minilm_path, encoder):
    with pytest.raises(ValueError, match="pooling"):
        SentenceEncoder.from_pretrained(minilm_path, pooling="max")
    with pytest.raises(ValueError, match="max_position_embeddings"):
        SentenceEncoder.from_pretrained(minilm_path, max_length=1024)
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        encoder.encode(["fine", 3])


@pytest.mark.parametrize("bad, message", [
    ({"max_length": 0}, r"max_length=0 is out of range: expected an integer in \[3, 512\]"),  # was the default 256
    ({"max_length": 2}, r"max_length=2 is out of range"),
    ({"normalize": "no"}, r"normalize='no' is not a valid choice: expected True or False"),  # was normalised
    ({"normalize": None}, r"normalize=None is not a valid choice"),
    ({"unpadded": 1}, r"unpadded=1 is not a valid choice"),
    ({"compile": "yes"}, r"compile='yes' is not a valid choice"),
])
def test_obviously_bad_constructor_arguments_are_refused(minilm_path, encoder, bad, message):
    from bert_kit.checks import ConfigError

    with pytest.raises(ConfigError, match=message):
        SentenceEncoder.from_pretrained(minilm_path, **bad)
    with pytest.raises(ConfigError, match=message):
        SentenceEncoder(encoder.model, encoder.tokenizer, **bad)


@pytest.mark.slow
def test_compiled_encoder_matches_eager_and_leaves_training_compiles_alone(minilm_path, encoder, sts_sentences):
    compiled = SentenceEncoder.from_pretrained(minilm_path, device="cpu", compile=True)
    texts = sts_sentences[:24]
    np.testing.assert_allclose(compiled.encode(texts, batch_size=8), encoder.encode(texts, batch_size=8),
                               rtol=0, atol=1e-5)
    import torch._inductor.config as inductor_config

    assert inductor_config.freezing is False  # frozen weights only inside the encoder's compile
