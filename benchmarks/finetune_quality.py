"""Fine-tuning quality: bert-kit beside a plain HF `transformers` loop, same checkpoint and settings.

For each task the bert-kit side is `bert_kit.tasks.finetuning.finetune` on configs/finetune_<task>.yaml
(what `bert-kit finetune --config ...` runs). The HF side is the loop a `transformers` user would
write: `AutoModelFor<Task>.from_pretrained(folder)`, the model's own loss, AdamW (fused) with no
decay on biases and LayerNorm weights, `get_linear_schedule_with_warmup`, gradient clipping, bf16
autocast, batches shuffled and padded to the longest in the batch. Both sides read the same
examples (bert-kit's readers; the tokenizer is identical to BertTokenizerFast, see the tests),
use the same hyper-parameters from the YAML file, evaluate at the same steps and keep the best
validation score; both are scored by the same bert-kit metric code (entity F1 equal to seqeval,
SQuAD v1.1 official normalisation), and where a test split exists the best model is scored on it.

    python benchmarks/finetune_quality.py --model MINILM --data-dir ../shared/data --tasks sst2,conll
    python benchmarks/finetune_quality.py --model MINILM --data-dir DATA --tasks stsb-bi --impl bertkit \\
        --set lr=5e-5

Tasks: sst2 (dev accuracy), conll (valid F1 picks, test F1 reported), squad (first 38 articles of
dev-v1.1 train, the other 10 score), stsb (cross-encoder), stsb-bi (bi-encoder, the loss its config names).
One JSON line per (task, implementation) goes to --out as soon as it finishes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bert_kit.embeddings import mean_pool  # noqa: E402
from bert_kit.tasks.finetuning import FinetuneConfig, finetune, resolve_lr  # noqa: E402
from bert_kit.training.precision import resolve_precision  # noqa: E402
from bert_kit.training.runconfig import load_config  # noqa: E402
from bert_kit.model_folder import read_model_metadata  # noqa: E402
from bert_kit.tasks import make_task  # noqa: E402
from bert_kit.tokenizer import get_tokenizer  # noqa: E402
from bert_kit.training.losses import compute_cosent_loss  # noqa: E402

# task -> (config file, data files relative to --data-dir, test file or None)
TASKS = {
    "sst2": ("finetune_sst2.yaml", {"train_file": "sst2/train.tsv", "validation_file": "sst2/dev.tsv"}, None),
    "conll": ("finetune_conll.yaml", {"train_file": "conll2003/train.txt", "validation_file": "conll2003/valid.txt"},
              "conll2003/test.txt"),
    "squad": ("finetune_squad.yaml", {"train_file": "squad-v1.1/dev-v1.1.json"}, None),
    "stsb": ("finetune_stsb.yaml", {"train_file": "stsb/sts-train.csv", "validation_file": "stsb/sts-dev.csv"},
             "stsb/sts-test.csv"),
    "stsb-bi": ("finetune_stsb_biencoder.yaml",
                {"train_file": "stsb/sts-train.csv", "validation_file": "stsb/sts-dev.csv"}, "stsb/sts-test.csv"),
}


def run_config(task: str, args: argparse.Namespace, output_dir: Path, extra: list[str]) -> FinetuneConfig:
    config_file, files, _ = TASKS[task]
    overrides = [f"model={args.model}", f"output_dir={output_dir}", "tensorboard=false"]
    overrides += [f"{k}={args.data_dir / v}" for k, v in files.items()] + list(args.set) + extra
    return load_config(FinetuneConfig, ROOT / "configs" / config_file, overrides)


def score_test(cfg: FinetuneConfig, model: torch.nn.Module, tokenizer, meta: dict, test_file: Path,
               precision) -> dict:
    """The task's metrics of `model` on the test file (a fresh task bound to the saved labels)."""
    task = make_task(cfg.task, cfg)
    task.bind(tokenizer)
    task.load_metadata(meta)
    items = task.read_eval(test_file)
    return task.evaluate(model, items, precision)


# ---- bert-kit ------------------------------------------------------------------------------------

def run_bertkit(cfg: FinetuneConfig, test_file: Path | None) -> dict:
    t0 = time.time()
    results = finetune(cfg)
    row = {"best_dev": results["best_value"], "best_step": results["best_step"],
           "final_dev": (results["final_metrics"] or {}).get(results["metric"]),
           "history": results["history"], "examples_per_s": results["examples_per_second"]}
    if test_file is not None:
        folder, precision = Path(results["best_model"]), resolve_precision(cfg.precision, cfg.device, verbose=False)
        meta = read_model_metadata(folder)
        task = make_task(cfg.task, cfg)
        task.load_metadata(meta)
        model = task.load(folder).to(precision.device)
        row["test"] = score_test(cfg, model, get_tokenizer(folder), meta, test_file, precision)
    row["wall_s"] = time.time() - t0
    return row


# ---- HF transformers -----------------------------------------------------------------------------

class HFAdapter(torch.nn.Module):
    """Calls an HF model the way bert-kit's task code calls its own (so both share the metrics)."""

    def __init__(self, hf: torch.nn.Module, kind: str):
        super().__init__()
        self.hf, self.kind, self.config = hf, kind, hf.config

    def forward(self, input_ids, attention_mask, token_type_ids=None, unpadded: bool = False):
        out = self.hf(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        if self.kind == "qa":
            return out.start_logits, out.end_logits
        return out.last_hidden_state if self.kind == "encoder" else out.logits


def build_hf(task, cfg: FinetuneConfig) -> HFAdapter:
    import transformers as tf

    common = {"attn_implementation": "sdpa", "dtype": torch.float32}  # fp32 master weights, as bert-kit
    if cfg.task == "classification" or (cfg.task == "similarity" and cfg.similarity.mode == "cross-encoder"):
        n = 1 if cfg.task == "similarity" else task.num_labels
        hf = tf.AutoModelForSequenceClassification.from_pretrained(cfg.model, num_labels=n, **common)
        return HFAdapter(hf, "logits")
    if cfg.task == "token-classification":
        hf = tf.AutoModelForTokenClassification.from_pretrained(cfg.model, num_labels=len(task.label_names), **common)
        return HFAdapter(hf, "logits")
    if cfg.task == "qa":
        return HFAdapter(tf.AutoModelForQuestionAnswering.from_pretrained(cfg.model, **common), "qa")
    return HFAdapter(tf.AutoModel.from_pretrained(cfg.model, add_pooling_layer=False, **common), "encoder")


def hf_loss(adapter: HFAdapter, cfg: FinetuneConfig, b: dict) -> torch.Tensor:
    hf = adapter.hf
    inputs = {k: b[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in b}
    if adapter.kind == "qa":
        return hf(**inputs, start_positions=b["start_positions"], end_positions=b["end_positions"]).loss
    if adapter.kind == "encoder":  # the (2B, T) a-then-b batch of a bi-encoder
        u, v = mean_pool(hf(**inputs).last_hidden_state, b["attention_mask"]).float().chunk(2)
        if cfg.similarity.loss == "cosent":  # the same function as sentence-transformers' CoSENTLoss (tested)
            return compute_cosent_loss(u, v, b["labels"])
        return F.mse_loss(F.cosine_similarity(u, v, dim=-1), b["labels"])  # CosineSimilarityLoss
    return hf(**inputs, labels=b["labels"]).loss  # CE, or MSE for one float label


def run_hf(task_name: str, cfg: FinetuneConfig, test_file: Path | None) -> dict:
    from transformers import get_linear_schedule_with_warmup

    t0 = time.time()
    precision = resolve_precision(cfg.precision, cfg.device, verbose=False)
    device = precision.device
    torch.manual_seed(cfg.seed)
    tokenizer = get_tokenizer(cfg.model)
    task = make_task(cfg.task, cfg)
    task.bind(tokenizer)
    train_items = task.read_train(cfg.train_file)[: cfg.max_train_examples]
    eval_path = cfg.validation_file or cfg.train_file  # QA: the held-out articles of train_file
    eval_items = task.read_eval(eval_path, cfg.max_eval_examples)
    model = build_hf(task, cfg).to(device)
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=device.type == "cuda")
    loader = torch.utils.data.DataLoader(train_items, batch_size=cfg.batch_size, shuffle=True, collate_fn=task.collate,
                                         generator=torch.Generator().manual_seed(cfg.seed), pin_memory=True)
    total = math.ceil(cfg.epochs * len(loader))
    sched = get_linear_schedule_with_warmup(opt, round(cfg.warmup_fraction * total), total)
    eval_every = cfg.eval_every or len(loader)
    step, best, history, train_time, examples = 0, {"value": -math.inf}, [], 0.0, 0
    model.train()
    while step < total:
        for b in loader:
            start = time.time()
            b = {k: v.to(device, non_blocking=True) for k, v in b.items()}
            with precision.autocast():
                loss = hf_loss(model, cfg, b)
            loss.backward()
            if cfg.clip_grad:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % cfg.log_every == 0:
                loss.item()  # sync so the timer counts the GPU work
            train_time += time.time() - start
            examples += len(b["labels"]) if "labels" in b else len(b["input_ids"])
            if step % eval_every == 0 or step == total:
                metrics = {k: v for k, v in task.evaluate(model, eval_items, precision).items()
                           if isinstance(v, (int, float))}
                history.append({"step": step, **metrics})
                print(f"hf {task_name} step {step}/{total}: {task.metric} {metrics[task.metric]:.4f}", flush=True)
                if metrics[task.metric] > best["value"]:
                    best = {"value": metrics[task.metric], "step": step,
                            "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
            if step == total:
                break
    row = {"best_dev": best["value"], "best_step": best["step"], "final_dev": history[-1][task.metric],
           "history": history, "examples_per_s": examples / train_time}
    if test_file is not None:
        model.load_state_dict(best["state"])
        meta = {"label_names": task.label_names}
        row["test"] = score_test(cfg, model, tokenizer, meta, test_file, precision)
    row["wall_s"] = time.time() - t0
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF BERT folder (e.g. all-MiniLM-L6-v2)")
    p.add_argument("--data-dir", type=Path, required=True, help="the folder holding sst2/, conll2003/, ...")
    p.add_argument("--tasks", default="sst2,conll,squad,stsb,stsb-bi")
    p.add_argument("--impl", default="bertkit,hf", help="bertkit, hf or both")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for both sides")
    p.add_argument("--bertkit-set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for bert-kit only")
    p.add_argument("--out", type=Path, default=None, help="append one JSON line per run here")
    args = p.parse_args()
    for task_name in args.tasks.split(","):
        if task_name not in TASKS:
            p.error(f"unknown task {task_name!r}; choose from {', '.join(TASKS)}")
        test = TASKS[task_name][2]
        test_file = args.data_dir / test if test else None
        for impl in args.impl.split(","):
            if impl not in ("bertkit", "hf"):
                p.error(f"--impl takes bertkit and/or hf, got {impl!r}")
            with tempfile.TemporaryDirectory() as tmp:
                extra = args.bertkit_set if impl == "bertkit" else []
                # lr: auto as bert-kit finetune resolves it: both runs, and the row, get the number
                cfg = resolve_lr(run_config(task_name, args, Path(tmp) / task_name, extra))
                row = run_bertkit(cfg, test_file) if impl == "bertkit" else run_hf(task_name, cfg, test_file)
            metric = make_task(cfg.task, cfg).metric if cfg.task != "classification" else "accuracy"
            row = {"task": task_name, "impl": impl, "metric": metric, "lr": cfg.lr, "epochs": cfg.epochs,
                   "batch_size": cfg.batch_size, "overrides": args.set + extra,
                   **row}
            test_note = ""
            if "test" in row:
                test_note = "  test " + ", ".join(f"{k} {row['test'][k]:.4f}" for k in ("f1", "pearson", "spearman")
                                                   if k in row["test"])
            print(f"== {task_name} {impl}: best dev {metric} {row['best_dev']:.4f} (step {row['best_step']}), "
                  f"final {row['final_dev']:.4f}{test_note}, {row['examples_per_s']:.0f} examples/s, "
                  f"{row['wall_s']:.0f} s", flush=True)
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                with args.out.open("a") as f:
                    f.write(json.dumps(row, default=float) + "\n")


if __name__ == "__main__":
    main()
