"""Fine-tuning end to end on tiny slices of the real data sets, one test per task, plus resume,
stop-signal and NaN handling; and a short SST-2 run of the real MiniLM that must beat chance.

Tiny models are random 2-layer, width-32 BERTs with MiniLM's vocabulary; one CPU thread keeps
the timings steady on a shared machine.
Run: .venv/bin/python -m pytest tests/tasks/test_finetuning.py -q
"""

import dataclasses
import json
import signal

import pytest
import torch
from safetensors.torch import load_file
from torch.testing import assert_close

from bert_kit.cli import main as cli_main
from bert_kit.tasks.finetuning import FinetuneConfig, finetune
from bert_kit.heads import BERTForSequenceClassification
from bert_kit.model import BERTModel
from bert_kit.model_folder import read_model_metadata
from bert_kit.tasks.classification import ClassificationTask
from bert_kit.tasks.similarity import SimilarityTask
from bert_kit.tokenizer import get_tokenizer
from bert_kit.training.progress import read_metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def sst2(data_dir, tmp_path_factory):
    """(train.tsv with 48 rows, dev.tsv with 24 rows) cut from the real SST-2 files."""
    folder = tmp_path_factory.mktemp("sst2")
    for name, n in (("train.tsv", 48), ("dev.tsv", 24)):
        lines = (data_dir / "sst2" / name).read_text().splitlines()
        (folder / name).write_text("\n".join(lines[: n + 1]) + "\n")
    return folder / "train.tsv", folder / "dev.tsv"


def tiny_config(tiny_encoder, tmp_path, **kw) -> FinetuneConfig:
    settings = dict(model=str(tiny_encoder), output_dir=str(tmp_path / "run"), batch_size=8, lr=1e-3,
                    log_every=1, precision="fp32", device="cpu", seed=3)
    return FinetuneConfig(**{**settings, **kw})


def test_classification_writes_best_results_and_predictions(tiny_encoder, sst2, tmp_path):
    train, dev = sst2
    cfg = tiny_config(tiny_encoder, tmp_path, train_file=str(train), validation_file=str(dev), max_steps=6,
                      eval_every=3, label_names=["negative", "positive"], unpadded=True)
    results = finetune(cfg)
    run = tmp_path / "run"
    assert results["steps"] == 6 and [h["step"] for h in results["history"]] == [3, 6]
    assert results["best_step"] in (3, 6)
    best_acc = max(h["accuracy"] for h in results["history"])
    assert results["best_value"] == best_acc
    assert json.loads((run / "results.json").read_text())["best_value"] == best_acc
    assert not (run / "checkpoints").exists()  # best/ holds the model: no end checkpoint by default
    assert (run / "loss_curve.png").is_file() and (run / "run_config.yaml").is_file()
    # what ran: the reference model on the CPU (`fast_path.apply` found nothing faster)
    assert results["fast_path"] == "none (CPU: eager SDPA)"
    assert (run / "run_config.yaml").read_text().startswith("# fast path: none (CPU: eager SDPA)\n")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["type"] == "train" for r in records) == 6 and sum(r["type"] == "eval" for r in records) == 2

    # best/ is an HF folder with tokenizer, label names and the task recorded
    meta = read_model_metadata(run / "best")
    assert meta["task"] == "classification" and meta["label_names"] == ["negative", "positive"]
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForSequenceClassification.from_pretrained(run / "best").eval()
    ours = BERTForSequenceClassification.from_pretrained(run / "best")
    enc = get_tokenizer(run / "best")(["a gorgeous film", "dull and tedious"])
    with torch.no_grad():
        assert_close(hf(**enc).logits, ours(**enc), rtol=1e-5, atol=1e-5)
    assert hf.config.id2label == {0: "negative", 1: "positive"}

    # predict: one JSON line per input text, probabilities of the saved labels
    (tmp_path / "in.txt").write_text("a gorgeous film\ndull and tedious\n")
    assert cli_main(["predict", "--model", str(run / "best"), "--input", str(tmp_path / "in.txt"),
                     "--output", str(tmp_path / "preds.jsonl")]) == 0
    preds = [json.loads(line) for line in (tmp_path / "preds.jsonl").read_text().splitlines()]
    assert [p["text"] for p in preds] == ["a gorgeous film", "dull and tedious"]
    with torch.no_grad():
        probs = ours(**enc).softmax(-1)
    for p, row in zip(preds, probs):
        assert p["label"] == ["negative", "positive"][int(row.argmax())]
        assert p["probabilities"]["positive"] == pytest.approx(float(row[1]), abs=1e-5)


def test_best_holds_the_weights_of_its_step_though_written_while_training_went_on(tiny_encoder, sst2, tmp_path,
                                                                                  monkeypatch):
    """best/ is written by a thread from a copy of the weights while the next steps run: it holds
    the weights of the evaluated step, not those of a later one."""
    from bert_kit.tasks.finetuning import FinetuningJob

    scores = iter([0.9, 0.5, 0.4, 0.3])  # the first evaluation (step 2) is the best
    monkeypatch.setattr(FinetuningJob, "evaluate", lambda self, final: {"accuracy": next(scores)})
    train, dev = sst2
    cfg = tiny_config(tiny_encoder, tmp_path, train_file=str(train), validation_file=str(dev), max_steps=8,
                      eval_every=2, save_every=2, keep_last=0)
    results = finetune(cfg)
    assert results["best_step"] == 2 and results["best_value"] == 0.9
    run = tmp_path / "run"
    best = load_file(run / "best" / "model.safetensors")
    at_2 = load_file(run / "checkpoints" / "step-0000002" / "model.safetensors")
    at_8 = load_file(run / "checkpoints" / "step-0000008" / "model.safetensors")
    for k in best:
        assert_close(best[k], at_2[k], rtol=0, atol=0)
    assert any(not torch.equal(best[k], at_8[k]) for k in best)
    assert not (run / "best.tmp").exists() and not (run / "best.old").exists()


def test_the_precision_is_resolved_after_the_data_is_read_and_the_model_built(tiny_encoder, sst2, tmp_path,
                                                                              monkeypatch):
    """CUDA starts in a thread (`start_cuda`) while the job reads its data and builds its model on
    the CPU: the precision is resolved once, after those; a bad device still fails before them."""
    from bert_kit.checks import ConfigError
    from bert_kit.training import engine

    events = []
    resolve, read, start = engine.resolve_precision, ClassificationTask.read_train, engine.start_cuda
    monkeypatch.setattr(engine, "resolve_precision", lambda *a, **k: events.append("precision") or resolve(*a, **k))
    monkeypatch.setattr(engine, "start_cuda", lambda device: events.append(f"start {device}") or start(device))
    monkeypatch.setattr(ClassificationTask, "read_train", lambda self, path, limit=None: events.append("data") or read(self, path, limit))
    train, dev = sst2
    finetune(tiny_config(tiny_encoder, tmp_path, train_file=str(train), validation_file=str(dev), max_steps=1))
    assert events == ["start cpu", "data", "precision"]
    events.clear()
    with pytest.raises(ConfigError, match="CUDA is not available"):
        finetune(tiny_config(tiny_encoder, tmp_path, train_file=str(train), device="cuda:0", overwrite=True))
    assert events == []


def test_the_loader_knows_where_the_run_ends(tiny_encoder, sst2, tmp_path, monkeypatch):
    """So that its last epoch starts no workers for an epoch nobody reads."""
    from bert_kit.data.pretraining import ResumableDataLoader

    calls, stop_after = [], ResumableDataLoader.stop_after
    monkeypatch.setattr(ResumableDataLoader, "stop_after",
                        lambda self, n: calls.append((self.epoch, self.batch_index, n)) or stop_after(self, n))
    train, dev = sst2
    finetune(tiny_config(tiny_encoder, tmp_path, train_file=str(train), validation_file=str(dev), max_steps=5,
                         grad_accum=2, eval_every=0))
    assert calls == [(0, 0, 10)]


def test_resume_reproduces_the_uninterrupted_run(tiny_encoder, sst2, tmp_path):
    train, dev = sst2
    full = tiny_config(tiny_encoder, tmp_path / "a", train_file=str(train), validation_file=str(dev),
                       max_steps=8, eval_every=4, save_every=2, keep_last=0)
    finetune(full)
    ckpts = tmp_path / "a" / "run" / "checkpoints"
    # lose everything after step 4 (as a crash would), then resume from the newest checkpoint
    part = tiny_config(tiny_encoder, tmp_path / "b", train_file=str(train), validation_file=str(dev),
                       max_steps=8, eval_every=4, save_every=2, keep_last=0)
    import shutil

    shutil.copytree(tmp_path / "a" / "run", tmp_path / "b" / "run")
    for step in ("step-0000006", "step-0000008"):
        shutil.rmtree(tmp_path / "b" / "run" / "checkpoints" / step)
    (tmp_path / "b" / "run" / "results.json").unlink()  # a crash comes before the results
    resumed = finetune(part, resume="latest")
    assert resumed["steps"] == 8 and [h["step"] for h in resumed["history"]] == [4, 8]
    a = load_file(ckpts / "step-0000008" / "model.safetensors")
    b = load_file(tmp_path / "b" / "run" / "checkpoints" / "step-0000008" / "model.safetensors")
    for k in a:
        assert_close(b[k], a[k], rtol=0, atol=0)
    assert resumed["best_value"] == json.loads((tmp_path / "a" / "run" / "results.json").read_text())["best_value"]


def test_a_finished_run_is_extended_from_its_end_checkpoint_when_it_wrote_one(tiny_encoder, sst2, tmp_path):
    train, dev = sst2
    kept = tiny_config(tiny_encoder, tmp_path / "a", train_file=str(train), validation_file=str(dev), max_steps=4,
                       end_checkpoint=True)
    finetune(kept)
    assert [p.name for p in (tmp_path / "a" / "run" / "checkpoints").iterdir()] == ["step-0000004"]
    extended = finetune(dataclasses.replace(kept, max_steps=6), resume="latest")
    assert extended["steps"] == 6 and [h["step"] for h in extended["history"]] == [4, 6]

    default = tiny_config(tiny_encoder, tmp_path / "b", train_file=str(train), validation_file=str(dev), max_steps=4)
    finetune(default)
    assert not (tmp_path / "b" / "run" / "checkpoints").exists()
    with pytest.raises(FileNotFoundError, match=r"finished without an end checkpoint \(end_checkpoint: false"):
        finetune(dataclasses.replace(default, max_steps=6), resume="latest")


def test_stop_signal_saves_a_checkpoint_and_exits_130(tiny_encoder, sst2, tmp_path, monkeypatch):
    train, _ = sst2
    original, calls = ClassificationTask.loss, []

    def loss_then_signal(self, model, batch):
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGINT)  # as if Ctrl-C arrived during step 2
        return original(self, model, batch)

    monkeypatch.setattr(ClassificationTask, "loss", loss_then_signal)
    rc = cli_main(["finetune", "--task", "classification", f"model={tiny_encoder}", f"train_file={train}",
                   f"output_dir={tmp_path / 'run'}", "max_steps=10", "batch_size=8", "device=cpu", "log_every=5"])
    assert rc == 130
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["stopped"] == "SIGINT" and results["steps"] == 2
    assert (tmp_path / "run" / "checkpoints" / "step-0000002" / "trainer_state.pt").is_file()
    # the stopped step's loss is logged, though log_every had not come round
    assert [r["step"] for r in read_metrics(tmp_path / "run") if r["type"] == "train"] == [1, 2]


def test_nan_loss_stops_with_a_clear_error(tiny_encoder, sst2, tmp_path, capsys, monkeypatch):
    train, _ = sst2
    original = ClassificationTask.loss

    def nan_loss(self, model, batch):  # (a folder with NaN weights is refused when it is read)
        loss, parts = original(self, model, batch)
        return loss * float("nan"), parts

    monkeypatch.setattr(ClassificationTask, "loss", nan_loss)
    rc = cli_main(["finetune", "--task", "classification", f"model={tiny_encoder}", f"train_file={train}",
                   f"output_dir={tmp_path / 'run'}", "max_steps=3", "device=cpu"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "non-finite loss at step 1" in err and "Last good checkpoint: none" in err
    assert not (tmp_path / "run" / "best").exists()


def test_token_classification_on_conll(tiny_encoder, data_dir, tmp_path):
    def cut(name, n_lines):  # whole sentences; train holds every tag of the validation lines (I-LOC first at 800)
        lines = (data_dir / "conll2003" / name).read_text().splitlines()[:n_lines]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        return tmp_path / name

    cfg = tiny_config(tiny_encoder, tmp_path, task="token-classification", train_file=str(cut("train.txt", 800)),
                      validation_file=str(cut("valid.txt", 120)), max_steps=4, lr=5e-3)
    results = finetune(cfg)
    best = tmp_path / "run" / "best"
    labels = read_model_metadata(best)["label_names"]
    assert labels[0] == "O" and {"B-PER", "I-PER", "B-ORG", "B-LOC", "B-MISC"} <= set(labels)
    final = results["history"][-1]
    assert 0.0 <= final["f1"] <= 1.0 and 0.0 < final["accuracy"] <= 1.0
    (tmp_path / "sentences.txt").write_text("EU rejects German call to boycott British lamb .\nPeter Blackburn\n")
    assert cli_main(["predict", "--model", str(best), "--input", str(tmp_path / "sentences.txt"),
                     "--output", str(tmp_path / "tags.jsonl")]) == 0
    preds = [json.loads(line) for line in (tmp_path / "tags.jsonl").read_text().splitlines()]
    assert [len(p["words"]) for p in preds] == [9, 2]
    assert all(len(p["tags"]) == len(p["words"]) and set(p["tags"]) <= set(labels) for p in preds)


def test_qa_with_an_article_split(tiny_encoder, data_dir, tmp_path):
    squad = json.loads((data_dir / "squad-v1.1" / "dev-v1.1.json").read_text())
    # three articles, two paragraphs each: the first two train, the last one evaluates
    small = {"version": "1.1", "data": [{"title": a["title"], "paragraphs": a["paragraphs"][:2]}
                                        for a in squad["data"][:3]]}
    (tmp_path / "squad.json").write_text(json.dumps(small))
    cfg = tiny_config(tiny_encoder, tmp_path, task="qa", train_file=str(tmp_path / "squad.json"),
                      qa={"train_articles": 2, "doc_stride": 32}, max_length=128, max_steps=3)
    results = finetune(cfg)
    n_eval = sum(len(p["qas"]) for p in small["data"][2]["paragraphs"])
    assert results["num_eval_features"] >= n_eval  # long contexts give several windows
    final = results["history"][-1]
    assert 0.0 <= final["exact_match"] <= final["f1"] <= 100.0 and final["num_examples"] == n_eval
    assert read_model_metadata(tmp_path / "run" / "best")["doc_stride"] == 32
    paragraph = small["data"][2]["paragraphs"][0]
    lines = [json.dumps({"question": qa["question"], "context": paragraph["context"]}) for qa in paragraph["qas"][:3]]
    (tmp_path / "questions.jsonl").write_text("\n".join(lines) + "\n")
    assert cli_main(["predict", "--model", str(tmp_path / "run" / "best"), "--input",
                     str(tmp_path / "questions.jsonl"), "--output", str(tmp_path / "answers.jsonl")]) == 0
    answers = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert len(answers) == 3 and all(a["answer"] in paragraph["context"] for a in answers)


@pytest.fixture(scope="module")
def sts(data_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sts")
    for name, n in (("sts-train.csv", 48), ("sts-dev.csv", 24)):
        lines = (data_dir / "stsb" / name).read_text().splitlines()[:n]
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder / "sts-train.csv", folder / "sts-dev.csv"


def test_similarity_cross_encoder(tiny_encoder, sts, tmp_path):
    train, dev = sts
    cfg = tiny_config(tiny_encoder, tmp_path, task="similarity", train_file=str(train), validation_file=str(dev),
                      max_steps=3)
    results = finetune(cfg)
    assert results["metric"] == "spearman" and set(results["history"][-1]) >= {"pearson", "spearman", "mse"}
    model = BERTForSequenceClassification.from_pretrained(tmp_path / "run" / "best")
    assert model.num_labels == 1  # the regression head


@pytest.mark.parametrize("mode", ["cross-encoder", "bi-encoder"])
def test_similarity_max_train_examples_counts_the_cut_pairs_among_those_that_train(tiny_encoder, sts, tmp_path,
                                                                                   capsys, mode):
    train, dev = sts
    cfg = tiny_config(tiny_encoder, tmp_path, task="similarity", train_file=str(train), validation_file=str(dev),
                      max_steps=1, batch_size=2, max_length=4, max_train_examples=5, similarity={"mode": mode})
    assert finetune(cfg)["num_train_examples"] == 5
    assert "sts-train.csv: 5 of 5 pairs were longer than max_length 4" in capsys.readouterr().err


def test_classification_regression_on_sentence_pairs(tiny_encoder, sts, tmp_path):
    """Float labels make a regression head (num_labels=1, MSE) scored by Pearson; pairs via text_pair_column."""
    from bert_kit.data.sts import read_sts

    for name, path in (("train.tsv", sts[0]), ("dev.tsv", sts[1])):
        s1, s2, scores = read_sts(path)
        rows = "".join(f"{a}\t{b}\t{y}\n" for a, b, y in zip(s1, s2, scores))
        (tmp_path / name).write_text("sentence\tsentence2\tlabel\n" + rows)
    cfg = tiny_config(tiny_encoder, tmp_path, train_file=str(tmp_path / "train.tsv"),
                      validation_file=str(tmp_path / "dev.tsv"), text_pair_column="sentence2", max_steps=2)
    results = finetune(cfg)
    assert results["metric"] == "pearson" and "spearman" in results["history"][-1]
    assert BERTForSequenceClassification.from_pretrained(tmp_path / "run" / "best").num_labels == 1


def test_similarity_bi_encoder_cosine_loss(tiny_encoder, sts, tmp_path):
    train, dev = sts
    cfg = tiny_config(tiny_encoder, tmp_path, task="similarity", similarity={"mode": "bi-encoder"},
                      train_file=str(train), validation_file=str(dev), max_steps=3)
    task = SimilarityTask(cfg)
    task.bind(get_tokenizer(tiny_encoder))
    batch = task.collate(task.read_train(train)[:4])
    model = BERTModel.from_pretrained(tiny_encoder)
    from bert_kit.data.sts import read_sts

    s1, s2, scores = read_sts(train)
    tokenizer = get_tokenizer(tiny_encoder)
    with torch.no_grad():
        loss, _ = task.loss(model, batch)
        # CosineSimilarityLoss by hand: MSE between cos(u, v) of mean-pooled vectors and score / 5
        def vec(texts):
            enc = tokenizer(texts[:4])
            h = model(enc["input_ids"], enc["attention_mask"])
            m = enc["attention_mask"][..., None].float()
            return (h * m).sum(1) / m.sum(1)
        cos = torch.nn.functional.cosine_similarity(vec(s1), vec(s2))
    gold = torch.tensor(scores[:4], dtype=torch.float32) / 5
    assert_close(loss, ((cos - gold) ** 2).mean(), rtol=1e-5, atol=1e-6)

    results = finetune(cfg)
    best = tmp_path / "run" / "best"
    assert results["best_step"] is not None and read_model_metadata(best)["similarity_mode"] == "bi-encoder"
    st = pytest.importorskip("sentence_transformers")
    from bert_kit.embeddings import SentenceEncoder

    texts = read_sts(dev)[0][:6]
    expect = st.SentenceTransformer(str(best), device="cpu").encode(texts)
    assert_close(torch.tensor(SentenceEncoder.from_pretrained(best, max_length=128).encode(texts)),
                 torch.tensor(expect), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_sst2_minilm_beats_chance(minilm_path, data_dir, tmp_path):
    """500 SST-2 training rows, two epochs on the CPU: dev accuracy far above the 50% of chance."""
    for name, n in (("train.tsv", 500), ("dev.tsv", 200)):
        lines = (data_dir / "sst2" / name).read_text().splitlines()
        (tmp_path / name).write_text("\n".join(lines[: n + 1]) + "\n")
    cfg = FinetuneConfig(model=str(minilm_path), train_file=str(tmp_path / "train.tsv"),
                         validation_file=str(tmp_path / "dev.tsv"), output_dir=str(tmp_path / "run"),
                         epochs=2, batch_size=32, lr=2e-4, max_length=64, unpadded=True, device="cpu", seed=0)
    results = finetune(cfg)
    assert results["best_metrics"]["num_examples"] == 200
    assert results["best_value"] >= 0.70, results["history"]
    assert results["train_loss"] < results["initial_train_loss"]


def test_config_errors(tmp_path, tiny_encoder):
    with pytest.raises(ValueError, match="unknown key"):
        cli_main_raises(["finetune", "--task", "qa", "model=x", "learning_rate=1"])
    (tmp_path / "run.yaml").write_text("task: qa\nmodel: x\n")
    assert cli_main(["finetune", "--task", "similarity", "--config", str(tmp_path / "run.yaml")]) == 2  # a usage error
    with pytest.raises(FileNotFoundError, match="neither a model folder"):
        finetune(FinetuneConfig(model="no-such-model", tokenizer=str(tiny_encoder), train_file=__file__,
                                output_dir=str(tmp_path / "r"), device="cpu"))


def cli_main_raises(argv):
    """Parse and load a finetune config without running it (errors propagate)."""
    from bert_kit.cli import build_parser
    from bert_kit.cli.finetune import load_run_config

    return load_run_config(build_parser("finetune").parse_args(argv))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cosent_loss_matches_sentence_transformers(seed):
    """Same value as sentence-transformers' CoSENTLoss on random vectors, with tied gold scores."""
    pytest.importorskip("sentence_transformers")
    from types import SimpleNamespace

    try:
        from sentence_transformers.sentence_transformer.losses import CoSENTLoss
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.losses import CoSENTLoss
    from sentence_transformers.util import pairwise_cos_sim

    from bert_kit.training.losses import compute_cosent_loss

    g = torch.Generator().manual_seed(seed)
    u, v = torch.randn(16, 8, generator=g), torch.randn(16, 8, generator=g)
    scores = torch.randint(0, 6, (16,), generator=g).float()  # ties: those pairs take no part
    # the loss as sentence-transformers computes it from embeddings (no model needed)
    settings = SimpleNamespace(scale=20.0, similarity_fct=pairwise_cos_sim)
    expect = CoSENTLoss.compute_loss_from_embeddings(settings, [u, v], scores)
    assert_close(compute_cosent_loss(u, v, scores), expect, rtol=1e-5, atol=1e-5)
    # already ranked right by a wide margin: loss near 0; ranked backwards: large
    same = torch.randn(4, 8, generator=g)
    near = torch.stack([same[i] + 0.1 * i * torch.randn(8, generator=g) for i in range(4)])
    ranked = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert compute_cosent_loss(same, near, ranked) < compute_cosent_loss(same, near, ranked.flip(0))


def test_similarity_bi_encoder_cosent_trains(tiny_encoder, sts, tmp_path):
    train, dev = sts
    cfg = tiny_config(tiny_encoder, tmp_path, task="similarity", similarity={"mode": "bi-encoder", "loss": "cosent"},
                      train_file=str(train), validation_file=str(dev), max_steps=3)
    task = SimilarityTask(cfg)
    task.bind(get_tokenizer(tiny_encoder))
    batch = task.collate(task.read_train(train)[:4])
    model = BERTModel.from_pretrained(tiny_encoder)
    from bert_kit.training.losses import compute_cosent_loss

    with torch.no_grad():
        u, v = task.embed_pair(model, batch)
        assert_close(task.loss(model, batch)[0], compute_cosent_loss(u, v, batch["labels"]))
    results = finetune(cfg)
    assert results["best_step"] is not None and results["metric"] == "spearman"


def test_bi_encoder_cosent_steps_match_transformers(minilm_path, data_dir):
    """Real MiniLM, four AdamW steps on STS-B pairs: bert-kit's bi-encoder path (unpadded encoder,
    mean pooling, CoSENT, its optimizer groups) and `transformers.AutoModel` with the same loss
    and groups give the same losses and gradient norms (dropout off, fp32)."""
    transformers = pytest.importorskip("transformers")
    from bert_kit.embeddings import mean_pool
    from bert_kit.training.optim import create_optimizer
    from bert_kit.training.losses import compute_cosent_loss

    cfg = FinetuneConfig(model=str(minilm_path), task="similarity", similarity={"mode": "bi-encoder", "loss": "cosent"},
                         unpadded=True, precision="fp32", device="cpu")
    task = SimilarityTask(cfg)
    task.bind(get_tokenizer(minilm_path))
    items = task.read_train(data_dir / "stsb" / "sts-train.csv")[:32]
    ours = task.build(minilm_path).eval()  # eval(): dropout off; gradients still flow
    hf = transformers.AutoModel.from_pretrained(minilm_path, add_pooling_layer=False, dtype=torch.float32).eval()
    opt_ours = create_optimizer(ours, "adamw", 1e-4, 0.01, (0.9, 0.999), 1e-6, "cpu")
    no_decay = [p for n, p in hf.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in hf.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    opt_hf = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                               lr=1e-4, eps=1e-6)
    for i in range(4):
        batch = task.collate(items[8 * i: 8 * i + 8])
        loss_ours = task.loss(ours, batch)[0]
        hidden = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        loss_hf = compute_cosent_loss(*mean_pool(hidden, batch["attention_mask"]).chunk(2), batch["labels"])
        assert_close(loss_ours, loss_hf, rtol=1e-4, atol=1e-5, msg=f"step {i}")
        loss_ours.backward()
        loss_hf.backward()
        norm_ours = torch.nn.utils.clip_grad_norm_(ours.parameters(), 1.0)
        assert_close(norm_ours, torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0), rtol=1e-4, atol=1e-5)
        for opt in (opt_ours, opt_hf):
            opt.step()
            opt.zero_grad()
    assert loss_ours.item() > 0.1  # a ranking loss with work left: the comparison is not of zeros


@pytest.mark.slow
def test_compiled_finetune_matches_eager(tiny_encoder, sst2, tmp_path):
    """compile=true trains on padded batches (unpadded is switched off) and follows the eager run."""
    import json
    import shutil

    train, dev = sst2
    model = tmp_path / "no_dropout"  # compiled dropout draws other masks than eager: switch it off
    shutil.copytree(tiny_encoder, model)
    config = json.loads((model / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model / "config.json").write_text(json.dumps(config))
    common = dict(train_file=str(train), validation_file=str(dev), max_steps=3, max_eval_examples=16,
                  unpadded=True, classifier_dropout=0.0, log_every=3)
    compiled = tiny_config(model, tmp_path / "c", compile=True, **common)
    assert compiled.unpadded is False
    eager = finetune(tiny_config(model, tmp_path / "e", **common))
    fast = finetune(compiled)
    assert fast["steps"] == 3
    # same data, init and updates; padding to multiples of 16 changes only float rounding
    assert fast["initial_train_loss"] == pytest.approx(eager["initial_train_loss"], rel=1e-5)
    assert fast["train_loss"] == pytest.approx(eager["train_loss"], rel=1e-4)
    assert fast["history"][-1]["loss"] == pytest.approx(eager["history"][-1]["loss"], rel=1e-4)


def test_static_shapes_take_the_row_layout_only_where_it_is_set_and_wanted():
    """CUDA graphs need static shapes: padded with a mask, or every position laid out in rows for
    flash attention (`row_layout`, set for bf16 on a GPU); `unpadded: false` keeps the mask."""
    from types import SimpleNamespace

    from bert_kit.tasks.base import Task

    task = Task(SimpleNamespace(unpadded=True))
    assert task.unpadded is True
    task.static_shapes = True
    assert task.unpadded is False
    task.row_layout = True
    assert task.unpadded == "rows"
    assert Task(SimpleNamespace(unpadded=False, static_shapes=True)).unpadded is False
    off = Task(SimpleNamespace(unpadded=False))
    off.static_shapes = off.row_layout = True
    assert off.unpadded is False
