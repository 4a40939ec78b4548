"""`bert-kit demo`: the whole pipeline in under three minutes on two CPU cores, with no download.

1. corpus: 4,000 short biographies of a small made-up world (`bert_kit.data.toy_world`) to
   pretrain on, and 400 biographies of people whose names never occur in training to test on;
2. a WordPiece vocabulary trained on the corpus;
3. pretraining: a 2-layer BERT (width 128, 0.5M parameters), MLM + next-sentence prediction,
   2,000 steps of 64 sequences of 32 tokens, scored on the held-out biographies;
4. fill-mask on held-out sentences: the model's answers beside the masked word, and how often
   its first answer is right beside guessing the most frequent word of the right kind;
5. fine-tuning on what a sentence is about (home, work, pet, free time), scored on sentences
   about held-out people, beside the same model fine-tuned from random weights and beside
   always guessing the most frequent topic (the mean of three fine-tuning seeds for each model;
   the runs of the first are kept);
6. demo_results.json, the run folders (pretrain/, finetune/) with their loss curves, and
   data/ (the corpus, the task, sentences.txt) for trying the other commands.

Run again, it starts over in a folder that holds an earlier demo (finished or interrupted: the
entries below are its own) and refuses a folder that holds anything else.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from statistics import mean
from typing import Any

from bert_kit.checks import ConfigError

SHOWN_PROBES = 6
# fine-tuning seeds per model: 75 steps on 2,000 sentences depend on the new head's random start
# (one seed: 0.89-1.00 from the pretrained model; benchmarks/reports/2026-11-26-demo.md), a mean over three does not
FINETUNE_SEEDS = 3
EXAMPLE_WIDTH = 60  # characters of a printed fill-mask example
# what a demo writes in its folder; data/ is written first, demo_results.json last
DEMO_ENTRIES = {"demo_results.json", "data", "pretrain", "finetune", "finetune_random_init"}
DEMO_DATA = {"train.txt", "test.txt", "train.tsv", "dev.tsv", "sentences.txt"}


def earlier_demo(out: Path) -> bool:
    """Whether `out` holds an earlier demo, finished or interrupted, that this run may replace
    (False: `out` is new or empty). A folder holding anything else is refused, naming it."""
    if not out.is_dir() or not any(out.iterdir()):
        return False

    def foreign(folder: Path, names: set[str], prefix: str = "") -> list[str]:
        return sorted(prefix + p.name for p in folder.iterdir()
                      if p.name not in names and not p.name.startswith(".bert-kit"))  # bert-kit's bookkeeping

    strangers = foreign(out, DEMO_ENTRIES)
    strangers += [name for name in sorted(DEMO_ENTRIES - {"demo_results.json"})
                  if (out / name).exists() and not (out / name).is_dir()]
    if (out / "data").is_dir():
        strangers += foreign(out / "data", DEMO_DATA, "data/")
    ours = (out / "demo_results.json").is_file() or (out / "data" / "train.txt").is_file()
    if strangers or not ours:
        shown = ", ".join(strangers[:5]) + (f" and {len(strangers) - 5} more" if len(strangers) > 5 else "")
        raise ConfigError(f"--output {out} holds files that are not an earlier demo's ({shown or 'no demo data'}): "
                          "choose another folder with --output (the demo replaces only an earlier demo)")
    return True


def tail_words(text: str, width: int = EXAMPLE_WIDTH) -> str:
    """The end of `text` in at most `width` characters, cut before a word: '... lyon is in [MASK].'"""
    if len(text) <= width:
        return text
    words = text.split()
    kept = [words.pop()]
    while words and len(" ".join(["...", words[-1], *kept])) <= width:
        kept.insert(0, words.pop())
    return " ".join(["...", *kept])


def score_fill_mask(folder: Path, probes: list[tuple[str, str, str]], train_file: Path) -> dict[str, Any]:
    """Top-1 accuracy of `folder`'s MLM on the probes, per kind of word, beside guessing the most
    frequent training word of that kind; plus the top 3 answers for the first SHOWN_PROBES.

    All probes go through the model in one padded batch (each has one [MASK]); `bert-kit
    fill-mask` (bert_kit.tasks.fill_mask) gives the same answers one text at a time."""
    import torch

    from bert_kit.data.toy_world import answer_kinds
    from bert_kit.tasks.fill_mask import load_mlm_model
    from bert_kit.tokenizer import get_tokenizer

    model, tokenizer = load_mlm_model(folder), get_tokenizer(folder)
    enc = tokenizer([text for text, _, _ in probes], max_length=model.config.max_length,
                    return_tensors="pt")
    with torch.no_grad():
        logits = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])  # (N, T, V)
    masked = enc["input_ids"] == tokenizer.mask_token_id  # (N, T), one True per row
    scores, ids = logits[masked].float().softmax(dim=-1).topk(3, dim=-1)  # (N, 3)
    counts = Counter(train_file.read_text(encoding="utf-8").replace(".", " ").split())
    guesses = {kind: max(words, key=lambda w: counts[w]) for kind, words in answer_kinds().items()}
    right, guessed, total, shown = Counter(), Counter(), Counter(), []
    # the examples are spread evenly over the probes, chosen before the answers are seen: the first
    # six came from the first two biographies, so one fact the model had not learnt (lyon is in
    # france: a country probe names only the city, and the city's country is what pretraining
    # learns last) made two of six lines and the first one wrong
    examples = {round(i * len(probes) / SHOWN_PROBES) for i in range(SHOWN_PROBES)}
    for i, ((text, answer, kind), top_ids, top_scores) in enumerate(zip(probes, ids.tolist(), scores.tolist())):
        top = tokenizer.convert_ids_to_tokens(top_ids)
        total[kind] += 1
        right[kind] += top[0] == answer
        guessed[kind] += guesses[kind] == answer
        if i in examples:
            shown.append({"text": text, "answer": answer, "kind": kind, "right": top[0] == answer,
                          "predictions": [(t, round(x, 3)) for t, x in zip(top, top_scores)]})
    n = sum(total.values())
    return {"accuracy": sum(right.values()) / n, "guessing": sum(guessed.values()) / n, "probes": n,
            "by_kind": {k: round(right[k] / total[k], 3) for k in total}, "examples": shown}


def demo(output_dir: str | Path = "runs/demo", pretrain_steps: int = 2000, finetune_epochs: float = 3.0,
         seed: int = 0, device: str = "auto") -> dict[str, Any]:
    from bert_kit.data.toy_world import fill_mask_probes, write_corpus, write_topic_task
    from bert_kit.tasks.finetuning import FinetuneConfig, finetune
    from bert_kit.tasks.pretraining import PretrainConfig, pretrain

    t0 = time.time()
    out = Path(output_dir)
    again = earlier_demo(out)  # before anything is written: a folder of the user's is refused
    if again:
        print(f"starting over: replacing the earlier demo in {out}")
        (out / "demo_results.json").unlink(missing_ok=True)  # the new one comes when this demo ends
    data = out / "data"
    train_txt, test_txt = write_corpus(data, seed=seed)
    train_tsv, dev_tsv, majority = write_topic_task(data, seed=seed + 1)
    # texts for `bert-kit predict` and `bert-kit embed`: one held-out sentence per line
    sentences = [line.split("\t")[0] for line in dev_tsv.read_text(encoding="utf-8").splitlines()[1:21]]
    (data / "sentences.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    print(f"corpus: {train_txt} (4,000 biographies), held out: {test_txt} (400 biographies of other people)")

    # Small and fast: no dropout (the model underfits, nothing to regularise), short sequences
    # and a large step. The facts of the world (lyon is in france) come last, after 1,500-2,000
    # steps of 64 sequences; with 1,000 of 96 about half the fill-mask answers were still wrong.
    pre = pretrain(PretrainConfig(
        model={"preset": "bert-tiny", "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
               "attention_probs_dropout_prob": 0.0},
        train_tokenizer={"vocab_size": 2000}, train_files=[str(train_txt)], eval_files=[str(test_txt)],
        corpus_format="text", nsp=True, max_length=32, batch_size=64, max_steps=pretrain_steps, lr=2e-3,
        warmup_fraction=0.1, eval_every=250, eval_batches=20, save_every=pretrain_steps, keep_last=1,
        log_every=25, seed=seed, device=device, output_dir=str(out / "pretrain"), overwrite=again))
    fill = score_fill_mask(out / "pretrain" / "final", fill_mask_probes(test_txt), train_txt)

    def topic_run(model: str, output_dir: Path, run_seed: int, overwrite: bool) -> dict[str, Any]:
        return finetune(FinetuneConfig(
            task="classification", model=model, tokenizer=str(out / "pretrain" / "final"),
            train_file=str(train_tsv), validation_file=str(dev_tsv), label_column="label", max_length=32,
            epochs=finetune_epochs, batch_size=16, lr=1e-3, eval_every=10, save_every=10_000, keep_last=1,
            log_every=5, seed=run_seed, device=device, output_dir=str(output_dir), overwrite=overwrite))

    runs = 2 * FINETUNE_SEEDS

    def topic_runs(model: str, name: str, what: str, first_run: int) -> tuple[dict[str, Any], list[float]]:
        """The run of `seed` into OUT/name (shown), then the other seeds quietly into a temporary
        folder; a line names each run (the task's own line comes only with the shown one)."""
        print(f"fine-tuning {first_run} of {runs}: {what}, seed {seed} (kept in {out / name})", flush=True)
        first = topic_run(model, out / name, seed, again)
        scores = [first["best_value"]]
        for i, extra in enumerate(range(seed + 1, seed + FINETUNE_SEEDS), start=first_run + 1):
            print(f"fine-tuning {i} of {runs}: {what}, seed {extra} ...", end="", flush=True)
            with tempfile.TemporaryDirectory(prefix="bert-kit-demo-") as tmp, \
                    contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                scores.append(topic_run(model, Path(tmp) / name, extra, False)["best_value"])
            print(f" accuracy {scores[-1]:.2f}", flush=True)
        return first, scores

    fin, fin_scores = topic_runs(str(out / "pretrain" / "final"), "finetune", "the pretrained model", 1)
    # the same shape from random weights: what pretraining adds
    scratch, scratch_scores = topic_runs(str(out / "pretrain" / "final" / "config.json"), "finetune_random_init",
                                         "the same shape from random weights", 1 + FINETUNE_SEEDS)
    results = {
        "pretrain": {k: pre.get(k) for k in ("test_mlm_loss", "test_mlm_accuracy", "test_nsp_accuracy",
                                             "test_nsp_loss", "steps", "tokens_per_second")},
        "fill_mask": fill,
        "finetune": {"task": "topic of a sentence about a held-out person (home, work, pet, free time)",
                     "seeds": list(range(seed, seed + FINETUNE_SEEDS)), "accuracy": mean(fin_scores),
                     "accuracy_by_seed": fin_scores, "random_init_accuracy": mean(scratch_scores),
                     "random_init_accuracy_by_seed": scratch_scores, "majority_baseline": majority,
                     "model": fin["best_model"]},
        "plots": [str(p) for p in sorted(out.glob("*/loss_curve.png"))],
        "wall_time_s": round(time.time() - t0, 1),
    }
    (out / "demo_results.json").write_text(json.dumps(results, indent=2) + "\n")
    print_summary(results, out)
    return results


def print_summary(results: dict[str, Any], out: Path) -> None:
    pre, fill, fin = results["pretrain"], results["fill_mask"], results["finetune"]
    print(f"\nbert-kit demo: {results['wall_time_s']:.0f} s")
    print(f"pretraining, scored on held-out biographies: MLM accuracy {pre['test_mlm_accuracy']:.2f}, "
          f"next-sentence accuracy {pre['test_nsp_accuracy']:.2f} (chance 0.50)")
    kinds = ", ".join(f"{k} {v:.2f}" for k, v in fill["by_kind"].items())
    print(f"fill-mask on {fill['probes']} held-out sentences: first answer right {fill['accuracy']:.0%} "
          f"(guessing the most frequent word of the kind: {fill['guessing']:.0%}); {kinds}")
    for example in fill["examples"]:  # spread over the probes, the wrong ones too: each says which it is
        answers = ", ".join(f"{t} {s:.2f}" for t, s in example["predictions"])
        verdict = "right" if example["right"] else \
            f"wrong; {example['kind']} answers are right {fill['by_kind'][example['kind']]:.0%} of the time"
        print(f"  {tail_words(example['text']):>{EXAMPLE_WIDTH}}  -> {answers:<40} (masked: {example['answer']}; "
              f"{verdict})")
    seeds = ", ".join(f"{a:.2f}" for a in fin["accuracy_by_seed"])
    scratch = ", ".join(f"{a:.2f}" for a in fin["random_init_accuracy_by_seed"])
    print(f"fine-tuning, topic of held-out sentences, mean of {len(fin['seeds'])} seeds: accuracy {fin['accuracy']:.2f} "
          f"({seeds}); from random weights {fin['random_init_accuracy']:.2f} ({scratch}); always guessing the "
          f"commonest topic {fin['majority_baseline']:.2f}")
    print(f"results: {out / 'demo_results.json'}; loss curves: {', '.join(results['plots'])}")
    print(f'next: bert-kit fill-mask --model {out}/pretrain "anna lives in paris. paris is a city in [MASK]."')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bert_kit.cli.options import COUNT, POSITIVE, SEED, add_device_option

    parser.add_argument("--output", default="runs/demo",
                        help="output folder (default runs/demo); an earlier demo there is replaced")
    parser.add_argument("--pretrain-steps", type=COUNT, default=2000, help="pretraining steps (default 2000)")
    parser.add_argument("--finetune-epochs", type=POSITIVE, default=3.0, help="fine-tuning epochs (default 3)")
    parser.add_argument("--seed", type=SEED, default=0)
    add_device_option(parser, default="auto")


def run(args: argparse.Namespace) -> int:
    from bert_kit.checks import resolve_device
    from bert_kit.cli.errors import check_output_dir

    check_output_dir(args.output, "--output")
    resolve_device(args.device)  # a device this machine lacks is refused before the corpus is written
    demo(args.output, args.pretrain_steps, args.finetune_epochs, args.seed, args.device)
    return 0
