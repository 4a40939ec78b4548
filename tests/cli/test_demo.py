"""`bert-kit demo` end to end at a reduced size: generated corpus, tokenizer, pretraining,
fill-mask on held-out sentences, fine-tuning beside a random-init run, results and plots.

The full-size demo's figures (docs/demo.md, docs/performance.md) come from `bert-kit demo`
itself; this test checks the pipeline and its bookkeeping, not the figures. The demo runs twice
into one folder, as a second `make demo` does: the second starts over.

Run: .venv/bin/python -m pytest tests/cli/test_demo.py -q
"""

import contextlib
import io
import json

import pytest

from bert_kit.checks import ConfigError
from bert_kit.cli import main
from bert_kit.cli.demo import earlier_demo, tail_words
from bert_kit.training.progress import read_metrics

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),  # steady on a shared 2-core machine
              pytest.mark.xdist_group("demo"), pytest.mark.slow]  # one worker runs the demos, first


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    """A short demo, then the demo of these tests into the same folder; (folder, what the second printed)."""
    out = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--output", str(out), "--pretrain-steps", "4", "--finetune-epochs", "0.1",
                 "--device", "cpu"]) == 0
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["demo", "--output", str(out), "--pretrain-steps", "20", "--finetune-epochs", "0.3",
                     "--device", "cpu"])
    assert code == 0, printed.getvalue()[-2000:]
    return out, printed.getvalue()


@pytest.fixture(scope="module")
def demo_run(demo_runs):
    return demo_runs[0]


def test_demo_results_and_files(demo_run, capsys):
    results = json.loads((demo_run / "demo_results.json").read_text())
    pre, fill, fin = results["pretrain"], results["fill_mask"], results["finetune"]
    assert pre["steps"] == 20 and pre["test_mlm_loss"] < 6.2  # below ln(vocab): something was learnt
    assert 0.0 <= pre["test_nsp_accuracy"] <= 1.0
    assert fill["probes"] == 200 and set(fill["by_kind"]) == {"country", "language", "workplace", "food"}
    assert 0.0 < fill["guessing"] < 0.5 and len(fill["examples"]) == 6
    assert 0.25 < fin["majority_baseline"] < 0.4 and 0.0 <= fin["accuracy"] <= 1.0
    for key in ("accuracy", "random_init_accuracy"):  # the mean of three fine-tuning seeds
        assert fin["seeds"] == [0, 1, 2] and len(fin[f"{key}_by_seed"]) == 3
        assert fin[key] == pytest.approx(sum(fin[f"{key}_by_seed"]) / 3)
    assert not list(demo_run.glob("finetune*seed*"))  # the other seeds' runs leave no folder
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


def test_a_second_demo_starts_over(demo_runs):
    """A second `make demo` dead-ended on `runs/demo/pretrain already holds a run`: it starts over."""
    out, printed = demo_runs
    assert f"starting over: replacing the earlier demo in {out}" in printed
    for run, steps in (("pretrain", 20), ("finetune", None)):
        records = read_metrics(out / run)
        assert [r["type"] for r in records].count("start") == 1  # this run's records only, none resumed
        assert steps is None or max(r["step"] for r in records if r["type"] == "train") == steps


def test_printed_fill_mask_examples_show_whole_words(demo_runs):
    """The examples were the last 60 characters, cut mid-word (`  on is one of the cities of france...`)."""
    out, printed = demo_runs
    examples = json.loads((out / "demo_results.json").read_text())["fill_mask"]["examples"]
    lines = [line for line in printed.splitlines() if "(masked: " in line]
    assert len(lines) == len(examples) == 6
    for line, example in zip(lines, examples):
        shown = line.split("  -> ")[0].strip()
        assert "[MASK]" in shown and len(shown) <= 60
        words, text = shown.removeprefix("... ").split(), example["text"].split()
        assert words == text[len(text) - len(words):]  # whole words: the text's last ones
        assert shown.startswith("... ") or words == text


def test_tail_words_cuts_before_a_word():
    text = "lena comes from tokyo. she speaks japanese at home. tokyo is one of the cities of [MASK]."
    assert text[-60:].startswith("eaks japanese")  # what the demo printed: a word cut in two
    assert tail_words(text, 60) == "... japanese at home. tokyo is one of the cities of [MASK]."
    assert tail_words("short text [MASK].", 60) == "short text [MASK]."
    assert tail_words("a " + "x" * 70, 60) == "... " + "x" * 70  # one long word is shown whole


def test_earlier_demo_is_recognised_and_other_folders_refused(tmp_path):
    assert earlier_demo(tmp_path / "new") is False and earlier_demo(tmp_path) is False  # nothing to replace
    interrupted = tmp_path / "interrupted"  # stopped during pretraining: data/ and part of pretrain/
    (interrupted / "data").mkdir(parents=True)
    (interrupted / "data" / "train.txt").write_text("anna lives in lyon.\n")
    (interrupted / "pretrain" / "checkpoints").mkdir(parents=True)
    assert earlier_demo(interrupted) is True
    (interrupted / "data" / "mine.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match=r"holds files that are not an earlier demo's \(data/mine.csv\).*--output"):
        earlier_demo(interrupted)
    theirs = tmp_path / "theirs"
    (theirs / "pretrain").mkdir(parents=True)  # a run of the user's that happens to be called pretrain
    with pytest.raises(ConfigError, match="no demo data"):
        earlier_demo(theirs)


def test_demo_refuses_a_folder_of_the_users(tmp_path, capsys):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    assert main(["demo", "--output", str(folder), "--pretrain-steps", "2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "notes.txt" in err[0] and "--output" in err[0]
    assert [p.name for p in folder.iterdir()] == ["notes.txt"] and (folder / "notes.txt").read_text() == "mine\n"


def test_the_examples_are_spread_over_the_probes_and_each_says_if_it_is_right(demo_runs):
    """The first six probes came from two biographies, and the first of them (lyon is in france, a
    fact pretraining learns last) was printed wrong without a word, above a 94% accuracy."""
    from bert_kit.data.toy_world import fill_mask_probes

    out, printed = demo_runs
    fill = json.loads((out / "demo_results.json").read_text())["fill_mask"]
    probes = fill_mask_probes(out / "data" / "test.txt")
    assert [e["text"] for e in fill["examples"]] == [probes[i][0] for i in (0, 33, 67, 100, 133, 167)]
    lines = [line for line in printed.splitlines() if "(masked: " in line]
    for line, example in zip(lines, fill["examples"]):
        right = example["predictions"][0][0] == example["answer"]
        assert example["right"] == right
        verdict = "right)" if right else \
            f"wrong; {example['kind']} answers are right {fill['by_kind'][example['kind']]:.0%} of the time)"
        assert line.endswith(f"(masked: {example['answer']}; {verdict}"), line


def test_each_fine_tuning_run_is_named(demo_runs):
    """Six fine-tuning runs printed "task classification: ..." twice, the same line."""
    out, printed = demo_runs
    named = [line for line in printed.splitlines() if line.startswith("fine-tuning ") and " of 6: " in line]
    assert [line.split(":")[0] for line in named] == [f"fine-tuning {i} of 6" for i in range(1, 7)]
    assert named[0] == f"fine-tuning 1 of 6: the pretrained model, seed 0 (kept in {out / 'finetune'})"
    assert named[3] == f"fine-tuning 4 of 6: the same shape from random weights, seed 0 (kept in " \
                       f"{out / 'finetune_random_init'})"
    assert all(" accuracy " in named[i] for i in (1, 2, 4, 5))
