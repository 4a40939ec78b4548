"""Pretraining throughput: bert-kit vs HF `transformers` on the same GPU, config, batch and data.

Each variant trains BERT MLM+NSP with bf16 autocast and fused AdamW; warm-up (and compilation)
is excluded; steps are timed with CUDA events and the median step gives tokens/s. MFU counts
useful FLOPs (bert_kit.model.flops_per_token: encoder matmuls, attention, MLM decoder on the
masked tokens only) against a measured 790 TFLOP/s bf16 peak.

    python benchmarks/pretrain_throughput.py                       # both shapes, all variants
    python benchmarks/pretrain_throughput.py --shapes 128x256 --variants bertkit-compile,hf-compile
    python benchmarks/pretrain_throughput.py --real wikitext.txt   # variable-length real text too
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch._functorch.config
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_kit import BERTForPreTraining, create_model_config  # noqa: E402
from bert_kit.heads import masked_index, with_prediction_slots  # noqa: E402
from bert_kit.kernels import fast_path  # noqa: E402
from bert_kit.model import estimate_mfu  # noqa: E402
from bert_kit.training.losses import compute_mlm_loss  # noqa: E402

PEAK = 790e12


def random_batches(n: int, batch: int, seq: int, vocab: int, seed: int = 0) -> list[dict]:
    """Random tokens, 15% of positions labelled (-100 elsewhere), random NSP labels."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1000, vocab, (batch, seq), generator=g)
        labelled = torch.rand(batch, seq, generator=g) < 0.15
        labels = torch.where(labelled, ids, torch.full_like(ids, -100))
        types = torch.zeros_like(ids)
        types[:, seq // 2:] = 1
        out.append({"input_ids": ids, "token_type_ids": types, "labels": labels,
                    "next_sentence_label": torch.randint(0, 2, (batch,), generator=g), "attention_mask": None})
    return out


def real_batches(path: Path, batch: int, seq: int, n: int, tokenizer_dir: Path) -> list[dict]:
    """WikiText paragraphs as single segments, padded to the longest in the batch."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.enable_truncation(seq)
    lines = [l.strip() for l in path.read_text().splitlines() if len(l.strip()) > 20 and not l.strip().startswith("=")]
    encs = tok.encode_batch(lines[: batch * n])
    g = torch.Generator().manual_seed(0)
    out = []
    for b in range(n):
        chunk = encs[b * batch:(b + 1) * batch]
        T = max(len(e.ids) for e in chunk)
        ids = torch.zeros(batch, T, dtype=torch.long)
        mask = torch.zeros(batch, T, dtype=torch.long)
        for i, e in enumerate(chunk):
            ids[i, : len(e.ids)] = torch.tensor(e.ids)
            mask[i, : len(e.ids)] = 1
        labelled = (torch.rand(batch, T, generator=g) < 0.15) & (ids > 103)
        labels = torch.where(labelled, ids, torch.full_like(ids, -100))
        out.append({"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "labels": labels,
                    "next_sentence_label": torch.randint(0, 2, (batch,), generator=g), "attention_mask": mask})
    return out


def make_bertkit(config, compile_mode: str | None, unpadded: bool, static: bool = False,
                 options: dict | None = None, fp32_residual: bool = False, rng_recompute: bool = False,
                 cudnn_attention: bool = True, triton_dropout: bool = True, fused_grads: bool = True,
                 short_attention: bool = True):
    torch._functorch.config.functionalize_rng_ops = rng_recompute  # process-wide, read when traced
    torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)  # off: SDPA falls back to flash attention
    model = BERTForPreTraining(config).cuda()
    # what `bert-kit pretrain` puts on the model; short attention needs the fused backward
    fast = fast_path.apply(model, "cuda", training=True, dtype=torch.bfloat16, compile=compile_mode is not None,
                           low_precision_residual=not fp32_residual, triton_dropout=triton_dropout,
                           fused_backward=fused_grads, short_attention=short_attention)
    print(f"  {fast}", flush=True)

    def loss_fn(b):
        mlm, nsp = model(b["input_ids"], b["attention_mask"], b["token_type_ids"], unpadded=unpadded,
                         masked_index=b["masked_index"])
        return compute_mlm_loss(mlm, b["masked_labels"]) + F.cross_entropy(nsp.float(), b["next_sentence_label"])

    if compile_mode:
        torch._dynamo.config.capture_dynamic_output_shape_ops = True  # unpadding: nonzero
        torch._dynamo.config.capture_scalar_outputs = True  # unpadding: the longest length
        mode = None if compile_mode == "default" else compile_mode
        loss_fn = torch.compile(loss_fn, dynamic=not static, mode=mode, options=options)
    return model, loss_fn


def make_hf(config, compile_mode: str | None, attn: str):
    import transformers

    torch._functorch.config.functionalize_rng_ops = False
    torch.backends.cuda.enable_cudnn_sdp(True)
    hf_config = transformers.BertConfig(**config.to_hf_dict(), attn_implementation=attn)
    model = transformers.BertForPreTraining(hf_config).cuda()

    def loss_fn(b):
        return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], token_type_ids=b["token_type_ids"],
                     labels=b["labels"], next_sentence_label=b["next_sentence_label"]).loss

    if compile_mode:
        loss_fn = torch.compile(loss_fn)
    return model, loss_fn


CUDAGRAPHS_COORD = {"triton.cudagraphs": True, "coordinate_descent_tuning": True}  # inductor options

# Variants named "static" train on fixed prediction slots (what `bert-kit pretrain compile=true`
# does); the others on the exact masked positions of each batch.
VARIANTS = {
    "bertkit": lambda c: make_bertkit(c, None, False),
    "bertkit-compile": lambda c: make_bertkit(c, "default", False),
    "bertkit-static": lambda c: make_bertkit(c, "default", False, static=True),
    "bertkit-static-cudagraphs": lambda c: make_bertkit(c, "reduce-overhead", False, static=True),
    # the same on the exact masked positions (no padded slots): one graph per masked count, so it
    # fits a benchmark's few fixed batches, not a training run; the figures of 2026-11-26 used it
    "bertkit-cudagraphs-coord": lambda c: make_bertkit(c, "default", False, static=True, options=CUDAGRAPHS_COORD),
    "bertkit-static-cudagraphs-coord": lambda c: make_bertkit(c, "default", False, static=True, options=CUDAGRAPHS_COORD),
    # inductor's own dropout (one Philox call per element) instead of bert_kit.kernels.dropout's mask
    "bertkit-static-inductordropout": lambda c: make_bertkit(c, "default", False, static=True, triton_dropout=False),
    # inductor's kernels for the FFN's and QKV's gradients and bias gradients instead of kernels.fused_backward's
    # (and SDPA's attention: kernels.short_attention builds on fused_backward)
    "bertkit-static-inductorbackward": lambda c: make_bertkit(c, "default", False, static=True, fused_grads=False),
    "bertkit-static-cudagraphs-inductorbackward": lambda c: make_bertkit(c, "reduce-overhead", False, static=True,
                                                                         fused_grads=False),
    "bertkit-static-cudagraphs-coord-inductorbackward": lambda c: make_bertkit(
        c, "default", False, static=True, fused_grads=False, options=CUDAGRAPHS_COORD),
    # SDPA's attention (cuDNN's kernels) instead of kernels.short_attention's; "flash": SDPA's flash kernel
    "bertkit-static-sdpa": lambda c: make_bertkit(c, "default", False, static=True, short_attention=False),
    "bertkit-static-cudagraphs-sdpa": lambda c: make_bertkit(c, "reduce-overhead", False, static=True,
                                                             short_attention=False),
    "bertkit-static-cudagraphs-coord-sdpa": lambda c: make_bertkit(
        c, "default", False, static=True, short_attention=False, options=CUDAGRAPHS_COORD),
    "bertkit-static-flash": lambda c: make_bertkit(c, "default", False, static=True, cudnn_attention=False,
                                                   short_attention=False),
    # independent small kernels (bias gradients, optimizer pieces) launched as one
    "bertkit-static-combo": lambda c: make_bertkit(c, "default", False, static=True, options={"combo_kernels": True}),
    # Triton matmul templates with fused epilogues, chosen by benchmarking (minutes of compilation)
    "bertkit-autotune": lambda c: make_bertkit(c, "max-autotune-no-cudagraphs", False, static=True),
    # Triton block sizes of the elementwise and LayerNorm kernels tuned by benchmarking
    "bertkit-static-coord": lambda c: make_bertkit(c, "default", False, static=True,
                                                   options={"coordinate_descent_tuning": True}),
    # dropout masks regenerated from the Philox seed in the backward instead of stored
    "bertkit-static-rng": lambda c: make_bertkit(c, "default", False, static=True, rng_recompute=True),
    # autocast's float32 LayerNorm outputs, so a float32 residual stream (as HF)
    "bertkit-static-fp32res": lambda c: make_bertkit(c, "default", False, static=True, fp32_residual=True),
    # static shapes, CUDA graphs and recomputed dropout masks together (inductor's CUDA-graph
    # pool check rejects this in torch 2.11, see reports/2026-11-26-pretrain-throughput.md)
    "bertkit-fast": lambda c: make_bertkit(c, "default", False, static=True, rng_recompute=True,
                                           options={"triton.cudagraphs": True}),
    # diagnostic, not a comparable configuration: what dropout (masks, RNG, extra passes) costs
    "bertkit-static-nodropout": lambda c: make_bertkit(dataclasses.replace(c, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
                                                       "default", False, static=True),
    "bertkit-static-noattndropout": lambda c: make_bertkit(dataclasses.replace(c, attention_probs_dropout_prob=0.0),
                                                           "default", False, static=True),
    "bertkit-static-nohiddendropout": lambda c: make_bertkit(dataclasses.replace(c, hidden_dropout_prob=0.0),
                                                             "default", False, static=True),
    "bertkit-unpadded": lambda c: make_bertkit(c, None, True),
    "bertkit-unpadded-compile": lambda c: make_bertkit(c, "default", True),
    "hf-eager": lambda c: make_hf(c, None, "eager"),
    "hf-sdpa": lambda c: make_hf(c, None, "sdpa"),
    "hf-compile": lambda c: make_hf(c, "default", "sdpa"),
}


KERNEL_GROUPS = (("matmul (cuBLAS/CUTLASS)", ("gemm", "cutlass", "cublas", "sm90_xmma", "nvjet")),
                 ("attention (flash/cuDNN)", ("flash", "fmha", "cudnn", "attention")),
                 ("optimizer (fused AdamW)", ("adam",)),
                 ("embedding / index scatter", ("index", "scatter", "embedding", "gather")),
                 ("fused elementwise / norms (Triton)", ("triton",)))


def print_gaps(prof, n: int) -> None:
    """How much of the steps' span the GPU ran kernels, from the profile's trace (no step waits
    for the one before, as in training): the idle time is launch gaps between kernels."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    kernels = sorted((e["ts"], e["dur"]) for e in events
                     if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"))
    if not kernels:
        return
    busy, span = sum(d for _, d in kernels), kernels[-1][0] + kernels[-1][1] - kernels[0][0]
    gaps = [b[0] - (a[0] + a[1]) for a, b in zip(kernels, kernels[1:])]
    print(f"  trace: GPU busy {busy / n / 1e3:.2f} ms of {span / n / 1e3:.2f} a step, {len(kernels) // n} kernels a step; "
          f"gaps over 8 us {sum(g for g in gaps if g > 8) / n / 1e3:.2f} ms a step, the longest {max(gaps, default=0):.0f} us")


def print_profile(step, dev: list[dict], n: int = 5) -> None:
    """GPU time per step by kernel family, the launch gaps, then the 40 costliest kernels (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            step(dev[i % len(dev)])
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in events) / n
    if not total:  # kernels not reported as separate events: print torch's own table instead
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=20))
        return
    groups: dict[str, float] = {}
    for e in events:
        name = e.key.lower()
        group = next((g for g, keys in KERNEL_GROUPS if any(k in name for k in keys)), "other")
        groups[group] = groups.get(group, 0.0) + e.self_device_time_total / n
    print(f"  profile: {total / 1e3:.1f} ms of GPU kernels per step")
    print_gaps(prof, n)
    for g, t in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"    {g:38s} {t / 1e3:7.2f} ms  {100 * t / total:5.1f}%")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:40]:
        print(f"    {e.self_device_time_total / n / 1e3:7.2f} ms  x{e.count // n:<3d} {e.key[:150]}")


def run_variant(name: str, config, batches: list[dict], warmup: int, steps: int, profile: bool = False) -> dict:
    torch.manual_seed(0)
    model, loss_fn = VARIANTS[name](config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    for b in batches:  # as a collator would: the flat masked positions, computed on the CPU
        if "static" in name:  # fixed prediction slots: 20% of the tokens, so shapes never change
            b.update(with_prediction_slots(b, share=0.2, multiple=1))
        else:
            b["masked_index"] = masked_index(b["labels"])
            b["masked_labels"] = b["labels"].flatten()[b["masked_index"]]
    dev = [{k: (v.cuda(non_blocking=True) if v is not None else None) for k, v in b.items()} for b in batches]

    def step(b):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(b)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    for i in range(warmup):
        step(dev[i % len(dev)])
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i in range(steps):
        b = dev[(warmup + i) % len(dev)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step(b)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
        losses.append(loss.item())
    if profile:
        print_profile(step, dev)
    tokens = [int(b["attention_mask"].sum()) if b["attention_mask"] is not None else b["input_ids"].numel()
              for b in batches]
    mean_tokens = statistics.mean(tokens)
    tps = mean_tokens / statistics.median(times)
    seq = batches[0]["input_ids"].shape[1]
    result = {"variant": name, "tokens_per_s": tps, "step_ms": 1e3 * statistics.median(times),
              "mfu": estimate_mfu(config, seq, tps, PEAK), "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
              "warmup_s": warm_s, "final_loss": losses[-1]}
    del model, opt, dev, loss_fn
    gc.collect()
    torch.cuda.empty_cache()
    torch._dynamo.reset()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="128x256,512x32", help="SEQxBATCH list")
    p.add_argument("--variants", default="bertkit-compile,hf-sdpa,hf-compile")
    p.add_argument("--model", default="bert-base-uncased (110M)")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--real", type=Path, help="a text file for the variable-length real-data case")
    p.add_argument("--tokenizer", type=Path, help="folder with tokenizer.json for --real")
    p.add_argument("--real-variants", default="bertkit-unpadded,bertkit-compile,hf-sdpa,hf-compile")
    p.add_argument("--json", type=Path, help="append results as JSON lines")
    p.add_argument("--profile", default="", help="comma-separated variants to profile after timing")
    args = p.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    torch.backends.cuda.matmul.allow_tf32 = True
    config = create_model_config(args.model)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  model {args.model}")
    cases = []
    for shape in args.shapes.split(","):
        seq, batch = map(int, shape.split("x"))
        cases.append((f"random seq {seq} batch {batch}", random_batches(4, batch, seq, config.vocab_size),
                      args.variants.split(",")))
    if args.real:
        cases.append((f"real {args.real.name} batch 256 (padded to longest)",
                       real_batches(args.real, 256, 128, 8, args.tokenizer), args.real_variants.split(",")))
    rows = []
    for case, batches, variants in cases:
        print(f"\n== {case}")
        results = []
        for v in variants:
            try:
                r = run_variant(v, config, batches, args.warmup, args.steps, profile=v in args.profile.split(","))
            except Exception as e:  # one failing variant should not hide the others' figures
                print(f"  {v:26s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
                torch._dynamo.reset()
                continue
            r["case"] = case
            results.append(r)
            print(f"  {v:26s} {r['tokens_per_s'] / 1e3:8.1f}k tok/s  {r['step_ms']:7.1f} ms/step  "
                  f"MFU {100 * r['mfu']:5.1f}%  peak {r['peak_gib']:5.1f} GiB  warm-up {r['warmup_s']:5.1f}s  "
                  f"loss {r['final_loss']:.3f}", flush=True)
        ours = max((r for r in results if r["variant"].startswith("bertkit")), key=lambda r: r["tokens_per_s"], default=None)
        hf = max((r for r in results if r["variant"].startswith("hf")), key=lambda r: r["tokens_per_s"], default=None)
        if ours and hf:
            print(f"  ratio bert-kit ({ours['variant']}) / best HF ({hf['variant']}): "
                  f"{ours['tokens_per_s'] / hf['tokens_per_s']:.2f}x")
        rows += results
    if args.json:
        with args.json.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
