"""Multi-GPU scaling of BERT-base MLM+NSP pretraining with DDP (or FSDP2) on one host.

Launches `torchrun --nproc_per_node=N` for each N in --gpus with the same per-GPU batch, times
the training steps on every rank with CUDA events (warm-up and compilation excluded), and prints
tokens/s per GPU count and the scaling efficiency tokens/s(N) / (N x tokens/s(1)). Each worker
also records its loss curve, so the 2-GPU run can be compared with a 1-GPU run of the same global
batch (`--global-batch`). NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends).

    python benchmarks/scaling.py --gpus 1,2,4 --batch 256 --seq 128
    python benchmarks/scaling.py --gpus 1,2 --parallel fsdp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def worker(args: argparse.Namespace) -> None:
    """One rank: DDP/FSDP2 BERT-base on random tokens; rank 0 writes the timings as JSON."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bert_kit import BERTForPreTraining, create_model_config
    from bert_kit.heads import masked_index, pad_masked
    from bert_kit.kernels import fast_path
    from bert_kit.training.losses import compute_mlm_loss

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same init on every rank
    overrides = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0} if args.no_dropout else {}
    model = BERTForPreTraining(create_model_config("bert-base", **overrides)).cuda()
    fast_path.apply(model, "cuda", training=True, dtype=torch.bfloat16, compile=args.compile)
    if args.parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.bert.encoder.layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        step_model = model
    else:
        step_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    per_rank = args.global_batch // world if args.global_batch else args.batch
    g = torch.Generator().manual_seed(1234)
    batches = []
    for _ in range(8):  # the global batch, of which this rank takes its slice
        ids = torch.randint(1000, 30522, (per_rank * world, args.seq), generator=g)
        chosen = torch.rand(ids.shape, generator=g) < 0.15
        nsp_labels = torch.randint(0, 2, (per_rank * world,), generator=g)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        ids, chosen, nsp_labels = ids[mine], chosen[mine], nsp_labels[mine]
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        index = masked_index(labels)
        index, targets = pad_masked(index, labels.flatten()[index], capacity=ids.numel() // 5)
        batches.append([t.cuda() for t in (ids, index, targets, nsp_labels)])

    def loss_fn(ids, index, targets, nsp_labels):
        mlm, nsp = step_model(ids, masked_index=index)
        return compute_mlm_loss(mlm, targets) + F.cross_entropy(nsp.float(), nsp_labels)

    compiled = torch.compile(loss_fn) if args.compile else loss_fn
    times, losses = [], []
    for i in range(args.warmup + args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(*batches[i % len(batches)])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        if i >= args.warmup:
            times.append(start.elapsed_time(end) / 1e3)
        reduced = loss.detach().clone()
        dist.all_reduce(reduced, op=dist.ReduceOp.AVG)
        losses.append(reduced.item())
    if rank == 0:
        tokens = per_rank * world * args.seq
        Path(args.result).write_text(json.dumps({"gpus": world, "tokens_per_s": tokens / statistics.median(times),
                                                 "per_rank_batch": per_rank, "losses": losses}))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", default="1,2")
    p.add_argument("--batch", type=int, default=256, help="sequences per GPU")
    p.add_argument("--global-batch", type=int, default=0, help="fix the global batch instead (loss-curve check)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--no-dropout", action="store_true", help="deterministic model: 1 vs N GPU loss curves comparable step by step")
    p.add_argument("--json", type=Path, help="append one JSON line per GPU count")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    env = {**os.environ, **NO_MULTICAST}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in map(int, args.gpus.split(",")):
            out = Path(tmp) / f"{n}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", __file__,
                   "--worker", f"--result={out}", f"--batch={args.batch}", f"--global-batch={args.global_batch}",
                   f"--seq={args.seq}", f"--steps={args.steps}", f"--warmup={args.warmup}", f"--parallel={args.parallel}"]
            cmd += ["--compile"] * args.compile + ["--no-dropout"] * args.no_dropout
            subprocess.run(cmd, env=env, check=True)
            results[n] = json.loads(out.read_text())
    base = results[min(results)]["tokens_per_s"] / min(results)
    print(f"{args.parallel}, seq {args.seq}, " + (f"global batch {args.global_batch}" if args.global_batch else f"batch {args.batch} per GPU"))
    for n, r in results.items():
        print(f"  {n} GPU(s): {r['tokens_per_s'] / 1e3:8.1f}k tokens/s  efficiency {r['tokens_per_s'] / (n * base):6.1%}  "
              f"loss first/last {r['losses'][0]:.3f}/{r['losses'][-1]:.3f}")
    if args.json:
        with args.json.open("a") as f:
            for n, r in results.items():
                f.write(json.dumps({**r, "parallel": args.parallel, "seq": args.seq, "compile": args.compile,
                                    "no_dropout": args.no_dropout, "efficiency": r["tokens_per_s"] / (n * base)}) + "\n")
    if len(results) > 1 and args.global_batch:
        curves = [r["losses"] for r in results.values()]
        gap = max(abs(a - b) for a, b in zip(curves[0], curves[1]))
        print(f"  largest per-step loss gap between the first two runs: {gap:.4f}")


if __name__ == "__main__":
    main()
