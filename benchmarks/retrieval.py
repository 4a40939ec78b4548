"""Fine-tuning an embedding model for search, bert-kit beside sentence-transformers: one recipe, launch to exit.

The recipe (issue 50): MNRL (cosine, scale 20) with in-batch negatives and no text twice in a
batch, on NFCorpus's train qrels as (query, relevant document) pairs (110,575 under BERT_KIT_DATA),
from all-MiniLM-L6-v2 (`--model`: any folder, such as a from-scratch pretraining run's), batch 64,
lr 2e-5 with 10% linear warmup then linear decay, AdamW (betas 0.9/0.999, eps 1e-8, weight decay
0.01), gradient clipping at 1.0, 1 epoch, max length 256, seed 42; bf16 autocast on a GPU (fp32
weights), fp32 on the CPU. Both sides read the same pairs file this script writes, each in a fresh
process timed from launch to exit (imports, reading, tokenizing, training, saving the model):

- bert-kit: `bert-kit finetune --task embedding` (no evaluation during training);
- sentence-transformers: `SentenceTransformerTrainer` with `MultipleNegativesRankingLoss` and
  `BatchSamplers.NO_DUPLICATES` (needs the `datasets` and `accelerate` packages). Without them,
  a plain PyTorch loop over the same `SentenceTransformer` and loss (no `fit`, no Trainer; its
  own no-duplicates batches), printed as "sentence-transformers (plain loop)".

Then the start model and both trained models are scored by one `RetrievalEvaluator` (bert-kit's
encoder, fp32, max length 256) on the test split: nDCG@10 before and after, and the wall times.

    python benchmarks/retrieval.py --limit 256 --batch-size 16 --max-length 64 --max-steps 4 \
        --eval-queries 20 --eval-docs 300 --device cpu                    # a smoke check on the CPU
    python benchmarks/retrieval.py --device cuda                       # issue 50's figures on one H200
    python benchmarks/retrieval.py --device cuda --model runs/cram/final  # from a from-scratch model
    python benchmarks/retrieval.py --device cuda --exclude-known-positives --skip-st  # and with each
        # query's other relevant documents left out of its negatives (embedding.exclude_known_positives)

Targets (issue 50, one H200): bert-kit within 0.5 nDCG@10 of sentence-transformers and at least 3x
faster; fine-tuning raises nDCG@10 over zero-shot on the test queries.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
RECIPE = {"batch_size": 64, "lr": 2e-5, "epochs": 1, "warmup": 0.1, "weight_decay": 0.01, "eps": 1e-8,
          "max_length": 256, "seed": 42, "scale": 20.0, "clip": 1.0}
EXCLUDING = "bert-kit, known positives excluded"


def write_pairs(data: Path, split: str, out: Path, limit: int | None) -> int:
    """Every (query, relevant document) pair of a BEIR split as JSON Lines {anchor, positive}, in
    an order drawn at random (seeded: the qrels list a query's pairs together, so the first N would
    hold few queries, too few for batches without a repeated one). Both sides train on the first
    `limit` of them (bert-kit: max_train_examples), and every pair tells bert-kit's
    `embedding.exclude_known_positives` which documents a query's are. Returns the pairs that train."""
    from bert_kit.retrieval.beir import read_beir
    from bert_kit.retrieval.mining import pairs_from_beir

    anchors, positives = pairs_from_beir(read_beir(data, split, warn=False))
    rows = list(zip(anchors, positives))
    random.Random(0).shuffle(rows)
    out.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in rows), encoding="utf-8")
    return min(len(rows), limit or len(rows))


def bertkit_command(args: argparse.Namespace, pairs: Path, out: Path) -> list[str]:
    r = RECIPE
    command = [sys.executable, "-m", "bert_kit", "finetune", "--task", "embedding", f"model={args.model}",
               f"train_file={pairs}", f"output_dir={out}", f"batch_size={r['batch_size']}", f"lr={r['lr']}",
               f"epochs={r['epochs']}", f"warmup_fraction={r['warmup']}", f"weight_decay={r['weight_decay']}",
               f"eps={r['eps']}", f"max_length={r['max_length']}", f"seed={r['seed']}", f"clip_grad={r['clip']}",
               f"embedding.scale={r['scale']}", "schedule=linear", "log_every=50"]
    if args.device:
        command.append(f"device={args.device}")
    if args.max_steps:
        command.append(f"max_steps={args.max_steps}")
    if args.limit:
        command.append(f"max_train_examples={args.limit}")
    return command + args.bk_args.split()


# ---- sentence-transformers' side, in its own process (`--st-worker`) ----------------------------

def st_worker(args: argparse.Namespace) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    from bert_kit.model_folder import resolve_model

    r = RECIPE
    rows = [json.loads(line) for line in Path(args.pairs).read_text(encoding="utf-8").splitlines()[:args.limit]]
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(r["seed"])
    model = SentenceTransformer(str(resolve_model(args.model)), device=device).float()  # fp32 weights, as bert-kit
    model.max_seq_length = r["max_length"]
    try:
        if args.st_loop:
            raise ImportError(name="--st-loop")
        import accelerate  # noqa: F401  (the Trainer's)
        import datasets
    except ImportError as e:
        why = "asked for" if e.name == "--st-loop" else f"{e.name} is not installed, so no SentenceTransformerTrainer"
        print(f"sentence-transformers (plain loop): {why}", flush=True)
        plain_loop(model, rows, device, args.max_steps)
        how = "plain loop"
    else:
        trainer_run(model, rows, device, args.max_steps, datasets, Path(args.st_output).with_suffix(".trainer"))
        how = "SentenceTransformerTrainer"
    model.save(args.st_output)
    Path(args.st_output).with_suffix(".how").write_text(how)  # what the table calls this side


def trainer_run(model, rows: list[dict], device: str, max_steps: int | None, datasets, scratch: Path) -> None:
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    r = RECIPE
    train = datasets.Dataset.from_dict({"anchor": [x["anchor"] for x in rows],
                                        "positive": [x["positive"] for x in rows]})
    arguments = SentenceTransformerTrainingArguments(
        output_dir=str(scratch), num_train_epochs=r["epochs"], max_steps=max_steps or -1,
        per_device_train_batch_size=r["batch_size"], learning_rate=r["lr"], warmup_steps=r["warmup"],  # a fraction
        lr_scheduler_type="linear", weight_decay=r["weight_decay"], adam_epsilon=r["eps"],
        max_grad_norm=r["clip"], seed=r["seed"], data_seed=r["seed"], bf16=device.startswith("cuda"),
        batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", logging_steps=50, report_to="none",
        dataloader_drop_last=True)
    trainer = SentenceTransformerTrainer(model=model, args=arguments, train_dataset=train,
                                         loss=MultipleNegativesRankingLoss(model, scale=r["scale"]))
    print("sentence-transformers (SentenceTransformerTrainer)", flush=True)
    trainer.train()


def no_duplicate_batches(rows: list[dict], size: int, seed: int) -> list[list[int]]:
    """Shuffled rows dealt into batches in which no text comes twice (sentence-transformers' rule):
    a row whose text the batch holds waits, first in line for the next batch; the rows that
    cannot fill a last batch are left out."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    pending, batches = collections.deque(order), []
    while len(pending) >= size:
        batch, seen, skipped = [], set(), []
        while pending and len(batch) < size:
            i = pending.popleft()
            texts = (rows[i]["anchor"], rows[i]["positive"])
            if seen.isdisjoint(texts):
                batch.append(i)
                seen.update(texts)
            else:
                skipped.append(i)
        pending.extendleft(reversed(skipped))
        if len(batch) < size:
            break
        batches.append(batch)
    return batches


def plain_loop(model, rows: list[dict], device: str, max_steps: int | None) -> None:
    """The recipe without datasets: shuffled no-duplicates batches, MNRL, AdamW with linear warmup
    and decay, clipping; bf16 autocast on a GPU as the Trainer's bf16=True."""
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.util import batch_to_device
    from transformers import get_linear_schedule_with_warmup

    r = RECIPE
    batches = no_duplicate_batches(rows, r["batch_size"], r["seed"])
    steps = min(max_steps or len(batches), len(batches))
    loss_fn = MultipleNegativesRankingLoss(model, scale=r["scale"])
    decay = [p for n, p in model.named_parameters() if not any(k in n for k in ("bias", "LayerNorm", "norm"))]
    rest = [p for n, p in model.named_parameters() if any(k in n for k in ("bias", "LayerNorm", "norm"))]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": r["weight_decay"]},
                                   {"params": rest, "weight_decay": 0.0}], lr=r["lr"], eps=r["eps"])
    schedule = get_linear_schedule_with_warmup(optimizer, int(r["warmup"] * steps), steps)
    model.train()
    for step, batch in enumerate(batches[:steps], 1):
        features = [batch_to_device(model.preprocess([rows[i][key] for i in batch]), device)
                    for key in ("anchor", "positive")]
        with torch.autocast(device.split(":")[0], torch.bfloat16, enabled=device.startswith("cuda")):
            loss = loss_fn(features, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r["clip"])
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps:
            print(f"step {step}/{steps}: loss {loss.item():.4f}", flush=True)


# ---- both sides, and the scores ----------------------------------------------------------------

def timed(command: list[str]) -> float:
    """Seconds from launch to exit; the command's output passes through."""
    t0 = time.perf_counter()
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": path})
    return time.perf_counter() - t0


def ndcg_of(folder: str | Path, evaluator, device: str, max_length: int | None = None) -> dict:
    from bert_kit.embeddings import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(folder, max_length=max_length or RECIPE["max_length"],
                                              device=device or None, precision="fp32")
    return evaluator(encoder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = Path(os.environ.get("BERT_KIT_DATA", REPO.parent / "shared" / "data"))
    parser.add_argument("--data", type=Path, default=root / "nfcorpus", help="a BEIR folder (default: NFCorpus)")
    parser.add_argument("--model", default=MODEL, help="the start model (a folder or a hub name's local copy)")
    parser.add_argument("--device", default="", help="cpu, cuda (default: cuda if available)")
    parser.add_argument("--limit", type=int, default=None, help="train on N pairs drawn at random (seeded)")
    parser.add_argument("--batch-size", type=int, default=RECIPE["batch_size"], help="pairs a batch, both sides")
    parser.add_argument("--max-length", type=int, default=RECIPE["max_length"], help="tokens a text, both sides")
    parser.add_argument("--max-steps", type=int, default=None, help="stop both sides after N steps")
    parser.add_argument("--eval-max-length", type=int, default=None,
                        help="tokens a text when scoring (default: --max-length), e.g. 256 after training at 128")
    parser.add_argument("--eval-queries", type=int, default=None, help="score N test queries drawn at random")
    parser.add_argument("--eval-docs", type=int, default=None, help="... against their documents and others, N in all")
    parser.add_argument("--bk-args", default="", help='more `bert-kit finetune` settings, e.g. "embedding.cached=true"')
    parser.add_argument("--skip-st", action="store_true", help="bert-kit only")
    parser.add_argument("--exclude-known-positives", action="store_true",
                        help="also train bert-kit with embedding.exclude_known_positives (a row of its own)")
    parser.add_argument("--st-loop", action="store_true",
                        help="sentence-transformers' side as the plain PyTorch loop even where the Trainer can run")
    parser.add_argument("--keep", type=Path, default=None, help="keep the trained models in this folder")
    parser.add_argument("--st-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pairs", help=argparse.SUPPRESS)
    parser.add_argument("--st-output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    RECIPE.update(batch_size=args.batch_size, max_length=args.max_length)
    if args.st_worker:
        st_worker(args)
        return

    from bert_kit.retrieval.beir import read_beir, subsample
    from bert_kit.retrieval.evaluator import RetrievalEvaluator

    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        pairs = work / "pairs.jsonl"
        n = write_pairs(args.data, "train", pairs, args.limit)
        print(f"{n} (query, relevant document) pairs of {args.data.name} train; recipe {RECIPE}", flush=True)
        times = {"bert-kit": timed(bertkit_command(args, pairs, work / "bertkit"))}
        if args.exclude_known_positives:  # the same run, each query's other documents no negatives of it
            times[EXCLUDING] = timed(bertkit_command(args, pairs, work / "excluding")
                                     + ["embedding.exclude_known_positives=true"])
        if not args.skip_st:
            st_out = work / "sentence-transformers"
            times["sentence-transformers"] = timed(
                [sys.executable, __file__, "--st-worker", "--pairs", str(pairs), "--st-output", str(st_out),
                 "--model", args.model, "--device", args.device, "--batch-size", str(args.batch_size),
                 "--max-length", str(args.max_length)]
                + (["--max-steps", str(args.max_steps)] if args.max_steps else [])
                + (["--limit", str(args.limit)] if args.limit else [])
                + (["--st-loop"] if args.st_loop else []))
        test = read_beir(args.data, "test", warn=False)
        if args.eval_queries or args.eval_docs:
            test = subsample(test, args.eval_queries, args.eval_docs, seed=0)
        evaluator = RetrievalEvaluator(test)
        scores = {"zero-shot": ndcg_of(args.model, evaluator, args.device, args.eval_max_length),
                  "bert-kit": ndcg_of(work / "bertkit" / "best", evaluator, args.device, args.eval_max_length)}
        if args.exclude_known_positives:
            scores[EXCLUDING] = ndcg_of(work / "excluding" / "best", evaluator, args.device, args.eval_max_length)
        if not args.skip_st:
            scores["sentence-transformers"] = ndcg_of(work / "sentence-transformers", evaluator, args.device,
                                                      args.eval_max_length)
            how = (work / "sentence-transformers.how").read_text()
    print(f"\n{args.data.name} test: {len(test.qrels)} queries, {len(test.corpus_ids)} documents; "
          f"model {args.model}; {n} training pairs")
    print(f"{'':40}{'nDCG@10':>9}{'MRR@10':>9}{'R@100':>9}{'train s':>10}")
    for name, m in scores.items():
        t = f"{times[name]:10.1f}" if name in times else f"{'':>10}"
        label = f"{name} ({how})" if name == "sentence-transformers" else name
        print(f"{label:40}{100 * m['ndcg@10']:9.2f}{100 * m['mrr@10']:9.2f}{100 * m['recall@100']:9.2f}{t}")
    if "sentence-transformers" in times:
        gap = 100 * (scores["bert-kit"]["ndcg@10"] - scores["sentence-transformers"]["ndcg@10"])
        print(f"bert-kit is {times['sentence-transformers'] / times['bert-kit']:.2f}x faster launch to exit; "
              f"nDCG@10 {gap:+.2f} beside sentence-transformers (target: within 0.5, at least 3x)")
    for name in ("bert-kit", EXCLUDING):
        if name in scores:
            gain = 100 * (scores[name]["ndcg@10"] - scores["zero-shot"]["ndcg@10"])
            print(f"fine-tuning ({name}) moved nDCG@10 by {gain:+.2f} over zero-shot")


if __name__ == "__main__":
    main()
