"""What an exported folder says is checked against its graph when it loads (bert_kit.onnx_runtime),
and every exported folder serves what a PyTorch folder serves.

- config.json naming 3 labels for a 2-output graph predicted 2 and reported 3 in /info;
- config.json naming "../other/model.onnx" ran another folder's graph;
- an exported head serves /embed from the encoder states its graph outputs (`bert-kit export`
  writes them; a head graph without them serves its task only), equal to the PyTorch encoder's;
- a non-finite output of an exported graph is an error, as for PyTorch.

Run: .venv/bin/python -m pytest tests/test_onnx_runtime.py -q
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from bert_kit.heads import BERTForSequenceClassification
from tests.tasks.test_inference import saved
from tests.test_serve import TEXTS, TINY

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def exported(minilm_path, tmp_path_factory) -> dict[str, Path]:
    """A tiny fine-tuned classifier, its export (whose graph also outputs the encoder's states),
    and the same folder with a graph of the logits alone (as exports made before that)."""
    pytest.importorskip("onnxruntime")
    from bert_kit.onnx_export import ExportGraph, export_onnx, sample_inputs, trace_to_onnx
    from bert_kit.tokenizer import get_tokenizer

    root = tmp_path_factory.mktemp("onnx_runtime")
    torch.manual_seed(0)
    model = BERTForSequenceClassification(TINY, num_labels=2)
    folder = saved(root / "cls", model, get_tokenizer(minilm_path), ["neg", "pos"], task="classification",
                   max_length=64)
    export_onnx(folder, root / "onnx")

    class LogitsOnly(nn.Module):
        def __init__(self, graph: ExportGraph):
            super().__init__()
            self.graph = graph

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.graph.model(input_ids, attention_mask, token_type_ids)

    logits_only = root / "onnx-logits"
    shutil.copytree(root / "onnx", logits_only)
    trace_to_onnx(LogitsOnly(ExportGraph(model)), sample_inputs(model.config), "BertForSequenceClassification",
                  ["logits"], logits_only / "model.onnx")
    edit_config(logits_only, lambda c: c["bert_kit"]["onnx"].update(outputs=["logits"]))
    return {"torch": folder, "onnx": root / "onnx", "logits_only": logits_only}


def edit_config(folder: Path, change) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def test_id2label_must_name_one_label_per_graph_output(exported, tmp_path):
    from bert_kit.onnx_runtime import OnnxModel

    assert OnnxModel(exported["onnx"]).num_labels == 2
    folder = shutil.copytree(exported["onnx"], tmp_path / "three")
    edit_config(folder, lambda c: c.update(id2label={"0": "a", "1": "b", "2": "c"}))
    with pytest.raises(ValueError, match=r"three/config\.json names 3 labels in id2label but the graph model\.onnx "
                                         r"outputs 2 logits"):
        OnnxModel(folder)


@pytest.mark.parametrize("name", ["../onnx/model.onnx", "/etc/passwd", "sub/../../x.onnx", ""])
def test_the_graph_file_must_lie_inside_the_folder(exported, tmp_path, name):
    from bert_kit.onnx_runtime import OnnxModel

    folder = shutil.copytree(exported["onnx"], tmp_path / "elsewhere")
    edit_config(folder, lambda c: c["bert_kit"]["onnx"].update(file=name))
    with pytest.raises(ValueError, match=r"config\.json: the graph file .* is not inside"):
        OnnxModel(folder)


def test_an_exported_head_serves_embed_from_its_encoder_states(exported):
    """/embed of an exported classifier equals the PyTorch encoder's sentence vectors."""
    from bert_kit.embeddings import SentenceEncoder
    from bert_kit.model import BERTModel
    from bert_kit.serving.operations import BACKENDS
    from bert_kit.tokenizer import get_tokenizer

    info, ops = BACKENDS["torch"](exported["onnx"], "cpu", "auto", None)
    assert [op.path for op in ops] == ["/embed", "/classify"] and info["hidden_size"] == 32
    embed = ops[0]
    options = embed.with_defaults({})
    got = np.array(embed.respond(embed.run(embed.prepare(TEXTS, options)), options))
    encoder = SentenceEncoder(BERTModel.from_pretrained(exported["torch"]), get_tokenizer(exported["torch"]),
                              max_length=64, device="cpu")
    np.testing.assert_allclose(got, encoder.encode(TEXTS), atol=1e-4, rtol=0)
    info, ops = BACKENDS["torch"](exported["logits_only"], "cpu", "auto", None)  # a graph without the states
    assert [op.path for op in ops] == ["/classify"] and "hidden_size" not in info


def test_a_non_finite_output_of_an_exported_graph_is_an_error(exported, monkeypatch):
    from bert_kit.onnx_runtime import OnnxModel
    from bert_kit.serving.operations import NonFiniteOutput, guard_finite

    model = OnnxModel(exported["onnx"])
    guard_finite(model)
    ids = torch.tensor([[101, 2000, 102]])
    assert torch.isfinite(model(ids)).all()
    monkeypatch.setattr(model.session, "run", lambda names, feeds: [np.full((1, 2), np.nan, np.float32)])
    with pytest.raises(NonFiniteOutput, match="non-finite values"):
        model(ids)


def test_an_exported_head_embeds_as_its_pytorch_encoder(exported):
    """docs/export.md's promise: an exported folder alone serves /embed and `bert-kit embed` /
    `SentenceEncoder.from_pretrained`, with the vectors of the PyTorch encoder it came from."""
    from bert_kit.embeddings import SentenceEncoder

    got = SentenceEncoder.from_pretrained(exported["onnx"], max_length=64).encode(TEXTS)
    want = SentenceEncoder.from_pretrained(exported["torch"], max_length=64, device="cpu").encode(TEXTS)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match=r"exported BertForSequenceClassification graph without the encoder's "
                                         r"states \(last_hidden_state\): export the folder again"):
        SentenceEncoder.from_pretrained(exported["logits_only"])


def test_bert_kit_embed_on_an_exported_classifier(exported, tmp_path):
    from bert_kit.cli import main

    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    assert main(["embed", "--model", str(exported["onnx"]), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "v.npy"), "--max-length", "64"]) == 0
    assert np.load(tmp_path / "v.npy").shape == (len(TEXTS), 32)


@pytest.mark.parametrize("keep", [0.5, 0.0, 0.999])
def test_a_truncated_graph_is_a_corrupt_file_in_every_command(exported, tmp_path, capsys, keep):
    """Cut short (or emptied), model.onnx is the corrupt-file error a truncated safetensors file
    gets, exit 2: not onnxruntime's InvalidProtobuf and 'please report it'."""
    from bert_kit.checks import CorruptFileError
    from bert_kit.cli import main
    from bert_kit.onnx_runtime import OnnxModel

    folder = shutil.copytree(exported["onnx"], tmp_path / "cut")
    graph = (folder / "model.onnx").read_bytes()
    (folder / "model.onnx").write_bytes(graph[:int(len(graph) * keep)])
    with pytest.raises(CorruptFileError, match=r"cut/model\.onnx is not a readable ONNX graph .*: it is truncated "
                                               r"or corrupt; export the folder again"):
        OnnxModel(folder)
    (tmp_path / "in.txt").write_text("a fine film\n")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\na fine film\tpos\n")
    for argv in (["predict", "--input", "in.txt", "--output", "o.jsonl"],
                 ["embed", "--input", "in.txt", "--output", "v.npy"],
                 ["evaluate", "--data", "dev.tsv", "--output", "e.json"]):
        capsys.readouterr()
        argv = [str(tmp_path / a) if a in ("in.txt", "dev.tsv", "o.jsonl", "v.npy", "e.json") else a for a in argv]
        assert main([*argv, "--model", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "model.onnx is not a readable ONNX graph" in err and "report" not in err, err
