"""ModernBERT throughput: bert-kit beside transformers' `ModernBertForMaskedLM`, same GPU, shapes and data, one call.

Training: the ModernBERT-base MLM step from random init, bf16 autocast, fused AdamW, 30% of the tokens
masked (ModernBERT's rate), random full-length sequences, at (seq 128, batch 256), (512, 64), (1024, 32):
- bertkit: `ModernBertForMaskedLM` with `fast_path.apply` (flash varlen attention with the 128-token
  window, batches packed, 16-bit residual stream), the MLM decoder at the masked positions only, in
  fixed prediction slots, and the step's loss compiled with static shapes; bertkit-cudagraphs: the
  same replayed as CUDA graphs; bertkit-eager: not compiled; bertkit-flex: FlexAttention instead of flash;
- hf-eager, hf-compile: transformers' class with SDPA attention (a mask holding the window for the
  sliding layers), its own loss over every position, eager or under `torch.compile`.
Inference: the encoder's forward pass in bf16 weights, on 512-token (batch 64) and 8,192-token
(batch 4) inputs: bertkit (fast path, compiled; padded rows packed), bertkit-unpadded (fast path,
eager, the real tokens only: what `bert-kit embed`, `predict` and `serve` run), hf-eager, hf-compile.
With --mixed the rows have lengths drawn from T/8 to T (right-padded, one row full), as texts
are, and tokens/s counts the real tokens.

Warm-up (and compilation) is excluded; steps are timed with CUDA events and the median gives tokens/s.
MFU counts useful FLOPs (`bert_kit.modernbert.flops_per_token`: the layers' matmuls, attention over the
keys each window really holds, the MLM head on the masked tokens only) against --peak (790 TFLOP/s: the
measured bf16 dense peak benchmarks/pretrain_throughput.py uses, so the MFU figures compare). Each row
also says how far it is from the best transformers row of its case.

    python benchmarks/modernbert_throughput.py --shapes 128x256 --inference none     # one training shape
    python benchmarks/modernbert_throughput.py --shapes none --inference 512x64,8192x4
    python benchmarks/modernbert_throughput.py --shapes none --inference 512x64,8192x4 --mixed
    python benchmarks/modernbert_throughput.py --tiny --steps 2                     # a check, on a CPU too
Every compiled variant compiles the model once (a minute or two for ModernBERT-base on an H200):
one training shape per call keeps a call within a few minutes, or --parallel 4 compiles the variants
side by side in child processes (in waves that fit the GPU's memory) and times them one at a time, the
GPU otherwise idle; `benchmarks/modernbert_gpu.sh` runs every shape so, beside the GPU tests.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_kit.heads import with_prediction_slots  # noqa: E402
from bert_kit.kernels import fast_path  # noqa: E402
from bert_kit.modernbert import ModernBertForMaskedLM, ModernBertModel, estimate_mfu  # noqa: E402
from bert_kit.modernbert_config import ModernBertConfig  # noqa: E402
from bert_kit.training.losses import compute_mlm_loss  # noqa: E402

MASKED = 0.3  # ModernBERT's masking rate
SLOTS = 0.32  # prediction slots per position: above the masked share of any batch here
TRAINING_VARIANTS = ("bertkit", "bertkit-cudagraphs", "bertkit-eager", "bertkit-flex", "hf-eager", "hf-compile")
INFERENCE_VARIANTS = ("bertkit", "bertkit-unpadded", "bertkit-eager", "hf-eager", "hf-compile")


def random_batches(n: int, batch: int, seq: int, vocab: int, mixed: bool = False, seed: int = 0) -> list[dict]:
    """Random tokens of full-length sequences (mixed: lengths from seq / 8 to seq, right-padded with
    id 0, the first row full), 30% of the real positions labelled (-100 elsewhere), with the fixed
    prediction slots a bert-kit collator adds (computed here, on the host)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(100, vocab, (batch, seq), generator=g)
        mask = torch.ones_like(ids)
        if mixed:
            lengths = torch.randint(max(1, seq // 8), seq + 1, (batch,), generator=g)
            lengths[0] = seq
            mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
            ids = ids * mask
        labelled = (torch.rand(batch, seq, generator=g) < MASKED) & mask.bool()
        labels = torch.where(labelled, ids, torch.full_like(ids, -100))
        b = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        out.append(with_prediction_slots(b, share=SLOTS, multiple=64))
    return out


def hf_config(config: ModernBertConfig):
    import transformers

    d = {k: v for k, v in config.to_hf_dict().items() if k not in ("model_type", "architectures")}
    return transformers.ModernBertConfig(**d, attn_implementation="sdpa")


def make_training(name: str, config: ModernBertConfig, device: str):
    """(model, loss function of a batch) for a training variant."""
    if name.startswith("hf"):
        import transformers

        model = transformers.ModernBertForMaskedLM(hf_config(config)).to(device)

        def loss_fn(b):
            return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss

        compiled = name == "hf-compile"
    else:
        model = ModernBertForMaskedLM(config).to(device)
        compiled = name in ("bertkit", "bertkit-cudagraphs", "bertkit-flex")
        fast = fast_path.apply(model, device, training=True, dtype=torch.bfloat16, compile=compiled,
                               low_precision_residual=True, attention="flex" if name == "bertkit-flex" else "auto")
        print(f"  {name}: {fast}", flush=True)

        def loss_fn(b):  # the decoder at the masked positions only, in fixed slots (static shapes)
            logits = model(b["input_ids"], b["attention_mask"], masked_index=b["masked_index"])  # (K, V)
            return compute_mlm_loss(logits, b["masked_labels"])

    if compiled:
        mode = "reduce-overhead" if name.endswith("cudagraphs") else None
        loss_fn = torch.compile(loss_fn, dynamic=False, mode=mode)
    return model, loss_fn


def make_inference(name: str, config: ModernBertConfig, device: str):
    """(model, forward of a batch -> last hidden states) for an inference variant, weights in bf16."""
    if name.startswith("hf"):
        import transformers

        model = transformers.ModernBertModel(hf_config(config)).to(device, torch.bfloat16).eval()

        def forward(b):
            return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state

        compiled = name == "hf-compile"
    else:
        model = ModernBertModel(config).to(device, torch.bfloat16).eval()
        compiled = name == "bertkit"
        fast = fast_path.apply(model, device, training=False, dtype=torch.bfloat16, compile=compiled)
        print(f"  {name}: {fast}", flush=True)
        unpadded = name == "bertkit-unpadded"  # the jobs' call: the real tokens only

        def forward(b):
            return model(b["input_ids"], b["attention_mask"], unpadded=unpadded)

    if compiled:
        forward = torch.compile(forward, dynamic=False)
    return model, forward


def timed(step, batches: list[dict], warmup: int, steps: int, device: str) -> tuple[list[float], float]:
    """Seconds of each timed step (CUDA events on a GPU), and the warm-up's seconds."""
    t0 = time.perf_counter()
    for i in range(warmup):
        step(batches[i % len(batches)])
    if device == "cuda":
        torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    times = []
    for i in range(steps):
        b = batches[(warmup + i) % len(batches)]
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(b)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            step(b)
            times.append(time.perf_counter() - t)
    return times, warm


def prepare(kind: str, name: str, config: ModernBertConfig, batches: list[dict], args) -> tuple:
    """(step of a batch, the batches on the device, the model) for a variant; nothing run yet."""
    torch.manual_seed(0)
    device = args.device
    autocast = torch.autocast(device, dtype=torch.bfloat16)
    if kind == "training":
        model, loss_fn = make_training(name, config, device)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=device == "cuda")

        def step(b):
            with autocast:
                loss = loss_fn(b)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        model, forward = make_inference(name, config, device)

        def step(b):
            with torch.inference_mode():
                return forward(b)

    dev = [{k: v.to(device, non_blocking=True) for k, v in b.items()} for b in batches]
    return step, dev, model


def measure(kind: str, name: str, config: ModernBertConfig, batches: list[dict], step, dev: list[dict], args,
            warmup: int, compile_s: float = 0.0) -> dict:
    """Warm-up steps, then the timed ones: the row of the table (the peak memory is the timed steps')."""
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, warm = timed(step, dev, warmup, args.steps, args.device)
    tokens = statistics.mean(int(b["attention_mask"].sum()) for b in batches)  # real tokens
    seq = batches[0]["input_ids"].shape[1]
    tps = tokens / statistics.median(times)
    return {"variant": name, "tokens_per_s": tps, "step_ms": 1e3 * statistics.median(times),
            "warmup_s": compile_s + warm,
            "mfu": estimate_mfu(config, seq, tps, args.peak, MASKED, training=kind == "training"),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None}


def run(kind: str, name: str, config: ModernBertConfig, batches: list[dict], args) -> dict:
    """One variant in this process: prepared, warmed up (compiled), timed, freed."""
    step, dev, model = prepare(kind, name, config, batches, args)
    result = measure(kind, name, config, batches, step, dev, args, args.warmup)
    if args.profile:
        print_profile(name, step, dev, args.profile)
    del model, dev, step
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    torch._dynamo.reset()
    return result


def print_profile(name: str, step, dev: list[dict], rows: int) -> None:
    """A diagnostic (--profile N): the N kernels that took the most device time over 3 warm steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in dev[:3]:
            step(b)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    events = prof.key_averages()
    key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    print(f"== profile of {name}, 3 steps, by {key}", flush=True)
    print(events.table(sort_by=key, row_limit=rows, max_name_column_width=90), flush=True)


# ---- --parallel: variants compiled side by side, timed one at a time -----------------------------------

def worker(kind: str, name: str, seq: int, batch: int, mixed: bool, config: ModernBertConfig, args, conn) -> None:
    """A child process: prepare the variant and run its first step (compilation) while the other
    children of its wave do the same, say "ready", then wait for "go" (the GPU is then this child's
    alone) to warm up and time it, and send the row."""
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        batches = random_batches(2, batch, seq, config.vocab_size, mixed)
        step, dev, model = prepare(kind, name, config, batches, args)
        t0 = time.perf_counter()
        step(dev[0])  # compilation, and the first run
        if args.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # the waiting children hold their weights, not a step's activations
        compile_s = time.perf_counter() - t0
        conn.send(("ready", compile_s))
        conn.recv()  # "go"
        conn.send(("done", measure(kind, name, config, batches, step, dev, args, max(1, args.warmup - 1), compile_s)))
    except Exception as e:  # the parent prints it; the other variants go on
        conn.send(("error", f"{type(e).__name__}: {str(e)[:400]}"))


def run_parallel(jobs: list[tuple], config: ModernBertConfig, args) -> list[tuple[tuple, dict | str]]:
    """Each job (kind, name, seq, batch, mixed) in its own process, in waves of --parallel training
    jobs' worth of memory (an inference job counts a quarter): a wave's children compile at once
    (CPU work), then are timed one after the other with the GPU otherwise idle. -> (job, row or
    error) in the jobs' order."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # CUDA in the children only
    cpus = os.cpu_count() or 1
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, cpus // args.parallel)))
    waves, wave, weight = [], [], 0.0
    for job in jobs:
        w = 1.0 if job[0] == "training" else 0.25
        if wave and weight + w > args.parallel:
            waves.append(wave)
            wave, weight = [], 0.0
        wave.append(job)
        weight += w
    waves += [wave] if wave else []
    results = []
    for i, wave in enumerate(waves):
        print(f"\n-- wave {i + 1}/{len(waves)}: compiling {len(wave)} variants side by side", flush=True)
        children = []
        for job in wave:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker, args=(*job, config, args, child), daemon=True)
            proc.start()
            children.append((job, proc, parent))
        ready = {}
        for job, proc, conn in children:
            ready[job] = receive(conn, proc, args.child_timeout)
        wait_for(args.wait_file, args.child_timeout)
        for job, proc, conn in children:  # timed one at a time
            if ready[job][0] == "ready":
                conn.send("go")
                got = receive(conn, proc, args.child_timeout)
                results.append((job, got[1]))
            else:
                results.append((job, ready[job][1]))
            print_result(job, results[-1][1])
        for job, proc, conn in children:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return results


def wait_for(path: str | None, timeout: float) -> None:
    """Until the file `path` exists (another GPU job, as tests, says it is done), at most `timeout` s."""
    if path and not os.path.exists(path):
        print(f"   (waiting for {path} before timing: the GPU to ourselves)", flush=True)
        deadline = time.monotonic() + timeout
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(1)


def receive(conn, proc, timeout: float) -> tuple[str, object]:
    """A child's next message, or an error if it died or stayed silent past `timeout` seconds."""
    if conn.poll(timeout):
        try:
            return conn.recv()
        except EOFError:
            pass
    else:
        proc.kill()
        return ("error", f"no answer within {timeout:.0f}s")
    return ("error", f"the process ended (exit code {proc.exitcode})")


def shapes(text: str) -> list[tuple[int, int]]:
    return [] if text in ("", "none") else [tuple(map(int, s.split("x"))) for s in text.split(",")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="128x256,512x64,1024x32", help="training SEQxBATCH list (none: no training)")
    p.add_argument("--variants", default="bertkit,hf-eager,hf-compile",
                   help=f"training variants: {', '.join(TRAINING_VARIANTS)}")
    p.add_argument("--inference", default="512x64,8192x4", help="inference SEQxBATCH list (none: no inference)")
    p.add_argument("--inference-variants", default="bertkit,bertkit-unpadded,hf-eager,hf-compile",
                   help=f"inference variants: {', '.join(INFERENCE_VARIANTS)}")
    p.add_argument("--mixed", action="store_true", help="inference rows of lengths T/8 to T (real tokens counted)")
    p.add_argument("--model", default="modernbert-base", help="a ModernBERT preset")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--peak", type=float, default=790e12, help="the device's peak bf16 FLOP/s, for MFU")
    p.add_argument("--parallel", type=int, default=0,
                   help="compile up to N training variants (or 4N inference ones) at once in child processes, "
                        "then time them one at a time (0: one process, one variant after another)")
    p.add_argument("--wait-file", help="with --parallel: time nothing before this file exists (the GPU tests "
                                       "run beside the compilation and create it when done)")
    p.add_argument("--child-timeout", type=float, default=420, help="seconds a --parallel child may take per phase")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="a diagnostic: after each variant (not with --parallel), its N costliest kernels on the GPU")
    p.add_argument("--tiny", action="store_true",
                   help="modernbert-tiny at small shapes, not compiled: checks the script (on a CPU too)")
    args = p.parse_args()
    if args.profile and args.parallel:
        p.error("--profile runs the variants in this process: leave out --parallel")
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    config = ModernBertConfig.from_name("modernbert-tiny" if args.tiny else args.model)
    if args.tiny:  # the window below the lengths, so the sliding layers slide
        config = ModernBertConfig.from_name("modernbert-tiny", local_attention=16)
        args.shapes, args.inference = "64x4", "128x2"
        args.variants, args.inference_variants = "bertkit-eager,hf-eager", "bertkit-unpadded,hf-eager"
    elif args.device != "cuda":
        p.error("this benchmark needs a CUDA GPU (--tiny runs a small check anywhere)")
    torch.backends.cuda.matmul.allow_tf32 = True
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"device: {name}  torch {torch.__version__}  model {'modernbert-tiny' if args.tiny else args.model} "
          f"({config.num_parameters() / 1e6:.1f}M parameters, window {config.local_attention})", flush=True)

    missing = transformers_missing()
    if missing:
        print(f"transformers rows skipped: {missing}", flush=True)
    jobs = []
    for kind, text, variants in (("training", args.shapes, args.variants),
                                 ("inference", args.inference, args.inference_variants)):
        for seq, batch in shapes(text):
            jobs += [(kind, name, seq, batch, args.mixed and kind == "inference") for name in variants.split(",")
                     if not (missing and name.startswith("hf"))]
    if args.parallel:
        results = run_parallel(jobs, config, args)
    else:
        results = []
        for job in jobs:
            kind, name, seq, batch, mixed = job
            if job is jobs[0] or job[2:] != results[-1][0][2:] or kind != results[-1][0][0]:
                print(f"\n== {case_name(job)}", flush=True)
            batches = random_batches(2, batch, seq, config.vocab_size, mixed)
            try:
                results.append((job, run(kind, name, config, batches, args)))
            except Exception as e:  # one failing variant should not hide the others' figures
                results.append((job, f"{type(e).__name__}: {str(e)[:400]}"))
                torch._dynamo.reset()
            print_result(job, results[-1][1])
    rows = [{**r, "case": case_name(job)} for job, r in results if isinstance(r, dict)]
    print_table(rows)
    print_targets(rows)


def transformers_missing() -> str | None:
    """Why transformers' ModernBERT cannot run here, or None."""
    try:
        import transformers
    except ImportError:
        return "transformers is not installed"
    if not hasattr(transformers, "ModernBertForMaskedLM"):
        return f"transformers {transformers.__version__} has no ModernBERT"
    return None


def case_name(job: tuple) -> str:
    kind, _, seq, batch, mixed = job
    return f"{kind} seq {seq}{' mixed' if mixed else ''} batch {batch}"


def print_result(job: tuple, r: dict | str) -> None:
    name = job[1]
    if isinstance(r, str):
        print(f"  {case_name(job):32s} {name:18s} FAILED: {r}", flush=True)
        return
    print(f"  {case_name(job):32s} {name:18s} {r['tokens_per_s'] / 1e3:9.1f}k tok/s  {r['step_ms']:8.1f} ms/step  "
          f"MFU {100 * r['mfu']:5.1f}%  peak {gib(r)} GiB  warm-up {r['warmup_s']:5.1f}s", flush=True)


# the targets (issue 51): training at least 1.5x transformers + torch.compile, inference at least
# 2x the best transformers row; and its anchor, transformers + compile on an H200, tokens/s by sequence length
TARGETS = {"training": 1.5, "inference": 2.0}
ANCHOR = {128: 337.1e3, 512: 300.0e3, 1024: 267.6e3}


def print_targets(rows: list[dict]) -> None:
    """One line per case: the best bert-kit row against the transformers row the target names."""
    print()
    for case in dict.fromkeys(r["case"] for r in rows):
        kind, seq = case.split()[0], int(case.split()[2])
        ours = [r for r in rows if r["case"] == case and not r["variant"].startswith("hf")]
        theirs = [r for r in rows if r["case"] == case and r["variant"].startswith("hf")
                  and (kind == "inference" or r["variant"] == "hf-compile")]
        if not ours or not theirs:
            continue
        best, base = max(ours, key=lambda r: r["tokens_per_s"]), max(theirs, key=lambda r: r["tokens_per_s"])
        ratio = best["tokens_per_s"] / base["tokens_per_s"]
        anchor = f"; the issue's anchor for hf-compile {ANCHOR[seq] / 1e3:.1f}k" if kind == "training" and seq in ANCHOR \
            else ""
        verdict = "met" if ratio >= TARGETS[kind] else "short"
        print(f"target {case}: {best['variant']} {best['tokens_per_s'] / 1e3:.1f}k (MFU {100 * best['mfu']:.1f}%) / "
              f"{base['variant']} {base['tokens_per_s'] / 1e3:.1f}k = {ratio:.2f}x (target {TARGETS[kind]}x: "
              f"{verdict}{anchor})", flush=True)


def print_table(rows: list[dict]) -> None:
    """One Markdown table: every row beside the best transformers row of its case."""
    print("\n| case | variant | tokens/s | ms/step | MFU | peak GiB | vs best transformers |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        hf = [o["tokens_per_s"] for o in rows if o["case"] == r["case"] and o["variant"].startswith("hf")]
        ratio = f"{r['tokens_per_s'] / max(hf):.2f}x" if hf else "-"
        print(f"| {r['case']} | {r['variant']} | {r['tokens_per_s'] / 1e3:.1f}k | {r['step_ms']:.1f} | "
              f"{100 * r['mfu']:.1f}% | {gib(r)} | {ratio} |")


def gib(row: dict) -> str:
    return "-" if row["peak_gib"] is None else f"{row['peak_gib']:.1f}"


if __name__ == "__main__":
    main()
