"""`bert-kit demo` end to end at a reduced size: generated corpus, tokenizer, pretraining,
fill-mask on held-out sentences, fine-tuning beside a random-init run, results and plots.

The full-size demo's figures (README) come from `bert-kit demo` itself; this test checks the
pipeline and its bookkeeping, not the figures.

Run: .venv/bin/python -m pytest tests/cli/test_demo.py -q
"""

import json

import pytest

from bert_kit.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # steady on a shared 2-core machine


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--output", str(out), "--pretrain-steps", "20", "--finetune-epochs", "0.3",
                 "--device", "cpu"]) == 0
    return out


def test_demo_results_and_files(demo_run, capsys):
    results = json.loads((demo_run / "demo_results.json").read_text())
    pre, fill, fin = results["pretrain"], results["fill_mask"], results["finetune"]
    assert pre["steps"] == 20 and pre["test_mlm_loss"] < 6.2  # below ln(vocab): something was learnt
    assert 0.0 <= pre["test_nsp_accuracy"] <= 1.0
    assert fill["probes"] == 200 and set(fill["by_kind"]) == {"country", "language", "workplace", "food"}
    assert 0.0 < fill["guessing"] < 0.5 and len(fill["examples"]) == 6
    assert 0.25 < fin["majority_baseline"] < 0.4 and 0.0 <= fin["accuracy"] <= 1.0
    for folder in ("pretrain", "finetune", "finetune_random_init"):
        assert (demo_run / folder / "loss_curve.png").is_file()
    assert (demo_run / "finetune" / "best" / "model.safetensors").is_file()
    lines = (demo_run / "data" / "sentences.txt").read_text().splitlines()
    assert len(lines) == 20 and all(lines)


def test_batched_probe_answers_equal_fill_mask(demo_run):
    """The demo scores its probes in one batch; `bert-kit fill-mask` answers one text at a time."""
    from bert_kit.tasks.fill_mask import fill_mask, load_mlm_model
    from bert_kit.tokenizer import get_tokenizer

    folder = demo_run / "pretrain" / "final"
    model, tokenizer = load_mlm_model(folder), get_tokenizer(folder)
    results = json.loads((demo_run / "demo_results.json").read_text())
    for example in results["fill_mask"]["examples"]:
        single = fill_mask(model, tokenizer, example["text"], top_k=3)[0]
        assert [p["token"] for p in single] == [t for t, _ in example["predictions"]]
        assert [p["score"] for p in single] == pytest.approx([s for _, s in example["predictions"]], abs=2e-3)
