"""Run a folder written by `bert-kit export` with ONNX Runtime, called like the PyTorch model.

An exported folder holds `model.onnx` (one graph: fp32, or int8 with `--quantize int8`), the
tokenizer files and config.json, whose `bert_kit.onnx` entry says which head the graph computes
and what it outputs. `OnnxModel(folder)` takes the call of the model it was exported from,

    model(input_ids, attention_mask, token_type_ids, unpadded=...)  ->  torch tensors

shaped as the PyTorch head returns them (`bert_kit.heads`), so `SentenceEncoder`, the tasks'
evaluation and prediction, and `bert-kit embed/predict/evaluate` run an exported folder
unchanged. The graph is padded (unpadded is accepted and ignored) and runs on the CPU. A head's
graph that also outputs the encoder's `last_hidden_state` gives `model.encoder()`, the encoder's
call, for sentence embeddings.

What the folder says is checked against the graph when it loads: the graph file must lie inside
the folder (config.json names it), and a classifier's `id2label` must name one label per output;
a graph file ONNX Runtime cannot load (truncated, empty) is a CorruptFileError naming it.

Needs the optional extra: `pip install "bert-kit[onnx]"` (onnx, onnxruntime).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import copy
from pathlib import PurePath

import numpy as np
import torch

from bert_kit.config import BertConfig, architecture_role, load_hf_config
from bert_kit.input_checks import check_inputs
from bert_kit.model_folder import onnx_metadata
from bert_kit.threads import spinning

ONNX_FILE = "model.onnx"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
# role (HF's class-name suffix, every family alike) -> the graph outputs that the PyTorch forward
# returns, in its order (the names HF and optimum give them); the encoder's graph adds "sentence_embedding"
CALL_OUTPUTS: dict[str, tuple[str, ...]] = {
    "Model": ("last_hidden_state",),
    "ForSequenceClassification": ("logits",),
    "ForTokenClassification": ("logits",),
    "ForQuestionAnswering": ("start_logits", "end_logits"),
    "ForMaskedLM": ("logits",),
    "ForPreTraining": ("prediction_logits", "seq_relationship_logits"),
}


def role(architecture: str) -> str:
    """The role of an HF class name: "ModernBertForMaskedLM" -> "ForMaskedLM" (`bert_kit.families`)."""
    return architecture_role(architecture).removeprefix("Bert")


def require_onnxruntime() -> Any:
    """The onnxruntime module, or an ImportError that names the extra to install."""
    try:
        import onnxruntime
    except ImportError:
        raise ImportError("ONNX export and inference need onnx and onnxruntime: "
                          'pip install "bert-kit[onnx]"') from None
    return onnxruntime


def is_onnx_folder(folder: str | Path) -> bool:
    """True for a folder written by `bert-kit export` (its config.json records the graph)."""
    return onnx_metadata(folder) is not None


def _session(ort: Any, graph: Path, options: Any) -> Any:
    """An ONNX Runtime session of `graph`; a file that is not a graph ONNX Runtime can load (cut
    short, empty, not ONNX) is a CorruptFileError naming it, as a truncated safetensors file is."""
    from bert_kit.checks import CorruptFileError

    try:
        return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001: onnxruntime raises its own classes (InvalidProtobuf, InvalidGraph, Fail)
        if type(e).__module__.split(".")[0] != "onnxruntime":
            raise
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CorruptFileError(f"{graph} is not a readable ONNX graph ({type(e).__name__}: {reason[:200]}): it is "
                               "truncated or corrupt; export the folder again (bert-kit export)") from None


class OnnxModel:
    """An exported graph in an ONNX Runtime session, with the call and outputs of its PyTorch model.

    folder: written by `bert-kit export`; threads: ONNX Runtime intra-op threads (default: as many
    as PyTorch uses, `torch.get_num_threads()`, so both sides of a comparison get the same).
    Attributes: config (BertConfig or ModernBertConfig), architecture (e.g.
    "BertForSequenceClassification"), role (its suffix, "ForSequenceClassification"), precision
    ("fp32" or "int8"), session (the `onnxruntime.InferenceSession`).
    """

    training = False  # inference only: eval()/train() are accepted so the tasks' loops run unchanged
    pads_batches = True  # every input of a batch computes at the batch's longest length

    def __init__(self, folder: str | Path, threads: int | None = None):
        ort = require_onnxruntime()
        folder = Path(folder)
        meta = onnx_metadata(folder)
        if meta is None:
            raise ValueError(f"{folder} is not an exported ONNX folder (no bert_kit.onnx entry in its config.json); "
                             f"write one with: bert-kit export --model {folder} --output DIR")
        name = meta.get("file", ONNX_FILE)
        parts = PurePath(name).parts if isinstance(name, str) else ("..",)
        if not parts or PurePath(name).is_absolute() or ".." in parts:
            raise ValueError(f"{folder / 'config.json'}: the graph file {name!r} is not inside {folder}; an exported "
                             f"folder holds its own graph (file: {ONNX_FILE!r})")
        graph = folder / name
        if not graph.is_file():
            raise FileNotFoundError(f"{graph} is missing (config.json names it as the exported graph)")
        self.folder = folder
        self.config: BertConfig = load_hf_config(folder)
        self.architecture: str = meta["architecture"]
        self.role = role(self.architecture)
        self.precision: str = meta.get("precision", "fp32")
        self.pooling: str | None = meta.get("pooling")  # the encoder's graph pools (and normalises) too
        self.call_outputs = list(CALL_OUTPUTS[self.role])
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1  # one graph, run node after node: no second pool competing
        # OMP_WAIT_POLICY=PASSIVE puts every pool to sleep while it waits, this one too (bert_kit.threads)
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning() else "0")
        self.session = _session(ort, graph, options)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.num_labels = self._check_labels(graph)

    def _check_labels(self, graph: Path) -> int | None:
        """A classifier's outputs per text (or token); config.json's id2label must name as many."""
        if self.role not in ("ForSequenceClassification", "ForTokenClassification"):
            return None
        from bert_kit.model_folder import read_model_metadata

        shape = next(o.shape for o in self.session.get_outputs() if o.name == "logits")
        outputs = shape[-1] if shape and isinstance(shape[-1], int) else None
        names = read_model_metadata(self.folder).get("label_names")
        if outputs is not None and names is not None and len(names) != outputs:
            raise ValueError(f"{self.folder / 'config.json'} names {len(names)} labels in id2label but the graph "
                             f"{graph.name} outputs {outputs} logits: give id2label one name per output (or export "
                             "the folder again)")
        return outputs

    def __repr__(self) -> str:
        return f"OnnxModel({str(self.folder)!r}, {self.architecture}, {self.precision})"

    @property
    def has_encoder_states(self) -> bool:
        return "last_hidden_state" in self.output_names

    def encoder(self) -> OnnxModel:
        """The same graph called as its encoder: (B, T, H) last_hidden_state (it shares the session).
        A head's graph has it when `bert-kit export` added it as an extra output."""
        if not self.has_encoder_states:
            raise ValueError(f"the graph of {self.folder} ({self.architecture}) does not output the encoder's "
                             "states (last_hidden_state): export the folder again to embed with it")
        view = copy.copy(self)
        view.architecture, view.role = self.architecture.replace(self.role, "Model"), "Model"
        view.call_outputs, view.num_labels = ["last_hidden_state"], None
        if self.role != "Model":
            view.pooling = None  # only the encoder's own graph pools
        return view

    # the nn.Module calls that the inference code makes on a model
    def eval(self) -> OnnxModel:
        return self

    def train(self, mode: bool = True) -> OnnxModel:
        if mode:
            raise ValueError(f"{self.folder} is an exported ONNX graph: it runs inference only, it cannot be trained")
        return self

    def to(self, device: str | torch.device | None = None, *args: Any, **kwargs: Any) -> OnnxModel:
        if device is not None and not isinstance(device, torch.dtype) and torch.device(device).type != "cpu":
            raise ValueError(f"an exported ONNX folder runs on the CPU (ONNX Runtime's CPU provider), not {device}: "
                             f"pass --device cpu")
        return self

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
            token_type_ids: torch.Tensor | None = None, outputs: list[str] | None = None) -> list[np.ndarray]:
        """The named graph outputs (default: all) for (B, T) inputs, as NumPy arrays."""
        check_inputs(self.config, input_ids, attention_mask, token_type_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        given = dict(zip(INPUT_NAMES, (input_ids, attention_mask, token_type_ids)))
        # .numpy() of a contiguous CPU int64 tensor shares its memory: no copy on the way in
        feeds = {name: given[name].detach().cpu().to(torch.int64).contiguous().numpy() for name in self.input_names}
        return self.session.run(outputs, feeds)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 token_type_ids: torch.Tensor | None = None, unpadded: bool = False,
                 **unused: Any) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """What the PyTorch model returns: e.g. (B, T, H) hidden states, (B, C) logits, or
        (start (B, T), end (B, T)). `unpadded` is ignored: the graph takes padded batches."""
        outs = [torch.from_numpy(o) for o in self.run(input_ids, attention_mask, token_type_ids, self.call_outputs)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    forward = __call__

    def sentence_embedding(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The encoder graph's pooled, L2-normalised vectors (B, H), computed inside ONNX Runtime.

        Pooling there rather than in PyTorch keeps PyTorch's thread pool asleep between batches;
        on two cores its spinning threads and ONNX Runtime's otherwise take turns on the same cores.
        """
        if self.pooling is None:
            raise ValueError(f"{self.folder} holds an exported {self.architecture} graph, which has no sentence_embedding")
        return torch.from_numpy(self.run(input_ids, attention_mask, token_type_ids, ["sentence_embedding"])[0])
