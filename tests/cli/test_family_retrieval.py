"""The retrieval tasks on the other families' folders (tiny random ModernBERT and RoBERTa, as
transformers writes them): an embedding model with a learned scale and GradCache trains, its
checkpoint (the family's names and the scale) resumes, and best/ embeds as sentence-transformers
does; a reranker trains and scores as sentence-transformers' CrossEncoder does.

Run: .venv/bin/python -m pytest tests/cli/test_family_retrieval.py -q
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file
from torch.testing import assert_close

from bert_kit.cli import main
from tests.cli.test_families import hf_folder

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORDS = "the quick brown fox jumps over a lazy dog while hello world numbers appear in tiny corpus".split()


@pytest.fixture(scope="module")
def tuples(tmp_path_factory):
    rng = random.Random(0)
    rows = [{"anchor": " ".join(rng.choices(WORDS, k=4)), "positive": " ".join(rng.choices(WORDS, k=12)),
             "negative": " ".join(rng.choices(WORDS, k=9))} for _ in range(16)]
    path = tmp_path_factory.mktemp("tuples") / "hard.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("family", ["modernbert", "roberta"])
def test_an_embedding_model_of_another_family_trains_and_resumes(family, tuples, tmp_path_factory, tmp_path):
    folder, _, _ = hf_folder(tmp_path_factory, family, "Model")
    run = tmp_path / "run"
    args = ["finetune", "--task", "embedding", f"model={folder}", f"train_file={tuples}", "batch_size=4",
            "lr=1e-3", f"output_dir={run}", "device=cpu", "max_length=32", "save_every=2", "embedding.scale=learned",
            "embedding.cached=true", "embedding.mini_batch_size=5"]
    assert main([*args, "max_steps=2"]) == 0
    state = load_file(run / "checkpoints" / "step-0000002" / "model.safetensors")
    prefix = "model." if family == "modernbert" else "roberta."
    assert "logit_scale" in state and all(k.startswith(prefix) for k in state if k != "logit_scale")
    assert main([*args, "max_steps=4", "--resume", "latest"]) == 0
    assert json.loads((run / "results.json").read_text())["steps"] == 4
    st = pytest.importorskip("sentence_transformers")
    from bert_kit.embeddings import SentenceEncoder

    texts = ["the quick brown fox", "hello world numbers appear"]
    want = st.SentenceTransformer(str(run / "best"), device="cpu").encode(texts)
    assert_close(torch.tensor(SentenceEncoder.from_pretrained(run / "best").encode(texts)), torch.tensor(want),
                 rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", ["modernbert", "roberta"])
def test_a_reranker_of_another_family_trains_and_scores_as_a_cross_encoder(family, tuples, tmp_path_factory, tmp_path):
    folder, _, _ = hf_folder(tmp_path_factory, family, "Model")
    run = tmp_path / "run"
    assert main(["finetune", "--task", "reranker", f"model={folder}", f"train_file={tuples}",
                 f"validation_file={tuples}", "batch_size=4", "lr=1e-3", f"output_dir={run}", "device=cpu",
                 "max_length=32", "max_steps=2", "reranker.loss=listnet"]) == 0
    from bert_kit.retrieval.rerank import Reranker

    pairs = [("the quick brown fox", "a lazy dog"), ("hello world", "numbers appear in tiny corpus")]
    ours = Reranker.from_pretrained(run / "best", device="cpu").score_pairs(*zip(*pairs))
    st = pytest.importorskip("sentence_transformers")
    want = st.CrossEncoder(str(run / "best"), device="cpu").predict(pairs)
    assert_close(torch.tensor(ours), torch.tensor(want, dtype=torch.float32), rtol=1e-4, atol=1e-5)
