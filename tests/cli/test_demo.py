"""`bert-kit demo` end to end at a reduced size: corpus from stdlib docstrings, tokenizer,
pretraining, fine-tuning, results JSON and plots.

Run: .venv/bin/python -m pytest tests/cli/test_demo.py -q
"""

import json

from bert_kit.cli import main
from bert_kit.cli.demo import harvest_docstrings, write_task


def test_docstring_corpus_and_task(tmp_path):
    documents, examples = harvest_docstrings()
    assert len(documents) > 50 and sum(len(d.split()) for d in documents) > 30_000
    train, dev, majority = write_task(examples, tmp_path)
    rows = train.read_text().splitlines()
    assert rows[0] == "sentence\tlabel" and all(r.count("\t") == 1 for r in rows)
    labels = [int(r.rsplit("\t", 1)[1]) for r in rows[1:]]
    assert 0.4 < sum(labels) / len(labels) < 0.6  # balanced classes
    assert 0.5 <= majority < 0.6


def test_demo_runs_end_to_end(tmp_path):
    assert main(["demo", "--output", str(tmp_path), "--pretrain-steps", "30", "--finetune-epochs", "0.5"]) == 0
    results = json.loads((tmp_path / "demo_results.json").read_text())
    assert results["pretrain"]["test_mlm_loss"] < 7.6  # below ln(2000): something was learnt
    assert (tmp_path / "pretrain" / "loss_curve.png").is_file()
    assert (tmp_path / "finetune" / "loss_curve.png").is_file()
    assert (tmp_path / "finetune" / "best" / "model.safetensors").is_file()
    assert 0.0 <= results["finetune"]["best_value"] <= 1.0
