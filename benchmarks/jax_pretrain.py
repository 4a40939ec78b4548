"""BERT pretraining step throughput in JAX: bert-kit's JAX engine beside bert-kit PyTorch's fastest
path and beside KerasHub's BERT on the JAX backend, on the same GPU, shape and batches.

A step benchmark (a diagnostic): every engine trains the same BERT-base shape (dropout 0.1 in the
hidden states and attention, as BERT) in bf16 with fp32 master weights and AdamW, on the same
random batches in which every row has exactly `--masked` tokens to predict (so fixed prediction
slots hold them all: no engine predicts more or fewer tokens than another). bert-kit's engines
train MLM + NSP; KerasHub's `BertMaskedLM` has no NSP head and trains MLM only (a little less
work for it). Each engine runs in its own process (JAX and torch each want the GPU's memory);
compilation and warm-up are excluded; tokens/s = tokens of the timed steps / their wall time,
measured the way a training loop runs (no host-device sync between the steps). MFU counts the
useful FLOPs of `bert_kit.model.flops_per_token` against 790 TFLOP/s (H100/H200 bf16 dense).

The JAX engine runs twice: `jax`, with the fast path the engine applies (`bert_kit.jax.kernels`:
on a GPU, attention fused with its dropout in a Pallas kernel), and `jax-nokernel`, without the
Pallas kernel (attention with dropout spelled out in XLA, as before it); `--engines jax-scan` adds
one with the encoder's blocks as one `lax.scan` (as the engine fine-tunes short runs: it compiles
sooner, each step is slower), where `jax` calls them in turn, as the engine pretrains. `--blocks` adds a `jax`
run per tile setting of the kernel; `--profile DIR` traces a few steps of each JAX run and prints
where the GPU's time goes (kernels grouped by name), and the torch run's by kernel family.

    python benchmarks/jax_pretrain.py                                  # torch, jax, jax-nokernel, keras on 1 GPU
    python benchmarks/jax_pretrain.py --engines jax --devices 1,2,4    # JAX data-parallel scaling
    python benchmarks/jax_pretrain.py --engines jax --blocks 64,64,32,32 128,64,32,32 --profile /tmp/prof
    python benchmarks/jax_pretrain.py --json results.jsonl

KerasHub needs `pip install keras keras-hub` (no TensorFlow: only the backbone is used); without
it the keras row is skipped. Scaling keeps 256 sequences per device (weak scaling): efficiency =
tokens/s on N / (N x tokens/s on 1).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PEAK = 790e12


def random_batches(n: int, batch: int, seq: int, vocab: int, masked: int, seed: int = 0) -> list[dict]:
    """Random token ids; `masked` positions of every row labelled (-100 elsewhere); sentence B from
    the middle on; random NSP labels. NumPy, the host side of every engine."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(1000, vocab, (batch, seq), dtype=np.int64)
        positions = np.sort(np.argsort(rng.random((batch, seq - 2)), axis=1)[:, :masked] + 1, axis=1)  # not [CLS]/[SEP]
        labels = np.full_like(ids, -100)
        np.put_along_axis(labels, positions, np.take_along_axis(ids, positions, 1), 1)
        types = np.zeros_like(ids)
        types[:, seq // 2:] = 1
        out.append({"input_ids": ids, "token_type_ids": types, "attention_mask": np.ones_like(ids),
                    "labels": labels, "positions": positions, "next_sentence_label": rng.integers(0, 2, batch)})
    return out


def timed(step, batches: list, warmup: int, steps: int, wait) -> tuple[float, float, float]:
    """(seconds of `steps` steps after `warmup` ones, seconds of the warm-up, last loss); `wait`
    blocks until a step's result is computed (called once per phase, not per step)."""
    t0 = time.perf_counter()
    out = None
    for i in range(warmup):
        out = step(batches[i % len(batches)])
    wait(out)
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(steps):
        out = step(batches[(warmup + i) % len(batches)])
    loss = wait(out)
    return time.perf_counter() - t0, warm_s, loss


def run_torch(args: argparse.Namespace, config, batches: list[dict]) -> dict:
    """bert-kit PyTorch's fastest pretraining path (`bertkit-static-cudagraphs-coord` of
    pretrain_throughput.py: compiled whole on static shapes, fixed prediction slots, CUDA graphs,
    coordinate-descent tuning; what `bert-kit pretrain compile=true` runs)."""
    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    from pretrain_throughput import make_bertkit

    from bert_kit.heads import with_prediction_slots

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    model, loss_fn = make_bertkit(config, "default", False, static=True,
                                  options={"triton.cudagraphs": True, "coordinate_descent_tuning": True})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    share = args.masked / args.seq  # exactly the labelled positions: no spare slot
    dev = []
    for b in batches:
        t = {k: torch.from_numpy(v) for k, v in b.items() if k != "positions"}
        t["attention_mask"] = None  # no padding: as pretrain_throughput's random batches
        t = with_prediction_slots(t, share=share, multiple=1)
        dev.append({k: v.cuda() if v is not None else None for k, v in t.items()})

    def step(b):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(b)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def wait(loss):
        torch.cuda.synchronize()
        return float(loss)

    seconds, warm_s, loss = timed(step, dev, args.warmup, args.steps, wait)
    if args.profile:
        from pretrain_throughput import print_profile
        print_profile(step, dev)
    return {"device": torch.cuda.get_device_name(), "framework": f"torch {torch.__version__}",
            "seconds": seconds, "warmup_s": warm_s, "loss": loss, "devices": 1}


def run_jax(args: argparse.Namespace, config, batches: list[dict], n_devices: int) -> dict:
    """bert-kit's JAX engine: `bert_kit.jax` BERTForPreTraining and its jitted, donated, data-parallel step."""
    import jax
    from flax import nnx

    import jax.numpy as jnp

    from bert_kit.jax.kernels import fast_path
    from bert_kit.jax.kernels.flash_attention import Blocks
    from bert_kit.jax.model import BERTForPreTraining
    from bert_kit.jax.train import create_optimizer, init_train_state, make_mesh, make_train_step, shard_batch

    devices = jax.devices()[:n_devices]
    if len(devices) < n_devices:
        raise SystemExit(f"asked for {n_devices} devices, JAX sees {len(jax.devices())}")
    mesh = make_mesh(devices)
    model = BERTForPreTraining(config, rngs=nnx.Rngs(0))
    model.bert.encoder.scan = args.layers == "scan"  # as the engine pretrains: the blocks called in turn
    blocks = Blocks(*map(int, args.block.split(","))) if args.block else Blocks()
    fast = fast_path.apply(model, dtype=jnp.bfloat16, kernel=args.kernel, blocks=blocks, mesh=mesh)
    tx = create_optimizer(1e-4, weight_decay=0.01)
    graphdef, state = init_train_state(model, tx, mesh, prng=args.prng)
    step_fn = make_train_step(graphdef, tx, mesh, precision="bf16")
    dev = []
    for b in batches:
        dev.append(shard_batch({"input_ids": b["input_ids"].astype(np.int32),
                                "token_type_ids": b["token_type_ids"].astype(np.int32),
                                "attention_mask": b["attention_mask"].astype(np.int32),
                                "masked_positions": b["positions"].astype(np.int32),
                                "masked_labels": np.take_along_axis(b["labels"], b["positions"], 1).astype(np.int32),
                                "next_sentence_label": b["next_sentence_label"].astype(np.int32)}, mesh))
    holder = {"state": state}

    def step(b):
        holder["state"], metrics = step_fn(holder["state"], b)
        return metrics["loss"]

    def wait(loss):
        return float(jax.block_until_ready(loss))

    seconds, warm_s, loss = timed(step, dev, args.warmup, args.steps, wait)
    if args.profile:
        profile(step, dev, wait, args.profile / f"jax-{args.kernel}-{args.block or 'default'}-{args.prng}-x{n_devices}")
    return {"device": devices[0].device_kind, "framework": f"jax {jax.__version__}", "seconds": seconds,
            "warmup_s": warm_s, "loss": loss, "devices": n_devices, "prng": args.prng,
            "fast_path": fast.summary, "blocks": args.block or ""}


def profile(step, batches: list, wait, folder: Path, steps: int = 5, top: int = 40) -> None:
    """Trace `steps` steps into `folder` (TensorBoard/XProf reads it) and print the GPU's time by
    kernel, names grouped without their numeric suffixes (`loop_add_fusion.3` -> `loop_add_fusion`)."""
    import jax
    from jax_step_profile import kernel_times

    with jax.profiler.trace(str(folder)):
        out = None
        for i in range(steps):
            out = step(batches[i % len(batches)])
        wait(out)
    total, kernels = kernel_times(folder, steps, grouped=True)
    print(f"profile ({folder}): {total:.1f} ms of GPU kernels per step", file=sys.stderr)
    for name, (ms, _) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {ms:8.2f} ms  {100 * ms / max(total, 1e-9):5.1f}%  {name[:110]}", file=sys.stderr)


def run_keras(args: argparse.Namespace, config, batches: list[dict]) -> dict:
    """KerasHub's `BertMaskedLM` on the JAX backend, bf16 mixed precision, AdamW, compiled with XLA:
    trained with `fit`, as its documentation shows, the first epoch (compilation) untimed."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    if args.keras_path:  # after site-packages: packages installed here win, the folder fills the gaps
        sys.path.append(str(args.keras_path))
    import jax
    import keras
    import keras_hub

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    flash = hasattr(keras.config, "enable_flash_attention")
    if flash:  # the fused attention kernel where Keras can use it (as bert-kit uses cuDNN's)
        keras.config.enable_flash_attention()
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size, num_layers=config.num_hidden_layers, num_heads=config.num_attention_heads,
        hidden_dim=config.hidden_size, intermediate_dim=config.intermediate_size,
        dropout=config.hidden_dropout_prob, max_sequence_length=config.max_position_embeddings,
        num_segments=config.type_vocab_size)
    model = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    x = {"token_ids": np.concatenate([b["input_ids"] for b in batches]).astype(np.int32),
         "segment_ids": np.concatenate([b["token_type_ids"] for b in batches]).astype(np.int32),
         "padding_mask": np.concatenate([b["attention_mask"] for b in batches]).astype(bool),
         "mask_positions": np.concatenate([b["positions"] for b in batches]).astype(np.int32)}
    y = np.concatenate([np.take_along_axis(b["labels"], b["positions"], 1) for b in batches]).astype(np.int32)
    per_epoch = len(batches)
    epochs = max(1, -(-args.steps // per_epoch))
    times: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            times.append(time.perf_counter())

    t0 = time.perf_counter()
    # keras.Model.fit: KerasHub's own fit wraps arrays in a grain or TensorFlow dataset for its
    # preprocessor, which this model (preprocessor=None) does not have; Keras's reads the arrays
    history = keras.Model.fit(model, x, y, batch_size=args.batch, epochs=1 + epochs, shuffle=False, verbose=0,
                              callbacks=[Clock()])
    end = time.perf_counter()
    return {"device": jax.devices()[0].device_kind, "framework": f"keras {keras.__version__}, keras-hub "
            f"{keras_hub.__version__}, jax {jax.__version__}, flash attention {'on' if flash else 'n/a'}",
            "seconds": end - times[1], "warmup_s": times[1] - t0, "loss": float(history.history["loss"][-1]),
            "devices": 1, "timed_steps": epochs * per_epoch}


def worker(args: argparse.Namespace) -> None:
    """One engine in this process; prints one JSON line."""
    from bert_kit.config import create_model_config
    from bert_kit.model import estimate_mfu

    config = create_model_config(args.model)
    if args.attention_dropout is not None:  # diagnostic: what attention dropout costs an engine
        config.attention_probs_dropout_prob = args.attention_dropout
    n = args.devices_one
    batches = random_batches(4, args.batch * n, args.seq, config.vocab_size, args.masked)
    if args.worker == "torch":
        row = run_torch(args, config, batches)
    elif args.worker == "jax":
        row = run_jax(args, config, batches, n)
        row["kernel"] = args.kernel
    else:
        row = run_keras(args, config, batches)
    steps = row.pop("timed_steps", args.steps)
    tokens = steps * args.batch * n * args.seq
    tps = tokens / row["seconds"]
    name = args.worker if args.worker != "jax" else {"none": "jax-nokernel"}.get(args.kernel, "jax")
    name += "-scan" if args.worker == "jax" and args.layers == "scan" else ""
    row.update(engine=name, model=args.model, seq=args.seq, batch=args.batch * n, masked_per_row=args.masked,
               steps=steps, tokens_per_s=tps, step_ms=1e3 * row["seconds"] / steps,
               mfu=estimate_mfu(config, args.seq, tps, PEAK * n, masked_fraction=args.masked / args.seq))
    print("RESULT " + json.dumps(row), flush=True)


def label(row: dict) -> str:
    """A run's name in the table: engine, devices, and for JAX the kernel's tiles and the PRNG."""
    extra = f" {row['blocks']}" if row.get("blocks") else ""
    extra += f" {row['prng']}" if row.get("prng") not in (None, "threefry2x32") else ""
    return f"{row['engine']} x{row['devices']}{extra}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="torch,jax,jax-nokernel,keras",
                   help="torch, jax (the engine's fast path), jax-nokernel (no Pallas kernel), jax-scan (the "
                        "encoder's blocks as one lax.scan, as the engine fine-tunes) and/or keras")
    p.add_argument("--devices", default="1", help="GPU counts for the jax engines, e.g. 1,2,4 (others run on 1)")
    p.add_argument("--model", default="bert-base-uncased (110M)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=256, help="sequences per step per device")
    p.add_argument("--masked", type=int, default=20, help="tokens to predict per row (20 of 128: 15.6%%)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--json", type=Path, help="append the rows as JSON lines")
    p.add_argument("--attention-dropout", type=float, default=None,
                   help="diagnostic: every engine's attention dropout (default: the model's, 0.1)")
    p.add_argument("--keras-path", type=Path, help="a folder holding keras and keras-hub (pip install --target)")
    p.add_argument("--prng", default="threefry2x32", help="diagnostic: the jax engine's dropout PRNGs, e.g. "
                                                          "threefry2x32,rbg (default: JAX's, as the engine)")
    p.add_argument("--blocks", nargs="*", default=[],
                   help="more jax runs, one per Pallas tile setting q,k,outer,inner (e.g. 64,64,32,32 128,64,64,32)")
    p.add_argument("--profile", type=Path, help="trace 5 steps of each JAX run into this folder and print the GPU "
                                                "time by kernel (torch's: its profiler's table)")
    p.add_argument("--worker", choices=("torch", "jax", "keras"), help=argparse.SUPPRESS)
    p.add_argument("--kernel", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--block", default="", help=argparse.SUPPRESS)
    p.add_argument("--layers", default="loop", help=argparse.SUPPRESS)
    p.add_argument("--devices-one", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    rows = []
    runs = []  # (worker, devices, prng, kernel, blocks)
    for e in args.engines.split(","):
        if e == "keras" and not (args.keras_path or importlib.util.find_spec("keras_hub")):
            print("keras  skipped: keras-hub is not installed (pip install keras keras-hub, or --keras-path)")
            continue
        if e in ("jax", "jax-nokernel", "jax-scan"):
            tiles = [""] + (args.blocks if e == "jax" else [])
            layers = "scan" if e == "jax-scan" else "loop"
            runs += [("jax", n, prng, "none" if e == "jax-nokernel" else "auto", b, layers)
                     for prng in args.prng.split(",") for n in map(int, args.devices.split(",")) for b in tiles]
        else:
            runs.append((e, 1, "threefry2x32", "auto", "", "loop"))
    for engine, n, prng, kernel, block, layers in runs:
        argv = [sys.executable, __file__, "--worker", engine, "--devices-one", str(n), "--model", args.model,
                "--prng", prng, "--kernel", kernel, "--block", block, "--layers", layers,
                "--seq", str(args.seq), "--batch", str(args.batch), "--masked", str(args.masked),
                "--warmup", str(args.warmup), "--steps", str(args.steps)]
        argv += ["--keras-path", str(args.keras_path)] if args.keras_path else []
        argv += ["--attention-dropout", str(args.attention_dropout)] if args.attention_dropout is not None else []
        argv += ["--profile", str(args.profile)] if args.profile and engine in ("jax", "torch") else []
        env = {**os.environ, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9", "KERAS_BACKEND": "jax"}
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=None if args.profile else subprocess.PIPE,
                              text=True, env=env)
        found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if args.profile and engine == "torch":  # its profile table (the JAX workers print theirs to stderr)
            print("\n".join(line for line in proc.stdout.splitlines() if not line.startswith("RESULT ")), flush=True)
        if proc.returncode or not found:
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-12:]
            print(f"{engine} x{n} {prng} {kernel} {block}: FAILED (exit {proc.returncode})\n  " + "\n  ".join(tail),
                  flush=True)
            continue
        row = json.loads(found[-1][7:])
        rows.append(row)
        what = f"fast path: {row['fast_path']}; " if row.get("fast_path") else ""
        print(f"{label(row):24s} {row['tokens_per_s'] / 1e3:8.1f}k tok/s  {row['step_ms']:7.1f} ms/step  "
              f"MFU {100 * row['mfu']:5.1f}%  warm-up {row['warmup_s']:5.1f}s  loss {row['loss']:.3f}  "
              f"[{what}{row['device']}; {row['framework']}]", flush=True)
    one = {r["engine"]: r for r in rows if r["devices"] == 1 and not r["engine"].startswith("jax")}
    for r in rows:
        if not r["engine"].startswith("jax") or r["devices"] != 1:
            continue
        for other, name in (("torch", "bert-kit PyTorch"), ("keras", "KerasHub (JAX)")):
            if other in one:
                print(f"{label(r)} / {name}: {r['tokens_per_s'] / one[other]['tokens_per_s']:.2f}x")
    for r in rows:
        base = next((b for b in rows if b["engine"] == r["engine"] and b["devices"] == 1
                     and b.get("prng") == r.get("prng") and b.get("blocks") == r.get("blocks")), None)
        if r["engine"].startswith("jax") and r["devices"] > 1 and base is not None:
            eff = r["tokens_per_s"] / (r["devices"] * base["tokens_per_s"])
            print(f"{label(r)}: {r['tokens_per_s'] / 1e3:.1f}k tok/s, scaling efficiency {100 * eff:.1f}%")
    if args.json:
        with args.json.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
