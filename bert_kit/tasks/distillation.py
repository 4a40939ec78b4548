"""Distillation: a student trained on a fine-tuned teacher's outputs, through the one training loop.

    distill: {teacher: runs/sst2, temperature: 2.0, alpha: 0.5, student_layers: [0, 2, 4]}

The fine-tuning job builds its model (the student) as usual, and its loss becomes the
`Distiller`'s: the teacher (loaded from its folder, frozen, in eval mode) runs on the same batch
without gradients, and

* classification (Hinton et al. 2015; DistilBERT): loss = alpha * T^2 * KL(softmax(t / T) ||
  softmax(s / T)) + (1 - alpha) * CE(s, labels), the task's class_weights in the CE; several
  labels per text: each label's Bernoulli KL(sigmoid(t / T) || sigmoid(s / T)) and the task's
  binary cross-entropy; regression (one output): MSE onto the teacher's score in place of the KL;
* similarity bi-encoders (sentence-transformers' distillation, Reimers & Gurevych 2020): loss =
  alpha * MSE(student vectors, teacher vectors) (both pooled as the task pools, L2-normalised)
  + (1 - alpha) * the task's loss on the labels (cosine or CoSENT); a cross-encoder is a
  regression;
* hidden_weight > 0 adds the MSE between hidden states of mapped layers (over real tokens):
  student layer i against teacher layer student_layers[i] for a pruned copy, else against
  teacher layer (i + 1) * L_teacher / L_student - 1 (the last onto the last).

The student: `model` (a smaller preset, with the teacher's tokenizer; or any model folder with
the same vocabulary), or with `student_layers` a copy of the teacher with only those encoder
layers (and its embeddings, pooler and head), as DistilBERT initialises its student from every
other layer of BERT. The run records the teacher's own validation metrics (`teacher_metrics` in
results.json) beside the student's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.kernels import fast_path
from bert_kit.tasks.base import Task, encode
from bert_kit.training.losses import compute_classification_loss


def soft_label_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(softmax(teacher / T) || softmax(student / T)), averaged over rows: logits (B, C)."""
    t = temperature
    log_p = F.log_softmax(student.float() / t, dim=-1)
    log_q = F.log_softmax(teacher.float() / t, dim=-1)
    return F.kl_div(log_p, log_q, log_target=True, reduction="batchmean") * t * t


def soft_label_sets_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(sigmoid(teacher / T) || sigmoid(student / T)), each label a Bernoulli, averaged over
    (text, label): logits (B, C) of several labels per text."""
    t = temperature
    q = torch.sigmoid(teacher.float() / t)
    cross = F.binary_cross_entropy_with_logits(student.float() / t, q)
    entropy = F.binary_cross_entropy_with_logits(teacher.float() / t, q)  # makes it 0 where they agree
    return (cross - entropy) * t * t


def masked_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean squared difference over real tokens: hidden states (B, T, H) with mask (B, T), or packed (N, H)."""
    diff = (student.float() - teacher.float()).pow(2)
    if student.dim() == 2 or mask is None:
        return diff.mean()
    keep = mask.to(diff.dtype)[..., None]  # (B, T, 1)
    return (diff * keep).sum() / (keep.sum() * diff.shape[-1]).clamp_min(1)


def encoder_of(model: nn.Module) -> nn.Module:
    model = getattr(model, "module", model)  # DDP's wrapper
    return model.bert if hasattr(model, "bert") else model


def prune_layers(model: nn.Module, layers: list[int]) -> nn.Module:
    """Keep only the encoder `layers` of `model` (in that order), in place: a student as DistilBERT
    makes one from its teacher."""
    encoder = encoder_of(model)
    total = len(encoder.encoder.layers)
    bad = [i for i in layers if i >= total]
    if bad:
        raise ValueError(f"distill.student_layers {bad} are not layers of the teacher, which has {total} (0-{total - 1})")
    encoder.encoder.layers = nn.ModuleList(encoder.encoder.layers[i] for i in layers)
    model.config.num_hidden_layers = encoder.config.num_hidden_layers = len(layers)
    return model


def layer_map(student_layers: int, teacher_layers: int, chosen: list[int] | None) -> list[int]:
    """The teacher layer each student layer's hidden states are held to."""
    if chosen is not None:
        return list(chosen)
    return [(i + 1) * teacher_layers // student_layers - 1 for i in range(student_layers)]


class HiddenStates:
    """The output of each encoder layer of a model, kept by forward hooks while `on`."""

    def __init__(self, model: nn.Module) -> None:
        self.outputs: list[torch.Tensor] = []
        self.on = False
        for layer in encoder_of(model).encoder.layers:
            layer.register_forward_hook(self.keep)

    def keep(self, module: nn.Module, args: Any, output: torch.Tensor) -> None:
        if self.on:
            self.outputs.append(output)

    def run(self, call: Any) -> tuple[Any, list[torch.Tensor]]:
        self.outputs, self.on = [], True
        try:
            return call(), self.outputs
        finally:
            self.on = False


class Distiller:
    """The loss of a distillation run: the student's task loss mixed with the teacher's targets."""

    def __init__(self, settings: Any, task: Task, student: nn.Module, precision: Any) -> None:
        from bert_kit.model_folder import resolve_model

        self.s, self.task = settings, task
        folder = resolve_model(settings.teacher)
        self.teacher = task.load(folder).to(precision.device).eval().requires_grad_(False)
        fast_path.apply(self.teacher, precision.device, training=False, dtype=precision.dtype)  # it only runs inference
        t_config, s_config = self.teacher.config, student.config
        if t_config.vocab_size != s_config.vocab_size:
            raise ValueError(f"distill.teacher {folder} has a vocabulary of {t_config.vocab_size}, the student "
                             f"{s_config.vocab_size}: the student must read the teacher's tokens (its tokenizer)")
        self.bi_encoder = bool(getattr(task, "bi_encoder", False))
        if self.bi_encoder and t_config.hidden_size != s_config.hidden_size:
            raise ValueError(f"distill: the student's vectors ({s_config.hidden_size}) must have the teacher's size "
                             f"({t_config.hidden_size}) to regress onto them")
        if not self.bi_encoder and getattr(self.teacher, "num_labels", None) != getattr(student, "num_labels", None):
            raise ValueError(f"distill.teacher {folder} has {getattr(self.teacher, 'num_labels', None)} outputs, the "
                             f"student {getattr(student, 'num_labels', None)}: train the student on the teacher's labels")
        names, taught = getattr(task, "label_names", None), getattr(self.teacher, "id2label", None)
        taught = [taught[i] for i in range(len(taught))] if taught else None
        if names and taught and set(names) == set(taught) and list(names) != taught:  # soft labels on the wrong classes
            raise ValueError(f"distill.teacher {folder} predicts its labels in the order {taught}, the student's are "
                             f"{list(names)}: give label_names in the teacher's order")
        self.hidden = None
        if settings.hidden_weight > 0:
            if t_config.hidden_size != s_config.hidden_size:
                raise ValueError(f"distill.hidden_weight needs the teacher's hidden size ({t_config.hidden_size}) in "
                                 f"the student ({s_config.hidden_size})")
            self.map = layer_map(s_config.num_hidden_layers, t_config.num_hidden_layers, settings.student_layers)
            self.hidden = (HiddenStates(student), HiddenStates(self.teacher))
        self.folder = folder

    def outputs(self, model: nn.Module, batch: dict) -> torch.Tensor:
        """Logits (B, C), or a bi-encoder's normalised vectors (2B, H)."""
        if self.bi_encoder:
            return F.normalize(torch.cat(self.task.embed_pair(model, batch)).float(), dim=-1)
        return encode(model, batch, self.task.unpadded)

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        s = self.s
        if s.alpha == 0 and self.hidden is None:  # the labels alone: the teacher has nothing to add
            loss, parts = self.task.loss(model, batch)
            return loss, {**parts, "hard_loss": loss.detach()}
        student_hidden = teacher_hidden = []
        if self.hidden is None:
            student = self.outputs(model, batch)
            with torch.no_grad():
                teacher = self.outputs(self.teacher, batch)
        else:
            student, student_hidden = self.hidden[0].run(lambda: self.outputs(model, batch))
            with torch.no_grad():
                teacher, teacher_hidden = self.hidden[1].run(lambda: self.outputs(self.teacher, batch))
        if self.bi_encoder:
            soft = F.mse_loss(student, teacher)
            hard = self.task.loss(model, batch)[0] if s.alpha < 1 else soft.new_zeros(())
        else:
            if getattr(self.task, "multi_label", False):  # independent sigmoids: each label's own KL
                soft = soft_label_sets_loss(student, teacher, s.temperature)
            elif student.shape[-1] == 1:  # regression: the teacher's score is the soft target
                soft = F.mse_loss(student.float(), teacher.float())
            else:
                soft = soft_label_loss(student, teacher, s.temperature)
            # the task's own loss on the labels (its class_weights, its sigmoids for label sets)
            labels_loss = getattr(self.task, "labels_loss", None)
            hard = labels_loss(student, batch["labels"]) if labels_loss else \
                compute_classification_loss(student, batch["labels"])
        loss = s.alpha * soft + (1 - s.alpha) * hard
        parts = {"soft_loss": soft.detach(), "hard_loss": hard.detach()}
        if self.hidden is not None:
            mask = batch["attention_mask"] if student_hidden and student_hidden[0].dim() == 3 else None
            hidden = sum(masked_mse(h, teacher_hidden[j], mask) for h, j in zip(student_hidden, self.map))
            hidden = hidden / len(student_hidden)
            loss = loss + s.hidden_weight * hidden
            parts["hidden_loss"] = hidden.detach()
        return loss, parts

    def teacher_metrics(self, items: list[dict], precision: Any) -> dict[str, float]:
        """The teacher's validation metrics, for comparison with the student's."""
        metrics = self.task.evaluate(self.teacher, items, precision)
        return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}


def describe(settings: Any, folder: Path, student: nn.Module, teacher: nn.Module) -> str:
    """One line: who teaches whom, and how."""
    def size(m: nn.Module) -> str:
        return f"{m.config.num_hidden_layers} layers, {sum(p.numel() for p in m.parameters()) / 1e6:.1f}M parameters"

    how = f"T={settings.temperature:g}, alpha={settings.alpha:g}"
    if settings.hidden_weight:
        how += f", hidden states x{settings.hidden_weight:g}"
    return f"distill: teacher {folder} ({size(teacher)}) -> student ({size(student)}), {how}"
