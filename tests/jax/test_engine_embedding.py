"""`bert-kit finetune --task embedding ... engine=jax` (CPU, two devices): the contrastive loss of a
padded batch equals torch's of its real rows (MNRL and symmetric, hard negatives, known positives
left out, Matryoshka widths); from the same weights, batches and seed (dropout off, fp32) each
step's loss and gradient norm equal the torch engine's, and so do the validation metrics, on an
STS file (Spearman) and on a BEIR folder (nDCG@10); what the engine does not train is refused
before any model or data loads. A learned scale and each device's own negatives
(`gather_across_ranks: false`): tests/jax/test_engine_contrastive_settings.py.

Run: .venv/bin/python -m pytest tests/jax/test_engine_embedding.py -q -n 0
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from torch.testing import assert_close  # noqa: E402

from bert_kit.cli import main as cli  # noqa: E402
from bert_kit.jax.tasks import ContrastiveHead, contrastive_loss, normalize  # noqa: E402
from bert_kit.tasks.finetuning import FinetuneConfig, finetune  # noqa: E402
from bert_kit.training.contrastive import known_positives, multiple_negatives_ranking_loss, pair_codes  # noqa: E402
from tests.jax.test_engine_finetune import assert_same_steps, config, records  # noqa: E402
from tests.jax.test_engine_tasks import (  # noqa: E402,F401  (encoder: a fixture)
    assert_resumes_bit_for_bit, assert_same_evaluations, encoder, encoder_folder)
from tests.retrieval.beir_files import DOCS, QRELS, QUERIES, write_beir  # noqa: E402
from tests.tasks.test_embedding import nli  # noqa: E402,F401  (fixture: SNLI triplets, STS-B dev pairs)


def torch_loss(columns: torch.Tensor, keys: np.ndarray | None, pairs: torch.Tensor, texts: int, symmetric: bool,
               dims: tuple[int, ...] = ()) -> torch.Tensor:
    """The torch engine's loss of (k, B, H) columns (`EmbeddingTask.loss_of_vectors`'s pieces)."""
    exclude = None if keys is None else (lambda a, c: known_positives(a, c, pairs, texts))
    keys_t = None if keys is None else torch.from_numpy(keys)

    def mnrl(c: torch.Tensor) -> torch.Tensor:
        return multiple_negatives_ranking_loss(c, 20.0, symmetric, False, exclude, keys_t)

    return sum(mnrl(torch.nn.functional.normalize(columns[..., :d], dim=-1)) for d in dims) if dims else mnrl(columns)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("dims", [(), (8, 4)])
def test_the_loss_of_a_padded_batch_is_torchs_of_its_real_rows(symmetric, dims):
    """5 real tuples of 3 texts padded to 8 rows (copies of row 0, keys -1): the loss and its
    gradient are those of the 5 rows alone. Texts 13, 11 and 20 (a hard negative) are known
    positives of anchors 0, 2 and 4 too, and close to them: leaving them out changes the loss."""
    rng = np.random.default_rng(0)
    k, B, real_rows, H = 3, 8, 5, 8
    keys = np.array([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14], [20, 21, 22, 23, 24]])  # (k, real B) text ids
    pairs_list = [(0, 10), (1, 11), (2, 12), (3, 13), (4, 14), (0, 13), (2, 11), (4, 20)]  # known (anchor, positive)
    pairs, texts = pair_codes(pairs_list)
    head = ContrastiveHead("embedding", pairs=pairs.numpy(), texts=texts)
    real = rng.normal(size=(k, real_rows, H)).astype(np.float32)
    for anchor, (column, row) in ((0, (1, 3)), (2, (1, 1)), (4, (2, 0))):  # the known positives 13, 11, 20:
        real[column, row] = real[0, anchor] + 0.1 * real[column, row]  # close to their anchors (hard to miss)
    padded = np.concatenate([real, np.repeat(real[:, :1], B - real_rows, axis=1)], axis=1)  # (k, B, H)
    padded_keys = np.concatenate([keys.T, np.full((B - real_rows, k), -1)])[None]  # (1, B, k)
    known = head.host_inputs({"keys": padded_keys})["known"][0]  # (B, (k - 1) B)
    assert known.sum() == 4 + 4  # each anchor's own positive (on the diagonal), then 3 others
    is_real = np.arange(B) < real_rows
    for exclude in (False, True):
        def loss(x):
            m = known if exclude else None
            if dims:
                return sum(contrastive_loss(normalize(x[..., :d]), is_real, 20.0, symmetric, m) for d in dims)
            return contrastive_loss(x, is_real, 20.0, symmetric, m)

        got, grad = jax.value_and_grad(loss)(jax.numpy.asarray(padded))
        c = torch.from_numpy(real).requires_grad_()
        expected = torch_loss(c, keys if exclude else None, pairs, texts, symmetric, dims)
        expected.backward()
        assert abs(float(got) - expected.item()) <= 1e-5, (exclude, float(got), expected.item())
        grad = np.array(grad)
        assert np.isfinite(grad).all() and not grad[:, real_rows:].any()  # padding rows take no part
        assert_close(torch.from_numpy(grad[:, :real_rows]), c.grad, rtol=1e-4, atol=1e-6)
    c = torch.from_numpy(real)
    excluded, plain = (float(torch_loss(c, ids, pairs, texts, symmetric, dims)) for ids in (keys, None))
    assert abs(excluded - plain) > 1e-3  # the exclusion matters


def embedding(encoder: Path, out: Path, engine: str, **overrides) -> FinetuneConfig:
    return config(encoder, out, engine, task="embedding", **overrides)


def test_mnrl_with_a_hard_negative_takes_torchs_steps_and_scores_sts_as_it_does(encoder, nli, tmp_path):
    """Triplets (anchor, positive, hard negative), 44 of them in batches of 12: the fourth holds 8,
    padded to 12 rows; Spearman on STS-B dev pairs as the torch engine's, at the full width and
    at a Matryoshka width."""
    train, dev = nli
    # (no_duplicates deals whole batches only: the plain sampler keeps the short last one)
    settings = dict(train_file=str(train), validation_file=str(dev), max_train_examples=44,
                    embedding={"no_duplicates": False, "matryoshka_dims": [32, 16]})
    finetune(embedding(encoder, tmp_path / "torch", "torch", **settings))
    results = finetune(embedding(encoder, tmp_path / "jax", "jax", **settings))
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    assert records(tmp_path / "jax", "train")[4]["examples"] == 8  # the padded batch counts its real rows
    assert_same_evaluations(tmp_path / "jax", tmp_path / "torch", ("spearman", "pearson", "spearman_dim16"), 1e-3)
    assert results["metric"] == "spearman" and (tmp_path / "jax" / "best" / "modules.json").is_file()


def test_symmetric_leaving_out_known_positives_takes_torchs_steps_and_scores_beir_as_it_does(encoder, tmp_path,
                                                                                              monkeypatch):
    """A BEIR folder's qrels train (documents relevant to two queries: known positives left out of
    their negatives), [CLS] pooling, its dev split scores nDCG@10 as the torch engine's. The
    programs of the run are compiled ahead, as on a GPU."""
    import bert_kit.jax.engine as engine_module

    shared = {"q1": {"d1": 1, "d3": 1}, "q3": {"d1": 1, "d11": 1}, "q2": {"d4": 1, "d6": 1}, "q4": {"d5": 1, "d3": 1}}
    folder = write_beir(tmp_path / "beir", DOCS, QUERIES, shared, split="train")
    write_beir(folder, DOCS, QUERIES, {q: QRELS[q] for q in ("q1", "q3", "q5")}, split="dev")
    settings = dict(train_file=str(folder), validation_file=str(folder), batch_size=4, max_train_examples=7,
                    lr=3e-3, embedding={"loss": "symmetric", "exclude_known_positives": True, "pooling": "cls"})
    finetune(embedding(encoder, tmp_path / "torch", "torch", **settings))
    monkeypatch.setattr(engine_module, "COMPILE_AHEAD_ON_CPU", True)
    left_out = []  # known positives of another row, by step (the diagonal is each anchor's own)
    original = ContrastiveHead.host_inputs

    def spy(self, batch):
        known = original(self, batch)["known"]  # (A, B, (k - 1) B)
        B = known.shape[1]
        left_out.append(int(known.sum() - known[:, np.arange(B), np.arange(B)].sum()))
        return {"known": known}

    monkeypatch.setattr(ContrastiveHead, "host_inputs", spy)
    results = finetune(embedding(encoder, tmp_path / "jax", "jax", **settings))
    assert len(left_out) >= 4 and sum(left_out) > 0  # (and the batch compiled ahead)
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    assert_same_evaluations(tmp_path / "jax", tmp_path / "torch", ("ndcg@10", "recall@100", "mrr@10"), 1e-4)
    assert results["metric"] == "ndcg@10" and records(tmp_path / "jax", "eval")[4]["num_queries"] == 3


@pytest.mark.slow
def test_an_embedding_run_resumes_bit_for_bit(nli, tmp_path, minilm_path):
    """4 steps at once, and 2 steps then 2 more from the checkpoint (written from the whole
    `EmbeddingModel`, read back into it): the same losses, dropout on."""
    encoder = encoder_folder(tmp_path / "encoder", minilm_path, 0.1)
    train, _ = nli
    assert_resumes_bit_for_bit(lambda out, **kw: embedding(encoder, out, "jax", **kw), tmp_path,
                               train_file=str(train), schedule="constant", warmup_steps=0, eval_every=0,
                               embedding={"loss": "symmetric"})


def test_gradcache_takes_torchs_cached_steps_and_its_own_uncached_ones(encoder, nli, tmp_path):
    """embedding.cached: pieces of 10 rows (the batches' 36 and 24 rows do not divide into them), the
    whole batch's gradients: the torch engine's cached steps, and the JAX engine's uncached ones."""
    train, dev = nli
    settings = dict(train_file=str(train), validation_file=str(dev), max_train_examples=44, eval_every=0,
                    embedding={"no_duplicates": False, "cached": True, "mini_batch_size": 10})
    finetune(embedding(encoder, tmp_path / "torch", "torch", **settings))
    finetune(embedding(encoder, tmp_path / "jax", "jax", **settings))
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    settings["embedding"] = {"no_duplicates": False}
    finetune(embedding(encoder, tmp_path / "whole", "jax", **settings))
    assert_same_steps(tmp_path / "jax", tmp_path / "whole", 1e-5)


def test_pieces_of_a_batch_give_its_vectors_and_gradients(encoder):
    """encode_in_pieces, 7 rows in pieces of 3: the vectors and the gradients of every row at once,
    within float rounding."""
    from flax import nnx

    from bert_kit.jax.model import BERTModel as JaxBERT
    from bert_kit.jax.tasks import encode_in_pieces, pool
    from bert_kit.jax.weights import from_torch
    from bert_kit.model import BERTModel

    model = from_torch(BERTModel.from_pretrained(encoder), JaxBERT)
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 2000, size=(7, 12)).astype(np.int32)
    mask = (np.arange(12)[None] < rng.integers(4, 13, size=(7, 1))).astype(np.int32)
    inputs = (ids, mask, np.zeros_like(ids))

    def loss(m, pieces):
        v = encode_in_pieces(m, inputs, None, 3, "mean") if pieces else pool(m(*inputs), mask, "mean")
        return (v * np.linspace(-1, 1, v.size).reshape(v.shape)).sum(), v

    (whole, v1), g1 = nnx.value_and_grad(lambda m: loss(m, False), has_aux=True)(model)
    (piece, v2), g2 = nnx.value_and_grad(lambda m: loss(m, True), has_aux=True)(model)
    assert np.abs(np.asarray(v1) - np.asarray(v2)).max() <= 1e-5 and abs(float(whole) - float(piece)) <= 1e-4
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-5 * max(1.0, float(np.abs(np.asarray(a)).max()))


def test_pieces_hold_a_pieces_activations_not_the_batchs():
    """What GradCache is for: XLA's own count of the gradient's scratch memory, 128 rows of 64
    tokens through a 2-layer encoder, at once and in pieces of 16."""
    from flax import nnx

    from bert_kit.config import BertConfig
    from bert_kit.jax.model import BERTModel as JaxBERT
    from bert_kit.jax.tasks import encode_in_pieces, pool

    model = JaxBERT(BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=128, max_position_embeddings=64), rngs=nnx.Rngs(0))
    graph, state = nnx.split(model)
    ids = np.random.default_rng(0).integers(5, 900, size=(128, 64)).astype(np.int32)
    inputs = (ids, np.ones_like(ids), np.zeros_like(ids))

    def scratch(pieces: bool) -> int:
        def loss(state):
            m = nnx.merge(graph, state)
            v = encode_in_pieces(m, inputs, None, 16, "mean") if pieces else pool(m(*inputs), inputs[1], "mean")
            return (v ** 2).sum()
        return jax.jit(jax.grad(loss)).lower(state).compile().memory_analysis().temp_size_in_bytes

    whole, pieces = scratch(False), scratch(True)
    assert pieces * 4 < whole, (pieces, whole)


def test_the_command_line_refuses_in_one_line_before_reading_anything(tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"  # never read: the settings stop the run first
    for extra, named in ((["compile=true", "cuda_graphs=true"], "cuda_graphs=true"),):
        rc = cli(["finetune", "--task", "embedding", "model=no-such-model", f"train_file={missing}", "engine=jax",
                  f"output_dir={tmp_path / 'run'}", *extra])
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert rc == 2 and len(err) == 1 and named in err[0] and "engine=torch" in err[0], err
    assert not (tmp_path / "run").exists()
