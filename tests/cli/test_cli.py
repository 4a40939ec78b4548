"""The command line itself: options and key=value overrides in any order, --version, the model
list, and --device on every command that runs a model.

Run: .venv/bin/python -m pytest tests/cli/test_cli.py -q
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bert_kit.cli import COMMANDS, build_parser, main, parse_arguments


def parse(argv):
    command = argv[0]
    return parse_arguments(build_parser(only=command), argv)


def test_overrides_and_options_in_any_order(tmp_path):
    from bert_kit.cli.finetune import load_run_config

    config = tmp_path / "run.yaml"
    config.write_text(f"task: classification\nmodel: bert-tiny\ntrain_file: {__file__}\n")
    args = parse(["finetune", "lr=1e-4", "--config", str(config), "--output", "r.json", "epochs=1",
                  "--task", "classification", "batch_size=8"])
    assert args.overrides == ["lr=1e-4", "epochs=1", "batch_size=8"] and args.output == "r.json"
    cfg = load_run_config(args)
    assert (cfg.lr, cfg.epochs, cfg.batch_size) == (1e-4, 1.0, 8)
    args = parse(["pretrain", "--config", str(config), "--resume", "latest", "max_steps=3", "--output", "o.json",
                  "lr=1e-3"])
    assert args.overrides == ["max_steps=3", "lr=1e-3"] and args.resume == "latest"
    # positionals of other commands too: fill-mask texts around options
    args = parse(["fill-mask", "a [MASK] b", "--model", "m", "c [MASK]", "--top-k", "3"])
    assert args.text == ["a [MASK] b", "c [MASK]"] and args.top_k == 3
    # nested subcommands parse as before
    args = parse(["tokenizer", "train", "--files", "a.txt", "--output", "tok", "--vocab-size", "100"])
    assert (args.command, args.tokenizer_command, args.files) == ("tokenizer", "train", ["a.txt"])
    # a misspelt option is still refused, naming the command
    with pytest.raises(SystemExit):
        parse(["finetune", "--config", str(config), "--ouput", "r.json"])


def test_version(capsys):
    assert main(["--version"]) == 0  # main returns argparse's exit code, as for --help
    out = capsys.readouterr().out
    assert out.startswith("bert-kit 0.1.0 (torch ") and "Python 3." in out
    # --version and --help need no command module, so they start without importing torch
    code = "import sys\nfrom bert_kit.cli import main\nmain(['--version'])\nprint('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines() == [out.strip(), "False"]


def test_bad_settings_missing_inputs_and_help_are_answered_before_torch_is_imported(tmp_path):
    """The training commands check their settings (FinetuneConfig, PretrainConfig: no torch), the
    inference commands their input files and `serve` its settings (ServeConfig) before they import
    what runs models: a mistyped key, a missing file, a bad port or --help is answered in a
    fraction of a second."""
    root = Path(__file__).resolve().parents[2]
    finetune, pretrain = root / "configs" / "finetune_sst2.yaml", root / "configs" / "pretrain_tiny.yaml"
    missing = str(tmp_path / "nothere.tsv")
    calls = [["finetune", "--config", str(finetune), "batchsize=8"],
             ["pretrain", "--config", str(pretrain), "max_stpes=10"],
             ["evaluate", "--model", str(tmp_path), "--data", missing],
             ["predict", "--model", str(tmp_path), "--input", missing, "--output", "out.jsonl"],
             ["serve", "--model", str(tmp_path), "--port", "70000"]]
    calls += [[command, "--help"] for command in ("finetune", "pretrain", "evaluate", "predict", "embed", "attention",
                                                  "serve", "fill-mask", "export")]
    code = (f"import sys\nfrom bert_kit.cli import main\nprint([main(argv) for argv in {calls!r}], "
            "'torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert run.stdout.splitlines()[-1] == "[2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0] False", run.stdout + run.stderr
    for line in ["bert-kit finetune: error: override 'batchsize=8': unknown key 'batchsize' (did you mean batch_size?)",
                 "bert-kit pretrain: error: override 'max_stpes=10': unknown key 'max_stpes' (did you mean max_steps?)",
                 f"bert-kit evaluate: error: input file not found: {missing} (--data)",
                 f"bert-kit predict: error: input file not found: {missing} (--input)",
                 "bert-kit serve: error: port=70000 is out of range: expected an integer in [0, 65535] (0 picks a "
                 "free port)"]:
        assert line in run.stderr, run.stderr


def test_models_lists_presets_and_local_copies(tmp_path, monkeypatch, capsys):
    snap = tmp_path / "hub" / "models--org--tiny-bert" / "snapshots" / "r1"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "bert-tiny" in out and "2 layers, hidden  128" in out and "org/tiny-bert" in out and str(snap) in out
    assert "(also bert-base, bert-base-uncased)" in out and "109.5M parameters" in out  # BERT-base: 109,482,240
    assert main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {"name": "org/tiny-bert", "folder": str(snap), "family": "bert"} in listed["local_copies"]
    assert [p["name"] for p in listed["presets"]][:2] == ["bert-tiny", "bert-mini"]


def test_every_command_that_runs_a_model_takes_device():
    runs_a_model = {"evaluate", "predict", "embed", "mine-negatives", "fill-mask", "attention", "demo"}
    parser = build_parser()
    for name in runs_a_model:
        assert name in COMMANDS
        options = {o for action in parser.command_parsers[name]._actions for o in action.option_strings}
        assert "--device" in options, name


def command_line(*argv: str, before: str = "") -> subprocess.CompletedProcess:
    """`bert-kit ARGV` as the process's own command line (main() without arguments), with
    `before` run first; the script goes on only if main() returns."""
    script = (f"import atexit, sys, threading, time\n{before}\n"
              "atexit.register(lambda: print('atexit handler ran', flush=True))\n"
              f"sys.argv = ['bert-kit', *{list(argv)!r}]\n"
              "from bert_kit.cli import main\ncode = main()\n"
              "print('main returned', code, flush=True)\nsys.exit(code)\n")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)


def test_a_command_line_ends_the_process_with_its_status_and_its_exit_handlers():
    done = command_line("models")
    assert done.returncode == 0 and "bert-tiny" in done.stdout, done.stderr
    assert done.stdout.rstrip().endswith("atexit handler ran") and "main returned" not in done.stdout
    wrong = command_line("no-such-command")
    assert wrong.returncode == 2 and "unknown command" in wrong.stderr
    assert "atexit handler ran" in wrong.stdout and "main returned" not in wrong.stdout


@pytest.mark.parametrize("before", [
    "threading.Thread(target=time.sleep, args=(1.0,)).start()",  # a thread still at work: it finishes
    "sys.setprofile(lambda *a: None)",  # a profiler writes its results at a normal exit
])
def test_main_returns_for_a_normal_exit_when_one_is_needed(before):
    done = command_line("models", before=before)
    assert done.returncode == 0 and "main returned 0" in done.stdout, done.stderr
    assert done.stdout.count("atexit handler ran") == 1


def test_a_profiled_command_writes_its_profile(tmp_path):
    """cProfile writes its file at a normal exit (from Python 3.12 it watches through sys.monitoring,
    which sys.getprofile() does not show)."""
    stats = tmp_path / "models.prof"
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(stats), "-m", "bert_kit", "models"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "bert-tiny" in done.stdout, done.stderr
    assert stats.stat().st_size > 0


def test_pooling_choices_of_the_commands_are_the_librarys():
    """`embed` and `evaluate` list their --pooling choices without importing torch: they must stay
    the ones `bert_kit.embeddings` accepts."""
    from bert_kit.embeddings import POOLING_MODES

    parser = build_parser()
    for name in ("embed", "evaluate", "mine-negatives"):
        pooling = next(a for a in parser.command_parsers[name]._actions if "--pooling" in a.option_strings)
        assert tuple(pooling.choices) == POOLING_MODES, name


def test_precision_choices_of_the_encoding_commands_are_the_librarys():
    from bert_kit.embeddings import PRECISIONS

    parser = build_parser()
    for name in ("embed", "evaluate", "mine-negatives"):
        precision = next(a for a in parser.command_parsers[name]._actions if "--precision" in a.option_strings)
        assert tuple(precision.choices) == PRECISIONS, name


def test_export_settings_of_the_command_are_the_librarys():
    """`export` writes its defaults and choices as literals to keep torch out of --help."""
    from bert_kit import onnx_export
    from bert_kit.cli import export

    assert (export.OPSET, export.MIN_OPSET, export.QUANTIZE_CHOICES) == (
        onnx_export.OPSET, onnx_export.MIN_OPSET, onnx_export.QUANTIZE_CHOICES)
