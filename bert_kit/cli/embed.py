"""`bert-kit embed`: sentence embeddings of a text file (one text per line) to a .npy array.

From launch to exit the work overlaps: a thread imports torch, loads the model and starts CUDA
while the command reads the file and tokenizes it (the Rust tokenizer, on every core), and another
creates the GPU's CUDA context through the driver while torch imports (`start_cuda_driver`). The texts
are tokenized once: the truncation report counts those ids, and the device embeds them
(`SentenceEncoder.encode_tokenized`). `--profile` prints when each phase ran.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import sys
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from bert_kit.cli.errors import check_output_file
from bert_kit.cli.options import (COUNT, MAX_LENGTH, add_device_option, add_model_option, add_table_options,
                                   flag_messages, name_settings_as_flags)
from bert_kit.data.tables import no_garbage_collection, parse_where, read_texts
from bert_kit.data.truncation import find_truncated, report_truncated, token_ids
from bert_kit.model_folder import default_max_length, onnx_metadata, resolve_model, resolve_model_folder
from bert_kit.outputs import write_file
from bert_kit.tokenizer import get_tokenizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    parser.add_argument("--input", required=True, help="text file, one text per line (or a table: --text-column)")
    parser.add_argument("--text-column", default=None, help="TSV/CSV/JSONL input: the text column, name or 0-based index")
    add_table_options(parser, rows="embed only rows with this value")
    parser.add_argument("--output", required=True, help="where to write the (n, hidden) float32 .npy array")
    parser.add_argument("--pooling", choices=("mean", "cls"), default="mean", help="mean of tokens or [CLS] state")
    parser.add_argument("--no-normalize", action="store_true", help="keep raw vectors (default: unit length)")
    parser.add_argument("--max-length", type=MAX_LENGTH, default=None,
                        help="tokens per text, longer ones are truncated (default: the model's own length: its "
                             "fine-tuning or sentence-transformers length, else its positions)")
    parser.add_argument("--batch-size", type=COUNT, default=None,
                        help="at most this many texts a batch (default: as many as --max-tokens-per-batch holds)")
    parser.add_argument("--max-tokens-per-batch", type=COUNT, default=None,
                        help="padded tokens a batch, texts x the longest (default: sized for the device, "
                             "131072 on a GPU, 8192 on the CPU)")
    add_device_option(parser)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                        help="auto: bf16 autocast on a GPU that has it (fp16 on older ones), fp32 on the CPU")
    parser.add_argument("--compile", action="store_true",
                        help="compile the encoder first (a one-off ~10 s; about 2x faster on the CPU after)")
    parser.add_argument("--backend", choices=("auto", "torch", "onnx"), default="auto",
                        help="onnx: ONNX Runtime on the CPU (a folder from bert-kit export, or one exported now); "
                             "auto: onnx for exported folders, else torch")
    parser.add_argument("--profile", action="store_true",
                        help="print when each phase ran (start, read, tokenize, load, encode, save), in seconds "
                             "since launch")
    name_settings_as_flags(parser)


@flag_messages
def run(args: argparse.Namespace) -> int:
    timeline = Timeline(getattr(args, "started", time.time()))
    check_output_file(args.output, "--output", inputs=[args.input])
    if not runs_on_onnx(args.model, args.backend):  # ONNX Runtime runs on the CPU
        start_cuda_driver(args.device)
    loading = in_background(load_encoder, args, timeline)  # torch and the model load while the texts are read
    with timeline("read"):
        texts = read_texts(args.input, args.text_column, args.header, args.delimiter, parse_where(args.where),
                           args.encoding)
    try:
        with timeline("tokenize"), no_garbage_collection():  # a list of ids a text: no cycle to look for
            folder = resolve_model(args.model)  # a run folder's model, or a hub name's local copy
            tokenizer = get_tokenizer(folder)
            max_length = args.max_length or default_max_length(folder)
            ids = token_ids(tokenizer, texts, None, max_length)  # with [CLS]/[SEP], as truncated
        with timeline("count truncated"):
            kept = list(map(len, ids))  # the cut texts fill max_length: only those are tokenized again
            found = find_truncated(tokenizer, texts, None, max_length, kept)
    except Exception:
        loading.result()  # an error of the model or a setting first, as when the model loaded before this
        raise
    with timeline("wait for the model"):
        encoder = loading.result()
    print(f"embedding on {encoder.device} in {encoder.precision}, batches of {encoder.max_tokens_per_batch} tokens",
          flush=True)
    if kept and min(kept) <= tokenizer.num_special[False]:  # a text of no token: blank, or control characters
        from bert_kit.tasks.inference import warn_blank_texts

        warn_blank_texts(texts, args.input, tokenizer=tokenizer)
    report_truncated(found, args.input, encoder.model.config.max_position_embeddings)
    with timeline("encode"):
        t0 = time.perf_counter()
        vectors = encoder.encode_tokenized(ids, batch_size=args.batch_size, show_progress=len(texts) > 2000)
        seconds = time.perf_counter() - t0
    out = Path(args.output)
    with timeline("save"):
        write_file(out, lambda f: np.save(f, vectors), binary=True)  # np.save(path) would append .npy to other names
    print(f"embedded {len(texts)} texts -> {out} {vectors.shape} in {seconds:.2f} s: "
          f"{len(texts) / max(seconds, 1e-9):.0f} sentences/s on {encoder.device} ({encoder.precision})")
    if args.profile:
        timeline.print(sys.stderr)
    return 0


def load_encoder(args: argparse.Namespace, timeline: Timeline) -> Any:
    """The `SentenceEncoder` of the command's settings, CUDA started beside it (in a thread: see
    `run`). Its max_length is the one the command tokenizes with."""
    with timeline("import torch"):
        from bert_kit.checks import resolve_device
        from bert_kit.embeddings import SentenceEncoder
        from bert_kit.onnx_export import onnx_folder
        from bert_kit.training.precision import start_cuda
    with timeline("load the model"):
        start_cuda(resolve_device(args.device))  # the driver and context start while the model loads
        folder = resolve_model(args.model)
        max_length = args.max_length or default_max_length(folder)
        return SentenceEncoder.from_pretrained(onnx_folder(folder, args.backend) or folder, args.pooling,
                                               not args.no_normalize, max_length, args.device,
                                               compile=args.compile, precision=args.precision,
                                               max_tokens_per_batch=args.max_tokens_per_batch)


def start_cuda_driver(device: str | None) -> None:
    """Create the CUDA context of `device` ("auto" and None: the first GPU) through the driver's
    own library, in a thread, while the command's other thread imports torch: the context takes
    a few tenths of a second that would otherwise follow the import. torch then finds the
    primary context made and uses it. Nothing where there is no driver or GPU (an error here is
    left for torch to report), for other devices, or with a torch built without CUDA."""
    device = (device or "auto").strip()
    if not torch_has_cuda():
        return
    if device == "auto":
        index = int(os.environ.get("LOCAL_RANK", "0"))  # `resolve_device`'s choice
    elif device == "cuda" or device.startswith("cuda:"):
        index = int(device.partition(":")[2] or 0)
    else:
        return

    def start() -> None:
        try:
            driver = ctypes.CDLL("libcuda.so.1")
        except OSError:  # no NVIDIA driver (or not Linux)
            return
        handle, context = ctypes.c_int(), ctypes.c_void_p()
        if driver.cuInit(0) == 0 and driver.cuDeviceGet(ctypes.byref(handle), index) == 0:
            driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle)  # held until the process ends

    threading.Thread(target=start, name="cuda-driver", daemon=True).start()


def runs_on_onnx(model: str, backend: str) -> bool:
    """Whether the command will run ONNX Runtime (`--backend onnx`, or an exported folder with
    auto), known without importing torch; a folder that cannot be read is left to the loader."""
    if backend != "auto":
        return backend == "onnx"
    try:
        folder = resolve_model_folder(model)
        return folder is not None and onnx_metadata(folder) is not None
    except Exception:  # noqa: BLE001 (the loader reports it)
        return False


def torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA build, by its files (importing it takes a second)."""
    spec = importlib.util.find_spec("torch")
    folders = spec.submodule_search_locations if spec is not None else None
    return bool(folders) and any(next(Path(folder, "lib").glob("libtorch_cuda.*"), None) for folder in folders)


def in_background(call: Callable[..., Any], *args: Any) -> Future:
    """`call(*args)` in a daemon thread (the process may end without waiting for it: an error in
    the input ends the command at once); `.result()` waits and raises its error in the caller."""
    future: Future = Future()

    def work() -> None:
        try:
            future.set_result(call(*args))
        except BaseException as e:  # noqa: BLE001 (raised again by result(), in the command's thread)
            future.set_exception(e)

    threading.Thread(target=work, name=f"bert-kit {call.__name__}", daemon=True).start()
    return future


class Timeline:
    """When each phase of a command ran, in seconds since the process started (`--profile`);
    phases of several threads may overlap."""

    def __init__(self, started: float):
        self.started = started
        self.phases: list[tuple[str, float, float]] = []

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.time()
        try:
            yield
        finally:
            self.phases.append((name, t0 - self.started, time.time() - self.started))

    def print(self, file: Any = None) -> None:
        first = min((start for _, start, _ in self.phases), default=0.0)
        rows = [("start (interpreter, imports)", 0.0, first)] + sorted(self.phases, key=lambda p: p[1])
        print("phase                          from      to    took  (s since launch)", file=file)
        for name, start, end in rows:
            print(f"{name:28s} {start:7.2f} {end:7.2f} {end - start:7.2f}", file=file)
        print(f"{'done':28s} {'':7s} {time.time() - self.started:7.2f}", file=file, flush=True)
