"""Distillation through the one loop: the soft-label loss, students pruned from the teacher's
layers or built from a preset, classification on soft labels and bi-encoder vectors regressed
onto the teacher's.

Run: .venv/bin/python -m pytest tests/tasks/test_distillation.py -q -n 0
"""

import json

import pytest
import torch
import torch.nn.functional as F

from bert_kit.checks import ConfigError
from bert_kit.tasks.distillation import Distiller, layer_map, masked_mse, soft_label_loss, soft_label_sets_loss
from tests.tiny_runs import tiny_settings, tiny_setup


def test_the_soft_label_loss_is_the_temperature_scaled_kl():
    torch.manual_seed(0)
    student, teacher = torch.randn(5, 3), torch.randn(5, 3)
    p, q = F.softmax(teacher / 2, -1), F.log_softmax(student / 2, -1)
    expected = 4 * (p * (p.log() - q)).sum(-1).mean()
    torch.testing.assert_close(soft_label_loss(student, teacher, 2.0), expected, atol=1e-6, rtol=0)
    assert float(soft_label_loss(teacher, teacher, 3.0)) == pytest.approx(0.0, abs=1e-7)


def test_the_soft_loss_of_label_sets_is_each_labels_temperature_scaled_bernoulli_kl():
    torch.manual_seed(0)
    student, teacher = torch.randn(5, 3), torch.randn(5, 3)
    q, p = torch.sigmoid(teacher / 2), torch.sigmoid(student / 2)
    expected = 4 * (q * (q.log() - p.log()) + (1 - q) * ((1 - q).log() - (1 - p).log())).mean()
    torch.testing.assert_close(soft_label_sets_loss(student, teacher, 2.0), expected, atol=1e-6, rtol=0)
    assert float(soft_label_sets_loss(teacher, teacher, 3.0)) == pytest.approx(0.0, abs=1e-6)


class _Task:
    """What the Distiller asks of a classification task: its loss on the labels."""

    def __init__(self, multi_label: bool, weights: list[float]):
        self.multi_label, self.weights = multi_label, torch.tensor(weights)

    def labels_loss(self, logits, labels):
        if self.multi_label:
            return F.binary_cross_entropy_with_logits(logits, labels, pos_weight=self.weights)
        return F.cross_entropy(logits, labels, weight=self.weights)


@pytest.mark.parametrize("multi_label", [False, True])
def test_the_hard_loss_is_the_tasks_own_with_its_class_weights(multi_label):
    """class_weights (and a label set's sigmoids) hold in a distillation run's loss on the labels."""
    torch.manual_seed(0)
    student, teacher = torch.randn(4, 2), torch.randn(4, 2)
    labels = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]) if multi_label else torch.tensor([0, 1, 1, 0])
    task = _Task(multi_label, [1.0, 5.0])
    distiller = Distiller.__new__(Distiller)
    distiller.s = type("S", (), {"alpha": 0.25, "temperature": 2.0})()
    distiller.task, distiller.teacher, distiller.hidden, distiller.bi_encoder = task, "teacher", None, False
    distiller.outputs = lambda model, batch: teacher if model == "teacher" else student
    loss, parts = distiller.loss("student", {"labels": labels})
    soft = (soft_label_sets_loss if multi_label else soft_label_loss)(student, teacher, 2.0)
    torch.testing.assert_close(parts["hard_loss"], task.labels_loss(student, labels), atol=1e-6, rtol=0)
    torch.testing.assert_close(loss, 0.25 * soft + 0.75 * task.labels_loss(student, labels), atol=1e-6, rtol=0)


def test_layers_map_last_onto_last_and_masked_mse_ignores_padding():
    assert layer_map(3, 6, None) == [1, 3, 5] and layer_map(4, 12, None) == [2, 5, 8, 11]
    assert layer_map(2, 6, [0, 4]) == [0, 4]
    a, b = torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)
    b[1, 2] = 100.0  # a padding position
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert float(masked_mse(a, b, mask)) == 0.0
    b[0, 0] = 1.0
    assert float(masked_mse(a, b, mask)) == pytest.approx(4 / (5 * 4))


def test_distill_settings_are_checked():
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    with pytest.raises(ConfigError, match="distill.teacher is empty"):
        FinetuneConfig(distill={})
    with pytest.raises(ConfigError, match="distill.alpha=1.5 is out of range"):
        FinetuneConfig(distill={"teacher": "t", "alpha": 1.5})
    with pytest.raises(ConfigError, match=r"distill.student_layers=\[0, 0\] must be distinct"):
        FinetuneConfig(distill={"teacher": "t", "student_layers": [0, 0]})
    with pytest.raises(ConfigError, match="not task=qa"):
        FinetuneConfig(task="qa", distill={"teacher": "t"})
    with pytest.raises(ConfigError, match="leave model unset"):
        FinetuneConfig(model="bert-mini", distill={"teacher": "t", "student_layers": [0]})
    assert FinetuneConfig(distill={"teacher": "t", "student_layers": [0]}).model == "t"


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A 2-layer classifier that has learned the tiny task (accuracy 1.0)."""
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    root = tmp_path_factory.mktemp("distill")
    tiny = tiny_setup(root / "tiny")
    results = finetune(FinetuneConfig(**tiny_settings(tiny, root / "teacher", lr=1e-2, max_steps=36)))
    assert results["best_value"] == 1.0
    return tiny, root / "teacher"


def test_a_student_of_one_teacher_layer_learns_the_teachers_answers(teacher, tmp_path):
    from bert_kit.heads import BERTForSequenceClassification
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig
    from bert_kit.training.progress import read_metrics

    tiny, folder = teacher
    distill = {"teacher": str(folder), "student_layers": [1], "alpha": 1.0, "hidden_weight": 1.0}
    results = finetune(FinetuneConfig(**tiny_settings(tiny, tmp_path / "student", model="", lr=1e-2, max_steps=24,
                                                      distill=distill)))
    assert results["teacher_metrics"]["accuracy"] == 1.0 and results["best_value"] >= 0.9
    train = [r for r in read_metrics(tmp_path / "student") if r["type"] == "train"]
    assert {"soft_loss", "hard_loss", "hidden_loss"} <= set(train[0])
    assert train[-1]["soft_loss"] < train[0]["soft_loss"]
    student = BERTForSequenceClassification.from_pretrained(tmp_path / "student" / "best")
    assert student.config.num_hidden_layers == 1
    teacher_model = BERTForSequenceClassification.from_pretrained(folder / "best")
    torch.testing.assert_close(student.bert.embeddings.word_embeddings.weight.shape,
                               teacher_model.bert.embeddings.word_embeddings.weight.shape)


def test_a_preset_student_reads_the_teachers_tokenizer(teacher, tmp_path):
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    tiny, folder = teacher
    results = finetune(FinetuneConfig(**tiny_settings(tiny, tmp_path / "student", model="bert-tiny", lr=1e-2,
                                                      max_steps=6, distill={"teacher": str(folder)})))
    config = json.loads((tmp_path / "student" / "best" / "config.json").read_text())
    teacher_config = json.loads((folder / "best" / "config.json").read_text())
    assert config["hidden_size"] == 128 and config["vocab_size"] == teacher_config["vocab_size"]
    assert results["teacher_metrics"]["accuracy"] == 1.0
    with pytest.raises(ValueError, match="distill.hidden_weight needs the teacher's hidden size"):
        finetune(FinetuneConfig(**tiny_settings(tiny, tmp_path / "again", model="bert-tiny", max_steps=2,
                                                distill={"teacher": str(folder), "hidden_weight": 1.0})))


def test_a_student_whose_label_names_reorder_the_teachers_is_refused(teacher, tmp_path):
    """The soft labels are the teacher's outputs in id order: the student's classes must be in that order."""
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    tiny, folder = teacher
    names = json.loads((folder / "best" / "config.json").read_text())["id2label"]
    reordered = [names[str(i)] for i in reversed(range(len(names)))]
    with pytest.raises(ValueError, match=r"distill.teacher .* predicts its labels in the order .*label_names"):
        finetune(FinetuneConfig(**tiny_settings(tiny, tmp_path / "student", model="", max_steps=1,
                                                label_names=reordered,
                                                distill={"teacher": str(folder), "student_layers": [1]})))


def test_a_bi_encoder_student_regresses_onto_the_teachers_vectors(tmp_path):
    """sentence-transformers' distillation: the student's pooled, normalised vectors approach the
    teacher's (MSE), here a student of the teacher's first layer."""
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig
    from tests.tiny_runs import sentences

    tiny = tiny_setup(tmp_path / "tiny")
    rows = sentences(64, 3)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence\tsentence2\tlabel\n" + "".join(
        f"{a}\t{b}\t{5.0 if x == y else 0.0}\n" for (a, x), (b, y) in zip(rows[::2], rows[1::2])))
    settings = tiny_settings(tiny, tmp_path / "student", task="similarity", model="", train_file=str(pairs),
                             validation_file=str(pairs), text_pair_column="sentence2", lr=3e-3, max_steps=12,
                             similarity={"mode": "bi-encoder"},
                             distill={"teacher": str(tiny.encoder), "student_layers": [0], "alpha": 1.0})
    results = finetune(FinetuneConfig(**settings))
    assert results["train_soft_loss"] < 0.85 * results["initial_train_soft_loss"]
    assert set(results["teacher_metrics"]) >= {"spearman", "pearson"}
    assert (tmp_path / "student" / "best" / "modules.json").is_file()  # a sentence-transformers folder, as any bi-encoder


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_distillation_on_a_gpu_with_cuda_graphs_and_bf16(teacher, tmp_path):
    """The teacher's forward inside the student's step, replayed as a CUDA graph in bf16."""
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    tiny, folder = teacher
    distill = {"teacher": str(folder), "student_layers": [1], "alpha": 1.0, "hidden_weight": 1.0}
    results = finetune(FinetuneConfig(**tiny_settings(tiny, tmp_path / "student", model="", lr=1e-2, max_steps=24,
                                                      device="cuda", distill=distill)))
    assert results["teacher_metrics"]["accuracy"] == 1.0 and results["best_value"] >= 0.9
    assert results["train_soft_loss"] < results["initial_train_soft_loss"]
