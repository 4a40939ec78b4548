"""ModernBERT pretrained from scratch by `bert-kit pretrain` (a ModernBERT preset in `model`, MLM only)
on a CPU: a few steps, saved (an HF ModernBERT folder transformers loads with the same outputs),
resumed from a checkpoint with the same steps as the run that went on, then fine-tuned from its
folder; what it cannot train (NSP, segment pairs) is refused in one line; the 6-minute modern
recipe's model is ModernBERT sized to its tokenizer.

Run: .venv/bin/python -m pytest tests/tasks/test_pretraining_modernbert.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bert_kit.checks import ConfigError
from bert_kit.cli import main as cli
from bert_kit.tasks.finetuning import FinetuneConfig, finetune
from bert_kit.tasks.pretraining import PretrainConfig, pretrain
from bert_kit.tokenizer import get_tokenizer
from bert_kit.training.progress import read_metrics
from tests.tasks.test_pretraining import tiny_config

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_torch_thread")
# 3 layers (global, local, local) whose +-4 window is far shorter than the 32-token sequences
TINY_MODERNBERT = {"preset": "modernbert-tiny", "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 48,
                   "local_attention": 8, "max_position_embeddings": 64}


def modern_config(tmp_path: Path, name: str = "run", **overrides) -> PretrainConfig:
    return tiny_config(tmp_path, name, **{"model": TINY_MODERNBERT, "nsp": False, "max_steps": 10,
                                          "save_every": 5, "keep_last": 0, **overrides})


def test_pretrains_saves_resumes_and_fine_tunes(tmp_path, capsys):
    straight = modern_config(tmp_path, "straight")
    results = pretrain(straight)
    assert results["steps"] == 10 and results["test_mlm_loss"] < results["initial_train_mlm_loss"]
    assert "model: ModernBertForMaskedLM" in capsys.readouterr().out
    final = tmp_path / "straight" / "final"
    config = json.loads((final / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["architectures"] == ["ModernBertForMaskedLM"]
    tokenizer = get_tokenizer(tmp_path / "tokenizer")  # sized to it, its special tokens' ids kept
    assert config["vocab_size"] == tokenizer.vocab_size and config["local_attention"] == 8
    assert (config["pad_token_id"], config["cls_token_id"], config["sep_token_id"]) == (
        tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id)

    # from the checkpoint at step 5, into another folder: the same steps 6-10 and the same weights
    resumed = tmp_path / "resumed"
    checkpoint = tmp_path / "straight" / "checkpoints" / "step-0000005"
    again = pretrain(modern_config(tmp_path, "resumed"), resume=str(checkpoint))
    assert again["steps"] == 10
    a = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "straight") if r["type"] == "train"}
    b = {r["step"]: r["loss"] for r in read_metrics(resumed) if r["type"] == "train"}
    assert sorted(b) == list(range(6, 11))
    assert [b[s] for s in range(6, 11)] == [a[s] for s in range(6, 11)]
    wa, wb = load_file(final / "model.safetensors"), load_file(resumed / "final" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=0, msg=k)

    # transformers reads the folder with bert-kit's outputs
    transformers = pytest.importorskip("transformers")
    from bert_kit.modernbert import ModernBertForMaskedLM

    ours = ModernBertForMaskedLM.from_pretrained(final)
    theirs = transformers.ModernBertForMaskedLM.from_pretrained(final).eval()
    ids = torch.randint(5, tokenizer.vocab_size, (2, 30))
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask)[mask.bool()], theirs(ids, attention_mask=mask).logits[mask.bool()],
                                   rtol=1e-5, atol=1e-5)

    # fine-tuned from its folder: the run folder stands for its final/ model, with its tokenizer
    rows = [("the red cat sees the dog", 1), ("the sad fish eats the tree", 0)] * 8
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    tuned = finetune(FinetuneConfig(task="classification", model=str(tmp_path / "straight"),
                                    train_file=str(tmp_path / "train.tsv"), validation_file=str(tmp_path / "train.tsv"),
                                    max_length=32, epochs=1, batch_size=8, output_dir=str(tmp_path / "tuned"),
                                    device="cpu"))
    assert tuned["best_value"] is not None
    head = json.loads((tmp_path / "tuned" / "best" / "config.json").read_text())
    assert head["architectures"] == ["ModernBertForSequenceClassification"] and head["local_attention"] == 8


def test_what_modernbert_cannot_train_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match="nsp: true trains next-sentence prediction on the pooler, which a "
                                          "modernbert encoder does not have: set nsp: false"):
        modern_config(tmp_path, nsp=True)
    with pytest.raises(ConfigError, match="segment_pairs: true trains the segment-1 embedding, which a modernbert"):
        modern_config(tmp_path, segment_pairs=True)
    cfg = modern_config(tmp_path)
    assert cli(["pretrain", "--config", str(write_config(tmp_path, cfg)), "nsp=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "set nsp: false (MLM only)" in err[0]


def write_config(tmp_path: Path, cfg: PretrainConfig) -> Path:
    from bert_kit.training.runconfig import save_config

    path = tmp_path / "modern.yaml"
    save_config(cfg, path)
    return path


def test_the_modern_recipe_is_the_budget_recipe_with_the_modern_architecture(monkeypatch, tmp_path):
    """configs/pretrain_cram_modernbert.yaml: the same corpus, tokenizer, budget and optimisation as
    configs/pretrain_cram.yaml; a ModernBERT of bert-small's FLOPs a token, MLM only."""
    import yaml

    modern = yaml.safe_load((REPO / "configs" / "pretrain_cram_modernbert.yaml").read_text())
    bert = yaml.safe_load((REPO / "configs" / "pretrain_cram.yaml").read_text())
    differ = {k for k in bert.keys() | modern.keys() if bert.get(k) != modern.get(k)}
    assert differ == {"model", "mask_probability", "segment_pairs", "output_dir"}
    from bert_kit.config import BertConfig, config_from_name
    from bert_kit.modernbert import flops_per_token as modern_flops
    from bert_kit.model import flops_per_token as bert_flops

    small = config_from_name(modern["model"]["preset"], vocab_size=32768, pad_token_id=0)
    assert small.model_type == "modernbert" and small.max_length >= modern["max_length"]
    ratio = modern_flops(small, 128, 0.25) / bert_flops(BertConfig.from_name("bert-small", vocab_size=32768), 128, 0.25)
    assert 0.95 < ratio < 1.15, ratio
