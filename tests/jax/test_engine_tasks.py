"""`bert-kit finetune ... engine=jax` for QA and sentence similarity on cuts of the real SQuAD and
STS-B files (CPU): from the same weights, batches and seed (dropout off, fp32) each step's loss and
gradient norm equal the torch engine's, and so do the validation metrics; a bi-encoder run resumed
from its checkpoint continues bit for bit (dropout on); the run folders are the torch engine's.

Run: .venv/bin/python -m pytest tests/jax/test_engine_tasks.py -q -n 0
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from bert_kit.config import BertConfig  # noqa: E402
from bert_kit.model import BERTModel  # noqa: E402
from bert_kit.tasks.finetuning import finetune  # noqa: E402
from bert_kit.tokenizer import get_tokenizer  # noqa: E402
from bert_kit.training.checkpoint import latest_checkpoint  # noqa: E402
from tests.jax.test_engine_finetune import assert_same_evaluations, assert_same_steps, config, records  # noqa: E402


def encoder_folder(folder: Path, minilm_path: Path, dropout: float) -> Path:
    """A random 1-layer, 32-wide encoder with MiniLM's tokenizer."""
    torch.manual_seed(0)
    BERTModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=dropout,
                         attention_probs_dropout_prob=dropout)).save_pretrained(folder)
    get_tokenizer(minilm_path).save(folder)
    return folder


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, minilm_path):
    return encoder_folder(tmp_path_factory.mktemp("encoder"), minilm_path, 0.0)


@pytest.fixture(scope="module")
def sts(data_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sts")
    for name, n in (("sts-train.csv", 44), ("sts-dev.csv", 30)):
        lines = (data_dir / "stsb" / name).read_text().splitlines()[:n]
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder / "sts-train.csv", folder / "sts-dev.csv"


def test_qa_takes_torchs_steps_and_scores_as_it_does(encoder, data_dir, tmp_path):
    squad = json.loads((data_dir / "squad-v1.1" / "dev-v1.1.json").read_text())
    small = {"version": "1.1", "data": [{"title": a["title"], "paragraphs": a["paragraphs"][:1]}
                                        for a in squad["data"][:3]]}  # two articles train, one evaluates
    (tmp_path / "squad.json").write_text(json.dumps(small))
    settings = dict(task="qa", train_file=str(tmp_path / "squad.json"), max_length=96, lr=3e-3,
                    qa={"train_articles": 2, "doc_stride": 32, "max_query_length": 24})
    finetune(config(encoder, tmp_path / "torch", "torch", **settings))
    results = finetune(config(encoder, tmp_path / "jax", "jax", **settings))
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    assert_same_evaluations(tmp_path / "jax", tmp_path / "torch", ("f1", "exact_match"), 0.5)
    assert results["metric"] == "f1" and (tmp_path / "jax" / "best" / "model.safetensors").is_file()
    assert results["fast_path"] == "JAX engine: none (cpu: XLA attention)"


@pytest.mark.parametrize("similarity", [{"mode": "cross-encoder"}, {"mode": "bi-encoder", "loss": "cosent"}])
def test_similarity_takes_torchs_steps_and_scores_as_it_does(encoder, sts, tmp_path, similarity):
    train, dev = sts
    settings = dict(task="similarity", train_file=str(train), validation_file=str(dev), similarity=similarity)
    finetune(config(encoder, tmp_path / "torch", "torch", **settings))
    finetune(config(encoder, tmp_path / "jax", "jax", **settings))
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    assert_same_evaluations(tmp_path / "jax", tmp_path / "torch", ("pearson", "spearman"), 1e-3)


@pytest.mark.parametrize("loss", ["bce", "listnet", "lambdaloss"])
def test_a_reranker_takes_torchs_steps_and_ranks_as_it_does(encoder, tmp_path, loss):
    """Pointwise (pairs: the last batch of 8 padded to 12) and listwise (8 queries of 4 candidates,
    a batch of queries): the JAX engine's losses and validation rankings are the torch engine's."""
    from tests.tasks.test_reranker import write_groups

    settings = dict(task="reranker", train_file=str(write_groups(tmp_path / "train.jsonl", 8)),
                    validation_file=str(write_groups(tmp_path / "dev.jsonl", 4)), reranker={"loss": loss},
                    batch_size=12 if loss == "bce" else 3)
    finetune(config(encoder, tmp_path / "torch", "torch", **settings))
    finetune(config(encoder, tmp_path / "jax", "jax", **settings))
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    assert_same_evaluations(tmp_path / "jax", tmp_path / "torch", ("ndcg@10", "mrr@10", "map@100"), 1e-6)


@pytest.mark.slow
def assert_resumes_bit_for_bit(build, tmp_path: Path, **settings) -> None:
    """A 4-step JAX run at once, and 2 steps then 2 more from the checkpoint: the same losses.
    build(output_dir, **settings) -> the run's config."""
    finetune(build(tmp_path / "whole", **settings))
    finetune(build(tmp_path / "parts", **{**settings, "max_steps": 2}))
    assert latest_checkpoint(tmp_path / "parts").name == "step-0000002"
    finetune(build(tmp_path / "parts", **settings), resume="latest")
    whole, parts = records(tmp_path / "whole", "train"), records(tmp_path / "parts", "train")
    assert sorted(parts) == [1, 2, 3, 4]
    assert [parts[s]["loss"] for s in parts] == [whole[s]["loss"] for s in parts]
    assert json.loads((tmp_path / "parts" / "results.json").read_text())["steps"] == 4


def test_a_bi_encoder_run_resumes_bit_for_bit(sts, tmp_path, minilm_path):
    """4 steps at once, and 2 steps then 2 more from the checkpoint: the same losses (dropout on)."""
    encoder = encoder_folder(tmp_path / "encoder", minilm_path, 0.1)
    train, dev = sts
    assert_resumes_bit_for_bit(lambda out, **kw: config(encoder, out, "jax", **kw), tmp_path, task="similarity",
                               train_file=str(train), validation_file=str(dev), schedule="constant",
                               warmup_steps=0, similarity={"mode": "bi-encoder"}, eval_every=0)


def compiled_ahead(monkeypatch) -> list[tuple[str, str, tuple]]:
    """Compile ahead as on a GPU, recording each compilation: (program, thread, batch shapes)."""
    import threading

    import bert_kit.jax.engine as engine_module
    from bert_kit.jax.compilation import AheadOfTime

    compiled: list[tuple[str, str, tuple]] = []
    original = AheadOfTime.compile

    def compile(self, args):
        if self.jitted.__name__ != "initial_leaves":  # (the train state's, compiled where the engine starts)
            compiled.append((self.jitted.__name__, threading.current_thread().name,
                             tuple(v.shape for v in args[self.batch_arg].values())))
        return original(self, args)

    monkeypatch.setattr(engine_module, "COMPILE_AHEAD_ON_CPU", True)
    monkeypatch.setattr(AheadOfTime, "compile", compile)
    return compiled


def test_programs_compiled_ahead_are_the_ones_the_run_uses(encoder, sts, tmp_path, monkeypatch, capsys):
    """As on a GPU: the run compiles, in its threads, the training step of its likely length buckets
    and the evaluation of every bucket its validation batches have; each program once; the
    evaluations (at steps 2 and 4) find theirs compiled ahead, none compiled while the run waits."""
    compiled = compiled_ahead(monkeypatch)
    train, dev = sts
    finetune(config(encoder, tmp_path / "run", "jax", task="similarity", train_file=str(train),
                    validation_file=str(dev), similarity={"mode": "bi-encoder"}))
    steps = [c for c in compiled if c[0] == "train_step"]
    evals = [c for c in compiled if c[0] == "outputs"]
    programs = [(name, shapes) for name, _, shapes in compiled]
    assert len(set(programs)) == len(programs)  # each program once, in whichever thread
    assert steps and evals and all(thread.startswith("compile") for _, thread, _ in evals)
    assert {shape for _, _, shapes in evals for shape in shapes[:1]} == {(2 * 64, 32)}  # both sides of 64 pairs
    assert "compiled ahead does not take" not in capsys.readouterr().err  # shapes, dtypes, shardings: the run's


def test_a_rerankers_programs_are_compiled_ahead_for_its_grid_and_its_pairs(encoder, tmp_path, monkeypatch):
    """A listwise reranker: the step compiled ahead takes its lists' grid (3 queries x 4 candidates
    a batch), the evaluation its pairs; nothing is compiled while the run waits."""
    from tests.tasks.test_reranker import write_groups

    compiled = compiled_ahead(monkeypatch)
    finetune(config(encoder, tmp_path / "run", "jax", task="reranker", batch_size=3, reranker={"loss": "listnet"},
                    train_file=str(write_groups(tmp_path / "train.jsonl", 8)),
                    validation_file=str(write_groups(tmp_path / "dev.jsonl", 4))))
    programs = [(name, shapes) for name, _, shapes in compiled]
    assert len(set(programs)) == len(programs) and all(thread.startswith("compile") for _, thread, _ in compiled)
    (step,) = [shapes for name, _, shapes in compiled if name == "train_step"]  # one length bucket
    Q = next(shape[1] for shape in step if shape[2] == 4)  # 3 lists, padded to a multiple of the devices
    assert Q >= 3 and set(step) == {(1, 4 * Q, 32), (1, Q, 4)}  # tokens (A, n Q, T); labels and mask (A, Q, n)


def test_compiling_ahead_takes_examples_in_any_order_of_length(encoder, tmp_path, monkeypatch):
    """The programs compiled ahead are shaped from an example padded to each likely bucket: the
    first example of the files was longer than the likeliest bucket (RTE on a GPU: "index can't
    contain negative values" before the first step)."""
    import bert_kit.jax.engine as engine_module

    monkeypatch.setattr(engine_module, "COMPILE_AHEAD_ON_CPU", True)
    long = " ".join(["word"] * 40)
    rows = [f"{long}\t1"] + [f"short text {i}\t{i % 2}" for i in range(30)]
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    results = finetune(config(encoder, tmp_path / "run", "jax", train_file=str(tmp_path / "train.tsv"),
                              validation_file=str(tmp_path / "dev.tsv"), max_length=64, max_steps=2))
    assert results["steps"] == 2 and 0.0 <= results["best_value"] <= 1.0
