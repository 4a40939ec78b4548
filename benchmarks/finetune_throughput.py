"""Fine-tuning throughput on real variable-length data: bert-kit vs an HF `transformers` loop.

Both sides train the same checkpoint on the same batches in the same order (SST-2 sentences or
SQuAD windows, batch 32, dynamic padding for HF), with bf16 autocast and fused AdamW. Batches
are tokenized and collated before timing; the timed region is forward, backward and the
optimizer step, wall-clock over many steps after warm-up (compilation excluded).

bert-kit variants:
  bertkit           eager, padded to the batch's longest (the plain path)
  bertkit-unpadded  eager, real tokens only (`unpadded=True`, varlen flash attention)
  bertkit-compile   padded to a multiple of 16, torch.compile + CUDA graphs ("reduce-overhead"),
                    so each step is a few graph replays instead of hundreds of kernel launches

    python benchmarks/finetune_throughput.py --model MINILM_FOLDER --data-dir ../shared/data
    python benchmarks/finetune_throughput.py --task squad --model bert-base
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_kit import BERTForQuestionAnswering, BERTForSequenceClassification, create_model_config  # noqa: E402
from bert_kit.data.classification import pad_collate, read_classification_file  # noqa: E402
from bert_kit.tokenizer import get_tokenizer  # noqa: E402


def load_features(task: str, data_dir: Path, tokenizer, limit: int) -> list[dict]:
    if task == "sst2":
        data = read_classification_file(data_dir / "sst2" / "train.tsv")
        enc = tokenizer(data.texts[:limit], padding=False, truncation=True, max_length=128, return_tensors=None)
        return [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                 "attention_mask": enc["attention_mask"][i], "labels": data.labels[i]}
                for i in range(len(enc["input_ids"]))]
    from bert_kit.data.squad import prepare_train_features, read_squad

    examples = read_squad(data_dir / "squad-v1.1" / "dev-v1.1.json")
    return prepare_train_features(examples[:limit], tokenizer, max_length=384, doc_stride=128)[:limit]


def make_batches(features: list[dict], batch_size: int, pad_multiple: int, pad_id: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(features), generator=g).tolist()
    batches = []
    for i in range(0, len(order) - batch_size + 1, batch_size):
        b = pad_collate([features[j] for j in order[i:i + batch_size]], pad_token_id=pad_id)
        T = b["input_ids"].shape[1]
        extra = (-T) % pad_multiple
        if extra:  # right-pad to a bucket length so compiled shapes repeat
            for k, v in list(b.items()):
                if v.dim() == 2:
                    b[k] = F.pad(v, (0, extra), value=pad_id if k == "input_ids" else 0)
        batches.append({k: v.pin_memory() for k, v in b.items()})
    return batches


def task_loss(task: str, out, b: dict) -> torch.Tensor:
    if task == "sst2":
        return F.cross_entropy(out.float(), b["labels"])
    start, end = out
    return (F.cross_entropy(start.float(), b["start_positions"]) + F.cross_entropy(end.float(), b["end_positions"])) / 2


def build(variant: str, task: str, model_arg: str):
    """-> (model, step_forward(batch) -> loss, pad_multiple)."""
    if variant.startswith("hf"):
        import transformers

        cls = transformers.BertForSequenceClassification if task == "sst2" else transformers.BertForQuestionAnswering
        kw = {"num_labels": 2} if task == "sst2" else {}
        if model_arg == "bert-base":
            cfg = transformers.BertConfig(**create_model_config("bert-base").to_hf_dict(), attn_implementation="sdpa", **kw)
            model = cls(cfg).cuda()
        else:
            model = cls.from_pretrained(model_arg, attn_implementation="sdpa", dtype=torch.float32, **kw).cuda()

        def fwd(b):
            out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], token_type_ids=b["token_type_ids"])
            return task_loss(task, out.logits if task == "sst2" else (out.start_logits, out.end_logits), b)

        return model, fwd, 1
    cls = BERTForSequenceClassification if task == "sst2" else BERTForQuestionAnswering
    kw = {"num_labels": 2} if task == "sst2" else {}
    if model_arg == "bert-base":
        model = cls(create_model_config("bert-base"), **kw).cuda()
    else:
        model = cls.from_pretrained(model_arg, dtype=torch.float32, **kw).cuda()
    unpadded = variant == "bertkit-unpadded"

    def fwd(b):
        out = model(b["input_ids"], b["attention_mask"], b["token_type_ids"], unpadded=unpadded)
        return task_loss(task, out, b)

    if variant == "bertkit-compile":
        return model, torch.compile(fwd, mode="reduce-overhead", dynamic=False), 16
    return model, fwd, 1


def run(variant: str, task: str, model_arg: str, features: list[dict], pad_id: int, steps: int, warmup: int) -> dict:
    torch.manual_seed(0)
    model, fwd, multiple = build(variant, task, model_arg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)
    batches = make_batches(features, 32, multiple, pad_id)
    shapes = sorted({b["input_ids"].shape[1] for b in batches})

    def step(b):
        b = {k: v.cuda(non_blocking=True) for k, v in b.items()}
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(b)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    seen = set()
    for b in batches:  # warm-up: every distinct shape once (compilation), then a few more steps
        if b["input_ids"].shape[1] not in seen:
            seen.add(b["input_ids"].shape[1])
            step(b)
    for b in batches[:warmup]:
        step(b)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    n = min(steps, len(batches))
    t0 = time.perf_counter()
    losses = [step(b) for b in batches[:n]]
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    tokens = sum(int(b["attention_mask"].sum()) for b in batches[:n])
    result = {"variant": variant, "examples_per_s": 32 * n / elapsed, "ms_per_step": 1e3 * elapsed / n,
              "real_tokens_per_s": tokens / elapsed, "warmup_s": warm_s, "shapes": len(shapes),
              "mean_loss_last_50": float(torch.stack(losses[-50:]).float().mean())}
    del model, opt
    torch.cuda.empty_cache()
    torch._dynamo.reset()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=["sst2", "squad"], default="sst2")
    p.add_argument("--model", required=True, help="HF/bert-kit folder (e.g. all-MiniLM-L6-v2) or 'bert-base' (random init)")
    p.add_argument("--tokenizer", help="tokenizer folder (default: --model)")
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    p.add_argument("--variants", default="hf,bertkit,bertkit-unpadded,bertkit-compile")
    p.add_argument("--examples", type=int, default=20000)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--warmup", type=int, default=20)
    args = p.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    tok = get_tokenizer(args.tokenizer or args.model)
    features = load_features(args.task, args.data_dir, tok, args.examples)
    mean_len = sum(len(f["input_ids"]) for f in features) / len(features)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  task {args.task}  model {args.model}")
    print(f"{len(features)} examples, mean length {mean_len:.1f} tokens, batch 32")
    results = []
    for v in args.variants.split(","):
        r = run(v, args.task, args.model, features, tok.pad_token_id, args.steps, args.warmup)
        results.append(r)
        print(f"  {v:18s} {r['examples_per_s']:9.0f} examples/s  {r['ms_per_step']:6.2f} ms/step  "
              f"{r['real_tokens_per_s'] / 1e3:7.1f}k real tok/s  shapes {r['shapes']:3d}  "
              f"warm-up {r['warmup_s']:5.1f}s  loss {r['mean_loss_last_50']:.3f}", flush=True)
    hf = next((r for r in results if r["variant"] == "hf"), None)
    ours = max((r for r in results if r["variant"].startswith("bertkit")), key=lambda r: r["examples_per_s"], default=None)
    if hf and ours:
        print(f"  ratio bert-kit ({ours['variant']}) / HF: {ours['examples_per_s'] / hf['examples_per_s']:.2f}x")


if __name__ == "__main__":
    main()
