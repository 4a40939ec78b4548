"""Export a model folder to ONNX for CPU inference: every head, fused for ONNX Runtime, optionally int8.

    export_onnx("runs/finetune_sst2/best", "sst2-onnx")                  # fp32 graph
    export_onnx("models/all-MiniLM-L6-v2", "minilm-int8", quantize="int8")
    OnnxModel("sst2-onnx")(input_ids, attention_mask, token_type_ids)   # -> logits (B, C), as PyTorch

What goes into the output folder, so that it alone serves inference:
- model.onnx: the head the folder holds (config.json "architectures": encoder, sequence
  classification / regression, token classification, QA start/end logits, MLM, MLM + NSP), with
  dynamic batch and sequence axes. Inputs input_ids, attention_mask, token_type_ids (B, T) int64;
  outputs named as HF's (last_hidden_state, logits, start_logits, end_logits, prediction_logits,
  seq_relationship_logits). The encoder's graph also outputs `sentence_embedding` (B, H): the
  model's pooling (mean or [CLS], from its metadata) and L2 normalisation, as `SentenceEncoder`;
  a head's graph also outputs its encoder's `last_hidden_state`, so every exported folder embeds;
- config.json (the source's, plus a `bert_kit.onnx` entry describing the graph), the tokenizer files,
  and the record of what the export wrote (`.bert-kit-files.json`, bert_kit/outputs.py).

The folder is built aside (a hidden temporary folder beside the output), checked, then moved in;
SIGTERM or SIGINT mid-export, or any failure, removes the temporary folder. An output folder of an
earlier export gets its recorded files replaced; a folder holding anything else, or the model
being exported, is refused before any work.

How the graph is made and made fast on CPUs:
1. the padded forward is traced (TorchScript exporter: reliable dynamic axes, about a second for
   MiniLM) with each attention layer written as HF writes it (separate Q/K/V matmuls, additive
   mask); the numbers are the same as the SDPA path of `model.py`, within float rounding. The
   graph holds standard ONNX ops only; ONNX Runtime fuses LayerNorm, GELU and the matmul biases
   itself when it loads it;
2. `fuse=True` (`--fuse`) also runs `onnxruntime.transformers.optimizer`, which fuses each layer's
   attention into one `Attention` op (the HF spelling above is the pattern it recognises), the
   residual add + LayerNorm into `SkipLayerNormalization` and bias + GELU into `BiasGelu`. The
   graph then needs ONNX Runtime, and on 2 cores with short texts (STS-B, 11 tokens on average)
   its fp32 graph was slower: 810 against 875 sentences/s for MiniLM; so fp32 exports leave it
   off by default (it may pay off for long sequences);
3. `quantize="int8"`: the fusions of 2, then dynamic quantisation of what holds the weights: every
   matmul and fused attention (int8 weights, one scale per output channel; activations quantised
   per batch at run time, no calibration data) and the embedding tables' lookups (`Gather`, one
   scale per table), so the word embeddings, half of MiniLM's weights, are stored in 8 bits
   too (all-MiniLM-L6-v2: a 23 MB folder, against 91 MB fp32). ONNX Runtime runs the matmuls
   with integer kernels (AVX-512 VNNI where the CPU has it). The export prints how far the int8
   graph is from the fp32 model on a few built-in sentences (`INT8_CHECK_SENTENCES`).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.checks import ConfigError
from bert_kit.embeddings import POOLING_MODES, pool
from bert_kit.families import is_encoder, load_model
from bert_kit.model import MultiHeadAttention
from bert_kit.model_folder import (read_model_metadata, resolve_model, resolve_model_folder,
                                   sentence_transformers_settings)
from bert_kit.modernbert import ModernBertAttention
from bert_kit.onnx_runtime import (CALL_OUTPUTS, INPUT_NAMES, ONNX_FILE, OnnxModel, is_onnx_folder,
                                   require_onnxruntime, role)
from bert_kit.outputs import OutputFolder, StopSignals, entries, write_record

QUANTIZE_CHOICES = ("int8",)
OPSET = 17  # LayerNormalization is a standard op from 17 on
MIN_OPSET = 9  # the graph's position ids need Range (torch.arange), an op from opset 9 on
WRITTEN_BY = "bert-kit export"
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
PER_SEQUENCE_OUTPUTS = ("sentence_embedding", "seq_relationship_logits")  # (B, ...), never (B, T, ...)
FP32_TOLERANCE = 1e-3  # an fp32 export further than this from PyTorch is a bug: the export fails
# real sentences of varied lengths on which an int8 graph is compared with the fp32 model
INT8_CHECK_SENTENCES = (
    "A man is playing a guitar.",
    "A woman is slicing an onion.",
    "The cat sat quietly on the warm windowsill.",
    "Stocks fell sharply after the central bank raised interest rates again.",
    "it's a charming and often affecting journey.",
    "the movie is a tedious, overlong mess with no redeeming qualities whatsoever.",
    "Three children are running through a field of tall yellow flowers near the river.",
    "How do I reset my password if I no longer have access to the email address on my account?",
    "The committee will publish its final report, including all dissenting opinions, before the end of "
    "the year, officials said on Tuesday.",
    "Rain.",
    "Paris is the capital and most populous city of France.",
    "He didn't like the food, but the service was excellent and the staff were friendly.",
    "A small dog is chasing a red ball across the kitchen floor while two people watch.",
    "Protein folding remains one of the central unsolved problems of computational biology.",
    "I love it!",
    "The train to Edinburgh was delayed by forty minutes because of a signal failure near York.",
)


class ExportAttention(nn.Module):
    """`MultiHeadAttention` spelled as HF's BERT attention, which ONNX Runtime's fusion recognises.

    Same weights (the fused QKV projection split into three) and the same result as the SDPA
    path: softmax(q k^T / sqrt(hd) + mask) v, with padding keys masked by adding the most
    negative float32 (exp gives exactly 0, as SDPA's boolean mask).
    """

    def __init__(self, attention: MultiHeadAttention):
        super().__init__()
        hidden = attention.qkv.in_features
        self.num_heads, self.head_dim = attention.num_heads, attention.head_dim
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        with torch.no_grad():
            for linear, w, b in zip((self.query, self.key, self.value), attention.qkv.weight.chunk(3),
                                    attention.qkv.bias.chunk(3)):
                linear.weight.copy_(w)
                linear.bias.copy_(b)
        self.out = attention.out

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, packed: Any = None) -> torch.Tensor:
        """x (B, T, H), mask (B, 1, 1, T) bool (True = attend) -> (B, T, H)."""
        B, T, H = x.shape
        q = self.query(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = self.key(x).view(B, T, self.num_heads, self.head_dim).permute(0, 2, 3, 1)  # (B, nh, hd, T)
        v = self.value(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        scores = torch.matmul(q, k) / math.sqrt(self.head_dim)  # (B, nh, T, T)
        if mask is not None:
            scores = scores + (1.0 - mask.to(scores.dtype)) * torch.finfo(scores.dtype).min
        y = torch.matmul(scores.softmax(dim=-1), v)  # (B, nh, T, hd)
        return self.out(y.transpose(1, 2).reshape(B, T, H))


def export_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, packed: Any,
                     window: int | None, dropout_p: float = 0.0) -> torch.Tensor:
    """ModernBERT's `attend` as matmuls and a softmax, for the traced graph: q, k, v (B, nh, T, hd) and
    the padded forward's bool mask (its window included) -> (B, nh, T, hd). Hidden keys get the most
    negative float32 added, as `ExportAttention`."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
    if mask is not None:
        scores = scores + (1.0 - mask.to(scores.dtype)) * torch.finfo(scores.dtype).min
    return torch.matmul(scores.softmax(dim=-1), v)


class ExportGraph(nn.Module):
    """The traced module: the model with export attention, plus the pooled sentence embedding
    for the bare encoder. Takes (input_ids, attention_mask, token_type_ids), each (B, T)."""

    def __init__(self, model: nn.Module, pooling: str | None = None):
        super().__init__()
        self.model = copy.deepcopy(model).eval()  # the caller's model keeps its fast attention
        for layer in self.model.modules():
            if hasattr(layer, "attention") and isinstance(layer.attention, MultiHeadAttention):
                layer.attention = ExportAttention(layer.attention)
            elif isinstance(layer, ModernBertAttention):
                layer.attend = export_attention
        self.pooling = pooling
        self.eval()  # dropout off; torch.onnx.export restores this mode after tracing

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> Any:
        if not is_encoder(self.model):  # a head: its encoder's states too, for sentence embeddings
            states: list[torch.Tensor] = []
            hook = self.model.bert.register_forward_hook(lambda module, args, out: states.append(out))
            try:
                out = self.model(input_ids, attention_mask, token_type_ids)
            finally:
                hook.remove()
            return (*(out if isinstance(out, tuple) else (out,)), states[0])
        out = self.model(input_ids, attention_mask, token_type_ids)
        if self.pooling is None:
            return out
        return out, F.normalize(pool(out, attention_mask, self.pooling), dim=-1)  # (B, T, H), (B, H)


@dataclass
class ExportReport:
    """What `export_onnx` wrote and how far the graph is from the PyTorch model."""

    folder: Path
    architecture: str
    precision: str
    outputs: list[str]
    fused: dict[str, int] = field(default_factory=dict)  # fused op -> count
    max_abs_diff: dict[str, float] = field(default_factory=dict)  # output -> max |ONNX - PyTorch|
    # int8 only: output -> how far it is from the fp32 model on INT8_CHECK_SENTENCES (`int8_agreement`)
    int8_check: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0

    def folder_bytes(self) -> int:
        """The exported folder's size: the graph, config.json and the tokenizer files."""
        return sum(f.stat().st_size for f in self.folder.iterdir() if f.is_file())

    def summary(self) -> str:
        graph_mb, folder_mb = (self.folder / ONNX_FILE).stat().st_size / 1e6, self.folder_bytes() / 1e6
        fused = ", ".join(f"{n} {op}" for op, n in self.fused.items()) or "none"
        diffs = ", ".join(f"{k} {v:.1e}" for k, v in self.max_abs_diff.items())
        lines = [f"exported {self.architecture} ({self.precision}) -> {self.folder / ONNX_FILE} in {self.seconds:.1f}s",
                 f"  size: {folder_mb:.1f} MB folder ({ONNX_FILE} {graph_mb:.1f} MB)",
                 f"  outputs: {', '.join(self.outputs)}", f"  fused: {fused}",
                 f"  max |ONNX - PyTorch| on a test batch: {diffs}"]
        if self.int8_check:
            parts = []
            for name, m in self.int8_check.items():
                part = f"{name} max |diff| {m['max_abs_diff']:.1e}"
                if "cosine_mean" in m:
                    part += f", cosine mean {m['cosine_mean']:.4f} (min {m['cosine_min']:.4f})"
                if "same_argmax" in m:
                    part += f", same argmax {100 * m['same_argmax']:.1f}%"
                if "same_labels" in m:
                    part += f", same label decisions {100 * m['same_labels']:.1f}%"
                parts.append(part)
            lines.append(f"  int8 against fp32 on {len(INT8_CHECK_SENTENCES)} built-in sentences: " + "; ".join(parts))
        return "\n".join(lines)


def load_for_export(folder: Path) -> tuple[nn.Module, str]:
    """The model of the role the folder's config.json names, with its weights: (model, architecture)."""
    config = json.loads((folder / "config.json").read_text())
    names = config.get("architectures") or ["BertModel"]
    architecture = names[0]
    part = role(architecture)
    if part not in CALL_OUTPUTS:
        raise ValueError(f"{folder}/config.json: architecture {architecture!r} cannot be exported; expected an "
                         f"encoder or one of its heads ({', '.join('Bert' + r for r in CALL_OUTPUTS)}, or another "
                         "family's)")
    try:  # strict for heads: a head missing from the weights would be exported as random numbers
        return load_model(part, folder, strict=part != "Model").eval(), architecture
    except (KeyError, ValueError) as e:
        raise ValueError(f"{folder}: the weights do not match {architecture}: {e}") from None


def encoder_pooling(folder: Path) -> str:
    """The pooling an embedding model uses: its bert-kit metadata, its sentence-transformers files, or mean."""
    mode = read_model_metadata(folder).get("pooling") or sentence_transformers_settings(folder).get("pooling") or "mean"
    if mode not in POOLING_MODES:
        raise ValueError(f"{folder}: pooling {mode!r} is not one of {POOLING_MODES}")
    return mode


def sample_inputs(config: Any, batch: int = 3, seqlen: int = 12, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random (B, T) ids with [CLS]-like first tokens, padding in all but the first row, two segments."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(min(100, config.vocab_size - 1), config.vocab_size, (batch, seqlen), generator=g)
    lengths = torch.linspace(seqlen, 3, batch).long()
    attention_mask = (torch.arange(seqlen)[None, :] < lengths[:, None]).long()
    input_ids = input_ids * attention_mask  # id 0 at padding
    token_type_ids = ((torch.arange(seqlen)[None, :] >= lengths[:, None] // 2).long() * attention_mask
                      if getattr(config, "type_vocab_size", 0) > 1 else torch.zeros_like(input_ids))
    return input_ids, attention_mask, token_type_ids


def trace_to_onnx(graph: ExportGraph, inputs: tuple[torch.Tensor, ...], architecture: str, outputs: list[str],
                  path: Path, opset: int = OPSET) -> None:
    """torch.onnx.export of the padded forward with dynamic batch and sequence axes."""
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    for name in outputs:  # per-token outputs (B, T, ...) keep the sequence axis, (B, C) ones do not
        per_sequence = name in PER_SEQUENCE_OUTPUTS or (name == "logits" and role(architecture) ==
                                                         "ForSequenceClassification")
        axes[name] = {0: "batch"} if per_sequence else {0: "batch", 1: "sequence"}
    with warnings.catch_warnings(), torch.no_grad():
        # the tracer warns about Python values (shape checks in check_inputs): none reach the graph
        warnings.simplefilter("ignore")
        torch.onnx.export(graph, inputs, str(path), input_names=list(INPUT_NAMES), output_names=outputs,
                          dynamic_axes=axes, opset_version=opset, do_constant_folding=True, dynamo=False)


def fuse_for_cpu(src: Path, dst: Path, config: Any) -> dict[str, int]:
    """ONNX Runtime's BERT fusions (Attention, SkipLayerNormalization, BiasGelu); the fused op counts."""
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(str(src), model_type="bert", num_heads=config.num_attention_heads,
                               hidden_size=config.hidden_size, opt_level=0)
    optimized.save_model_to_file(str(dst))
    return {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}


def quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantisation of a fused graph: int8 weights for every matmul with a constant
    weight and every fused attention; uint8 activations with a scale computed per batch at run
    time; the embedding tables (word, position, token type) stored in uint8 with one scale per
    table, dequantised after the lookup.

    Weights get one scale per output channel: on all-MiniLM-L6-v2 and STS-B test that keeps each
    sentence vector at cosine 0.992 (mean) of its fp32 twin, against 0.958 with one scale per
    matrix. Weights use 7 bits of the 8 (`reduce_range`): without VNNI, x86 CPUs multiply uint8 by
    int8 with an instruction whose 16-bit sums can saturate, which ONNX Runtime's documentation
    names as the int8 accuracy loss on AVX2 and AVX-512 CPUs; on an AVX2 CPU the 7-bit weights ran
    as fast and moved the SST-2 classifier of benchmarks/onnx_accuracy.py from 0.46 to 0.11 points
    below fp32 (STS-B test Spearman 82.04 against 81.96; fp32 82.03). The word embeddings (11.7M
    of MiniLM's 22.7M weights) in uint8 cost nothing measurable (81.78 without them)."""
    import logging

    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # shape inference stops at the fused (com.microsoft) ops; every tensor quantised here is float32
    options = {"MatMulConstBOnly": True, "DefaultTensorType": TensorProto.FLOAT}
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # quantize_dynamic suggests a pre-processing step meant for static quantisation
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul", "Attention", "Gather"], per_channel=True,
                         reduce_range=True, extra_options=options)
    finally:
        root.setLevel(level)


def write_folder_files(source: Path, out: Path, onnx_meta: dict[str, Any], extra_meta: dict[str, Any]) -> None:
    """config.json (the source's plus `bert_kit.onnx`) and the tokenizer files, next to the graph."""
    config = json.loads((source / "config.json").read_text())
    config["bert_kit"] = {**(config.get("bert_kit") or {}), **extra_meta, "onnx": onnx_meta}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not {"tokenizer.json", "vocab.txt"} & set(copied):
        raise FileNotFoundError(f"{source} has no tokenizer.json or vocab.txt: the exported folder needs its tokenizer")
    for name in copied:
        shutil.copy2(source / name, out / name)


def compare_outputs(model: nn.Module, graph: ExportGraph, session: OnnxModel, names: list[str],
                    inputs: tuple[torch.Tensor, ...]) -> dict[str, float]:
    """Max |ONNX - PyTorch| per output, over real (non-padding) positions for per-token outputs."""
    with torch.no_grad():
        expected = graph(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = session.run(*inputs, outputs=names)
    mask = inputs[1].bool()
    diffs = {}
    for name, want, have in zip(names, expected, got):
        have = torch.from_numpy(have)
        if want.dim() >= 2 and want.shape[:2] == mask.shape:  # (B, T, ...): skip padding rows
            want, have = want[mask], have[mask]
        diffs[name] = float((want.float() - have).abs().max())
    return diffs


def int8_agreement(model: nn.Module, graph: ExportGraph, session: OnnxModel, names: list[str],
                   source: Path) -> dict[str, dict[str, float]]:
    """How far an int8 graph is from the fp32 model on INT8_CHECK_SENTENCES, per output: max
    |difference| over real positions; for vectors (embeddings, states) the cosine of each to its
    fp32 twin (mean, min); for logits how often their argmax agrees (labels, tokens, answer spans), and
    for a multi-label head how often each label's decision at its threshold does."""
    from bert_kit.tokenizer import get_tokenizer

    meta = read_model_metadata(source)
    thresholds = meta.get("thresholds") if meta.get("problem_type") == "multi_label_classification" else None
    enc = get_tokenizer(source)(list(INT8_CHECK_SENTENCES), max_length=model.config.max_length)
    inputs = tuple(enc[k] for k in INPUT_NAMES)  # one sentence each: token types all 0
    with torch.no_grad():
        expected = graph(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    mask = inputs[1].bool()
    check = {}
    for name, want, have in zip(names, expected, session.run(*inputs, outputs=names)):
        want, have = want.float(), torch.from_numpy(have)
        if want.shape == mask.shape:  # (B, T) per-position logits (QA): padding can never be the argmax
            want, have = (t.masked_fill(~mask, float("-inf")) for t in (want, have))
            m = {"max_abs_diff": float((want - have)[mask].abs().max())}
        else:
            if want.dim() >= 2 and want.shape[:2] == mask.shape:  # (B, T, ...): real positions only
                want, have = want[mask], have[mask]
            m = {"max_abs_diff": float((want - have).abs().max())}
        if name.endswith("logits"):
            m["same_argmax"] = float((want.argmax(-1) == have.argmax(-1)).float().mean())
            if thresholds is not None:  # several labels per text: each label's decision at its threshold
                cut = torch.tensor(thresholds)
                m["same_labels"] = float((want.sigmoid() >= cut).eq(have.sigmoid() >= cut).float().mean())
        else:
            cosine = F.cosine_similarity(want, have, dim=-1)
            m.update(cosine_mean=float(cosine.mean()), cosine_min=float(cosine.min()))
        check[name] = m
    return check


def max_opset() -> int:
    """The newest opset this torch's ONNX exporter writes."""
    try:
        from torch.onnx import _constants

        return int(_constants.ONNX_MAX_OPSET)
    except (ImportError, AttributeError):
        return OPSET


def check_opset(opset: Any) -> int:
    """The opset, if torch.onnx can export this graph at it; else a one-line ConfigError."""
    top = max_opset()
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= top:
        raise ConfigError(f"opset {opset!r} is out of range: expected an integer in [{MIN_OPSET}, {top}] (torch "
                          f"{torch.__version__.split('+')[0]} exports opsets up to {top}; the graph needs {MIN_OPSET} "
                          f"or later; default {OPSET})")
    return opset


def prepare_output(output: Path, source: Path) -> OutputFolder:
    """The output folder, checked before any work: not the model folder nor a folder holding it,
    and new, empty, or holding only what an earlier export recorded (for an export from before
    records, the files an export writes)."""
    if output.resolve() == source.resolve():
        raise ConfigError(f"--output {output} is the model folder itself; choose a new folder")
    if source.resolve().is_relative_to(output.resolve()):
        raise ConfigError(f"--output {output} holds the model folder being exported ({source}): an export replaces "
                          "its output folder's contents; choose a folder outside it")
    legacy = (ONNX_FILE, "config.json", *TOKENIZER_FILES) if output.is_dir() and is_onnx_folder(output) else ()
    return OutputFolder(output, "--output", WRITTEN_BY, legacy)


def install(final: Path, folder: OutputFolder) -> None:
    """Move the finished export into its output folder: the whole folder when it is new (one
    rename), else file by file over what the earlier export recorded."""
    names = entries(final)
    output = folder.path
    if not os.path.lexists(output):
        write_record(final, names, WRITTEN_BY)
        final.replace(output)
        return
    folder.prepare()
    for name in names:
        os.replace(final / name, output / name)
    folder.commit(names)


@contextlib.contextmanager
def library_output_held():
    """Hold what the libraries print (torch.onnx prints the whole graph, hundreds of lines, on some
    errors; ONNX Runtime logs to the file descriptors): shown after the block when it succeeds,
    dropped when it fails, where the one-line error says what went wrong."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    held = tempfile.TemporaryFile()
    python_out, python_err = io.StringIO(), io.StringIO()
    ok = False
    try:
        for fd in saved:
            os.dup2(held.fileno(), fd)
        with contextlib.redirect_stdout(python_out), contextlib.redirect_stderr(python_err):
            yield
        ok = True
    finally:
        for fd, copy_of in saved.items():
            os.dup2(copy_of, fd)
            os.close(copy_of)
        if ok:
            held.seek(0)
            sys.stdout.write(held.read().decode(errors="replace") + python_out.getvalue())
            sys.stderr.write(python_err.getvalue())
        held.close()


def export_onnx(model_folder: str | Path, output: str | Path, quantize: str | None = None, fuse: bool = False,
                opset: int = OPSET, verbose: bool = False) -> ExportReport:
    """Write `output`: the folder's model as model.onnx (fp32, or int8 with quantize="int8";
    fuse=True for ONNX Runtime's fused BERT ops, which int8 always applies), its config.json and
    tokenizer. The graph is checked against PyTorch on a test batch; an fp32 graph further than
    1e-3 from it is an error; an int8 one is also compared on INT8_CHECK_SENTENCES (the report's
    `int8_check`). `model_folder` may be a run folder or a hub name with a local copy. Returns
    what was written and the checks."""
    t0 = time.perf_counter()
    if quantize not in (None, *QUANTIZE_CHOICES):
        raise ValueError(f"quantize must be one of {QUANTIZE_CHOICES} or None, got {quantize!r}")
    check_opset(opset)
    source = resolve_model(model_folder)  # a folder, a run folder's model, or a hub name's local copy
    if is_onnx_folder(source):
        raise ValueError(f"{source} is already an exported ONNX folder; export the PyTorch model folder instead")
    output = Path(output)
    destination = prepare_output(output, source)
    require_onnxruntime()
    model, architecture = load_for_export(source)
    encoder = role(architecture) == "Model"
    pooling = encoder_pooling(source) if encoder else None
    # the encoder's graph adds its pooled vectors; a head's graph its encoder's states (for /embed)
    outputs = list(CALL_OUTPUTS[role(architecture)]) + (["sentence_embedding"] if pooling else
                                                        [] if encoder else ["last_hidden_state"])
    graph = ExportGraph(model, pooling)
    inputs = sample_inputs(model.config)

    output.parent.mkdir(parents=True, exist_ok=True)
    with StopSignals() as stops:
        work = None
        try:  # built aside and moved in at the end: an interrupted export leaves no half folder
            work = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
            final, report = _build(work, source, model, architecture, graph, inputs, outputs, pooling, quantize,
                                   fuse, opset)
            stops.hold()  # from here a signal waits: the earlier export is replaced whole, never half
            install(final, destination)
        finally:
            stops.hold()  # a signal now waits for the temporary folder to be gone
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)
    report.folder, report.seconds = destination.path, time.perf_counter() - t0
    if verbose:
        print(report.summary())
    return report


def _build(work: Path, source: Path, model: nn.Module, architecture: str, graph: ExportGraph,
           inputs: tuple[torch.Tensor, ...], outputs: list[str], pooling: str | None, quantize: str | None,
           fuse: bool, opset: int) -> tuple[Path, ExportReport]:
    """The export's work in the temporary folder `work`: the graph, its folder (returned) and the check."""
    with library_output_held():
        traced = work / "traced.onnx"
        trace_to_onnx(graph, inputs, architecture, outputs, traced, opset)
        fused: dict[str, int] = {}
        current = traced
        if fuse or quantize == "int8":  # int8 quantises the fused ops (one QAttention per layer)
            fused = fuse_for_cpu(current, work / "fused.onnx", model.config)
            current = work / "fused.onnx"
        if quantize == "int8":
            quantize_int8(current, work / "int8.onnx")
            current = work / "int8.onnx"
        final = work / "final"
        final.mkdir()
        current.replace(final / ONNX_FILE)
        import onnxruntime

        onnx_meta = {"file": ONNX_FILE, "architecture": architecture, "precision": quantize or "fp32",
                     "outputs": outputs, "fused": fused, "opset": opset, "pooling": pooling,
                     "normalized": pooling is not None, "exported_from": str(source),
                     "torch": torch.__version__, "onnxruntime": onnxruntime.__version__}
        max_length = read_model_metadata(source).get("max_length") or sentence_transformers_settings(source).get("max_length")
        extra = {"pooling": pooling} if pooling else {}
        if max_length:
            extra["max_length"] = int(max_length)
        write_folder_files(source, final, onnx_meta, extra)
        session = OnnxModel(final, threads=1)
        diffs = compare_outputs(model, graph, session, outputs, inputs)
        int8_check = int8_agreement(model, graph, session, outputs, source) if quantize == "int8" else {}
    if quantize is None and max(diffs.values()) > FP32_TOLERANCE:
        raise RuntimeError(f"the exported graph differs from the PyTorch model by {max(diffs.values()):.2e} "
                           f"(> {FP32_TOLERANCE}): {diffs}")
    return final, ExportReport(Path(), architecture, quantize or "fp32", outputs, fused, diffs, int8_check)


_TEMPORARY: list[tempfile.TemporaryDirectory] = []  # on-the-fly exports, removed when the process exits


def onnx_folder(model_folder: str | Path, backend: str = "auto", quantize: str | None = None) -> Path | None:
    """Which exported folder to run for `backend` ("auto", "torch" or "onnx"), or None for PyTorch.

    auto: the folder itself when it is an export, else None. onnx: the folder when it is an
    export, else an export of it made now into a temporary folder (seconds; `bert-kit export`
    keeps one). torch on an exported folder is an error: it holds no PyTorch weights.
    """
    if backend not in ("auto", "torch", "onnx"):
        raise ValueError(f"backend must be auto, torch or onnx, got {backend!r}")
    folder = resolve_model_folder(model_folder)
    if folder is None:
        if backend != "onnx":
            return None  # not a folder: the PyTorch loader says what is wrong with it
        raise FileNotFoundError(f"model folder not found: {model_folder}")
    if is_onnx_folder(folder):
        if backend == "torch":
            raise ValueError(f"{folder} is an exported ONNX folder (no PyTorch weights): use --backend onnx or auto")
        return folder
    if backend != "onnx":
        return None
    tmp = tempfile.TemporaryDirectory(prefix="bert-kit-onnx-")
    _TEMPORARY.append(tmp)
    report = export_onnx(folder, Path(tmp.name) / "model", quantize=quantize)
    print(f"exported {folder} to ONNX ({report.precision}) in {report.seconds:.1f}s for this run; "
          f"`bert-kit export --model {folder} --output DIR` keeps it")
    return report.folder
