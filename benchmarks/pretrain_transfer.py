"""Does pretraining with bert-kit pay off downstream? A budgeted run, then fine-tuning, beside a control.

In one GPU session:
1. `bert-kit tokenizer train` on a sample of the corpus (a one-off step, timed apart);
2. `bert-kit pretrain --config configs/pretrain_cram.yaml` (time_budget, default 6 minutes of wall
   time, start-up and compilation included);
3. held-out MLM loss of final/ on the corpus's held-out parts and on WikiText-2 test (the same
   masking rate as training, fixed seed);
4. final/ loads in `transformers.BertModel` with the same hidden states (max abs difference);
5. `bert-kit finetune` with the shipped configs (SST-2, STS-B cross-encoder, CoNLL-2003) on the
   pretrained model and, as the control, on the same architecture from random initialisation
   (`model=<the recipe's preset> tokenizer=<the run's tokenizer>`), each as its own process.
One table at the end: pretrained vs control, with the time of every step.

`--tasks glue` (alone or beside the others) scores both models with `bert-kit glue` on every GLUE task
under `--glue-data` (the official files, one process per GPU of `--glue-gpus`) and prints the GLUE
table: pretrained, control and BERT-Small's published test figures (Turc et al. 2019). `--nproc 4`
pretrains through torchrun on 4 GPUs, with the same time budget:

    python benchmarks/pretrain_transfer.py ... --tasks glue --glue-gpus 0,1,2,3 --nproc 4

    python benchmarks/pretrain_transfer.py --corpus ../shared/corpus --data-dir ../shared/data
    python benchmarks/pretrain_transfer.py ... --only control      # the control runs alone
    python benchmarks/pretrain_transfer.py ... --only pretrain     # then --only finetune (and control beside it)
    python benchmarks/pretrain_transfer.py ... --only report       # the table of what the work folder holds

Recipe comparisons: `--variants` runs each variant (the recipe plus `key=value` settings) and the
control as processes of their own, one GPU each (`--gpus`), at the same time (more jobs than GPUs
wait for a free one; `--no-control` leaves the control out), then prints one table:

    python benchmarks/pretrain_transfer.py ... --work runs/compare --gpus 0,1,2,3 \
        --variants "recipe:" "medium:model=bert-medium" "no-segments:segment_pairs=false"
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RECIPE = yaml.safe_load((ROOT / "configs" / "pretrain_cram.yaml").read_text())

TASKS = {  # task -> (config, train, validation, test or None: the best model is evaluated on it)
    "sst2": ("finetune_sst2.yaml", "sst2/train.tsv", "sst2/dev.tsv", None),
    "stsb": ("finetune_stsb.yaml", "stsb/sts-train.csv", "stsb/sts-dev.csv", None),
    "conll": ("finetune_conll.yaml", "conll2003/train.txt", "conll2003/valid.txt", "conll2003/test.txt"),
}


def command(cmd: list[str], log: Path) -> float:
    """Run a command as its own process; its wall time. A failure stops the benchmark with its log."""
    t0 = time.time()
    with open(log, "w") as f:
        code = subprocess.run([str(c) for c in cmd], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({code}):\n{log.read_text()[-3000:]}")
    return time.time() - t0


def train_tokenizer(corpus: Path, folder: Path, log: Path) -> float:
    """`bert-kit tokenizer train` (32k WordPiece) on 4 of the corpus's shards; its wall time."""
    sample = [corpus / "wiki" / f"part-00{i}.jsonl.xz" for i in (0, 1)] + \
             [corpus / "gutenberg" / f"part-00{i}.jsonl.xz" for i in (0, 1)]
    return command([sys.executable, "-m", "bert_kit", "tokenizer", "train", "--files", *sample,
                    "--format", "jsonl", "--vocab-size", "32768", "--output", folder], log)


def heldout_mlm(folder: Path, files: list[Path], mode: str, mask_probability: float, cache: Path) -> dict:
    """MLM loss / accuracy of `folder` on `files` (documents packed into 128-token blocks)."""
    import torch

    from bert_kit.data.token_cache import tokenize_to_cache
    from bert_kit.data.masking import DataCollatorForMLM
    from bert_kit.data.pretraining import PackedDataset
    from bert_kit.heads import BERTForMaskedLM
    from bert_kit.tokenizer import get_tokenizer
    from bert_kit.training.losses import compute_mlm_loader_loss

    tokenizer = get_tokenizer(folder)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = BERTForMaskedLM.from_pretrained(folder).to(device)
    data = PackedDataset(tokenize_to_cache(files, tokenizer, cache, mode, progress=False), 128, tokenizer=tokenizer)
    collator = DataCollatorForMLM(tokenizer, mask_probability, seed=1234)
    loader = torch.utils.data.DataLoader(data, batch_size=128, collate_fn=collator)
    return compute_mlm_loader_loss(model, loader, device, autocast_dtype=torch.bfloat16 if device == "cuda" else None)


def transformers_parity(folder: Path) -> dict:
    """Max abs difference of the last hidden states, bert-kit vs transformers.BertModel (eager attention),
    in fp32 and in fp64: fp64 leaves only differences of the computation, not of its rounding."""
    import torch
    import transformers

    from bert_kit import BERTModel, get_tokenizer

    tokenizer = get_tokenizer(folder)
    batch = tokenizer(["The cat sat on the mat.", "A longer first sentence, to give the batch some padding."],
                      ["It was warm.", "And a second one, of the pair (token type 1)."], return_tensors="pt")
    mask = batch["attention_mask"].bool()
    diffs = {}
    for name, dtype in (("fp32", torch.float32), ("fp64", torch.float64)):
        ours = BERTModel.from_pretrained(folder).to(dtype).eval()
        theirs = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").to(dtype).eval()
        with torch.no_grad():
            a = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            b = theirs(**batch).last_hidden_state
        diffs[name] = float((a[mask] - b[mask]).abs().max())
    diffs["largest_hidden_value"] = float(b[mask].abs().max())
    return diffs


# BERT-Small (4 layers, 512 wide), GLUE test set (Turc et al. 2019, the BERT miniatures release):
# pretrained far longer than 6 minutes; the target of the recipe on the dev sets
BERT_SMALL = {"cola": [27.8], "sst2": [89.7], "mrpc": [83.4, 76.2], "stsb": [78.8, 77.0], "rte": [61.8],
              "wnli": [62.3], "qnli": [86.4], "qqp": [68.1, 87.0], "mnli": [77.6, 77.0]}


def glue(model: list[str], args: argparse.Namespace, tag: str) -> dict:
    """`bert-kit glue` on every task under --glue-data; glue_results.json's scores and per-task figures."""
    out = args.work / f"{tag}-glue"
    wall = command([sys.executable, "-m", "bert_kit", "glue", "--model", model[0].removeprefix("model="), "--data", args.glue_data,
                    "--output-dir", out, *(["--gpus", args.glue_gpus] if args.glue_gpus else []), *model[1:],
                    *args.finetune_set], args.work / f"{tag}-glue.log")
    results = json.loads((out / "glue_results.json").read_text())
    return {"wall_s": round(wall, 1), "score": results["score"], "score_without_wnli": results["score_without_wnli"],
            "tasks": {name: {"metrics": s["metrics"], "score": s["score"]} for name, s in results["tasks"].items()}}


def glue_table(report: dict) -> str:
    """Markdown: each task's dev figures, pretrained and control, beside BERT-Small's test figures."""
    from bert_kit.tasks.glue import TASKS as GLUE

    a, b = report.get("pretrained", {}).get("glue", {}), report.get("control", {}).get("glue", {})
    lines = ["| task | metric | pretrained (dev) | control (dev) | BERT-Small (test) |", "|---|---|---|---|---|"]
    for name, task in GLUE.items():
        if name not in a.get("tasks", {}) and name not in b.get("tasks", {}):
            continue
        cells = ["/".join(f"{r['tasks'][name]['metrics'][k]:.1f}" for k in task.metric_keys)
                 if name in r.get("tasks", {}) else "-" for r in (a, b)]
        lines.append(f"| {task.title} | {task.shown} | {cells[0]} | {cells[1]} | "
                     f"{'/'.join(f'{v:.1f}' for v in BERT_SMALL[name])} |")
    for key, label in (("score", "GLUE score"), ("score_without_wnli", "without WNLI")):
        cells = [f"{r[key]:.1f}" if r.get(key) is not None else "-" for r in (a, b)]
        lines.append(f"| {label} | | {cells[0]} | {cells[1]} | {'71.2' if key == 'score' else '-'} |")
    return "\n".join(lines)


def finetune(task: str, model: list[str], args: argparse.Namespace, tag: str) -> dict:
    if task == "glue":
        return glue(model, args, tag)
    config, train, dev, test = TASKS[task]
    out = args.work / f"{tag}-{task}"
    wall = command([sys.executable, "-m", "bert_kit", "finetune", "--config", ROOT / "configs" / config, *model,
                    f"train_file={args.data_dir / train}", f"validation_file={args.data_dir / dev}",
                    f"output_dir={out}", "overwrite=true", *args.finetune_set, "--output",
                    args.work / f"{tag}-{task}.json"],
                   args.work / f"{tag}-{task}.log")
    results = json.loads((args.work / f"{tag}-{task}.json").read_text())
    row = {"metric": results["metric"], "best": results["best_value"], "wall_s": round(wall, 1),
           "skipped_steps": results.get("skipped_steps"), "steps": results.get("steps")}
    if test:  # the selected model (best/ on the validation metric) on the test split
        metrics = args.work / f"{tag}-{task}-test.json"
        command([sys.executable, "-m", "bert_kit", "evaluate", "--model", out / "best", "--data",
                 args.data_dir / test, "--output", metrics], args.work / f"{tag}-{task}-test.log")
        row["test"] = json.loads(metrics.read_text())[results["metric"]]
    return row


ROWS = [  # (label, how to read it from a transfer.json)
    ("pretraining wall s", lambda r: r["pretrain_wall_s"]),
    ("steps", lambda r: r["pretrain"]["steps"]),
    ("tokens/s", lambda r: round(r["pretrain"]["tokens_per_second"])),
    ("held-out MLM loss", lambda r: round(r["heldout_corpus"]["mlm_loss"], 3)),
    ("WikiText-2 MLM loss", lambda r: round(r["wikitext2_test"]["mlm_loss"], 3)),
    ("transformers diff fp32", lambda r: f"{r['transformers_max_abs_diff']['fp32']:.1e}"),
    ("transformers diff fp64", lambda r: f"{r['transformers_max_abs_diff']['fp64']:.1e}"),
    ("SST-2 dev acc", lambda r: round(100 * r["sst2"]["best"], 2)),
    ("STS-B dev Spearman", lambda r: round(100 * r["stsb"]["best"], 2)),
    ("CoNLL valid F1", lambda r: round(100 * r["conll"]["best"], 2)),
    ("CoNLL test F1", lambda r: round(100 * r["conll"]["test"], 2)),
]


def compare(args: argparse.Namespace) -> None:
    """Every variant (pretraining + fine-tuning) and the control, one process per GPU at a time."""
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = args.work / "tokenizer"
    if not (tokenizer / "vocab.txt").exists():  # trained once, shared by every variant
        train_tokenizer(args.corpus, tokenizer, args.work / "tokenizer.log")
    jobs = [("control", ["--only", "control"])] if args.control else []
    for spec in args.variants:
        name, _, settings = spec.partition(":")
        jobs.append((name, ["--only", "pretrained", *(["--set", *settings.split()] if settings.split() else [])]))
    free, running = list(args.gpus.split(",")), []
    queue = list(jobs)
    while queue or running:
        while queue and free:
            name, extra = queue.pop(0)
            work, gpu = args.work / name, free.pop(0)
            work.mkdir(exist_ok=True)
            if not (work / "tokenizer").exists():
                shutil.copytree(tokenizer, work / "tokenizer")
            cmd = [sys.executable, __file__, "--corpus", args.corpus, "--data-dir", args.data_dir, "--work", work,
                   "--budget", args.budget, "--tasks", args.tasks, "--glue-data", args.glue_data, *extra,
                   *(["--finetune-set", *args.finetune_set] if args.finetune_set else [])]
            log = open(args.work / f"{name}.log", "w")
            proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu})
            running.append((name, gpu, proc, log))
            print(f"{name}: GPU {gpu}", flush=True)
        time.sleep(5)
        for job in [j for j in running if j[2].poll() is not None]:
            running.remove(job)
            free.append(job[1])
            job[3].close()
            print(f"{job[0]}: exit {job[2].returncode}", flush=True)
    reports = {}
    for name, _ in jobs:
        path = args.work / name / "transfer.json"
        if not path.exists():  # the job failed before its first result: its column shows "-"
            print(f"{name}: no {path} (see {args.work / name}.log)", flush=True)
        report = json.loads(path.read_text()) if path.exists() else {}
        reports[name] = {**report, **report.get("pretrained", {}), **report.get("control", {})}
    (args.work / "compare.json").write_text(json.dumps(reports, indent=2) + "\n")
    names = [n for n, _ in jobs if n != "control"] + (["control"] if args.control else [])
    print(f"\n{'':<24}" + "".join(f"{n:>16}" for n in names))
    for label, read in ROWS:
        cells = []
        for n in names:
            try:
                cells.append(str(read(reports[n])))
            except (KeyError, TypeError):
                cells.append("-")
        print(f"{label:<24}" + "".join(f"{c:>16}" for c in cells))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, required=True, help="the shared corpus folder (wiki/, gutenberg/, heldout/)")
    p.add_argument("--data-dir", type=Path, required=True, help="sst2/, stsb/, conll2003/, wikitext-2/")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "transfer")
    p.add_argument("--budget", default="6m")
    p.add_argument("--tasks", default="sst2,stsb,conll")
    p.add_argument("--only", choices=("all", "pretrain", "finetune", "pretrained", "control", "report"),
                   default="all", help="pretrain: steps 1-4; finetune: step 5 on an earlier pretrain; pretrained: "
                                       "both; control: the control's fine-tuning; report: print the table")
    p.add_argument("--variants", nargs="*", default=None,
                   help='NAME:key=value ... per variant of the recipe ("recipe:" is the recipe itself)')
    p.add_argument("--gpus", default="0", help="GPUs for --variants, comma-separated: one process each")
    p.add_argument("--no-control", dest="control", action="store_false",
                   help="--variants: leave the control out (a GPU more for the variants)")
    p.add_argument("--control-model", default=RECIPE["model"]["preset"],
                   help="the control's shape, from random weights (default: the recipe's)")
    p.add_argument("--set", nargs="*", default=[], help="extra key=value settings for the pretraining run")
    p.add_argument("--finetune-set", nargs="*", action="extend", default=[],
                   help="extra key=value settings for every fine-tuning run (--tasks glue: `bert-kit glue` options; "
                        "repeat it for several: --finetune-set=--lrs=1e-4,5e-5 --finetune-set=--seeds=1,2,3)")
    p.add_argument("--glue-data", type=Path, default=None, help="--tasks glue: the GLUE folder (default DATA_DIR/glue)")
    p.add_argument("--glue-gpus", default=None, help="--tasks glue: GPUs for `bert-kit glue --gpus` (default: all)")
    p.add_argument("--nproc", type=int, default=1, help="pretrain on this many GPUs through torchrun")
    args = p.parse_args()
    args.glue_data = args.glue_data or args.data_dir / "glue"
    if args.variants:
        return compare(args)
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer, run = args.work / "tokenizer", args.work / "pretrain"
    report_file = args.work / "transfer.json"  # written after every step; a later --only adds to it
    report: dict = json.loads(report_file.read_text()) if report_file.exists() else {}
    report["budget"] = args.budget

    def reread() -> None:  # --only finetune and --only control may run side by side on one folder
        if report_file.exists():
            report.update(json.loads(report_file.read_text()))

    def record(key: str, value: object) -> None:
        reread()
        report[key] = value
        report_file.write_text(json.dumps(report, indent=2) + "\n")

    if args.only != "report" and not (tokenizer / "vocab.txt").exists():
        record("tokenizer_s", round(train_tokenizer(args.corpus, tokenizer, args.work / "tokenizer.log"), 1))
    final = run / "final"
    if args.only in ("all", "pretrain", "pretrained"):
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
                    "-m", "bert_kit"] if args.nproc > 1 else [sys.executable, "-m", "bert_kit"]
        record("pretrain_wall_s", round(command(
            [*launcher, "pretrain", "--config", ROOT / "configs" / "pretrain_cram.yaml",
             f"tokenizer={tokenizer}", f"train_files=[{args.corpus / 'wiki'}, {args.corpus / 'gutenberg'}]",
             f"eval_files=[{args.corpus / 'heldout'}]", f"time_budget={args.budget}", f"output_dir={run}",
             "overwrite=true", *args.set, "--output", args.work / "pretrain.json"], args.work / "pretrain.log"), 1))
        pre = json.loads((args.work / "pretrain.json").read_text())
        record("pretrain", {k: pre.get(k) for k in ("steps", "train_tokens", "tokens_per_second", "train_mlm_loss",
                                                     "test_mlm_loss", "test_mlm_accuracy", "wall_time_s")})
        mask = RECIPE["mask_probability"]
        cache = args.work / "eval_cache"
        record("heldout_corpus", heldout_mlm(final, [args.corpus / "heldout"], "jsonl", mask, cache))
        record("wikitext2_test", heldout_mlm(final, [args.data_dir / "wikitext-2" / "test.txt"], "wikitext", mask,
                                             cache))
        record("transformers_max_abs_diff", transformers_parity(final))
    if args.only in ("all", "finetune", "pretrained"):
        for t in args.tasks.split(","):
            record("pretrained", {**report.get("pretrained", {}), t: finetune(t, [f"model={final}"], args, "pretrained")})
    if args.only in ("all", "control"):
        for t in args.tasks.split(","):
            record("control", {**report.get("control", {}),
                               t: finetune(t, [f"model={args.control_model}", f"tokenizer={tokenizer}"], args, "control")})
    reread()  # with what a process beside this one recorded
    print(json.dumps(report, indent=2))
    if "glue" in args.tasks.split(","):
        print("\n" + glue_table(report))
    print(f"\n{'task':<7} {'metric':<14} {'pretrained':>10} {'control':>8}")
    for t in [t for t in args.tasks.split(",") if t != "glue"]:
        a, b = report.get("pretrained", {}).get(t, {}), report.get("control", {}).get(t, {})
        for split in ("best", "test"):
            if split in a or split in b:
                name = f"{(a or b).get('metric', '')} ({'dev' if split == 'best' else 'test'})"
                print(f"{t:<7} {name:<14} {a.get(split, float('nan')):>10.4f} {b.get(split, float('nan')):>8.4f}")


if __name__ == "__main__":
    main()
