"""Model folders that read well but hold the wrong thing: every command that loads one refuses it.

Inputs: a weight tensor with NaN or inf (a run that diverged before it was saved), a config.json
of a decoder or of a model with cross-attention or relative positions, which bert-kit does not
build. Outcome: one error line naming the file and the tensor or key, exit code 2 (the input is
wrong), no traceback. Before, NaN weights gave NaN probabilities (invalid JSON) and NaN
embeddings with exit 0, and a decoder's config loaded as an encoder.

Run: python -m pytest -q tests/bad_inputs/test_model_contents.py
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from tests.bad_inputs.test_model_folders import WRONG_INPUT, command, source_of

COMMANDS = ["fill-mask", "embed", "attention", "convert", "evaluate", "predict", "finetune"]


@pytest.mark.parametrize("name", COMMANDS)
def test_nan_weights(cli, assets, tmp_path, single_thread, name):
    folder = assets.copy(source_of(name), tmp_path / "model")
    file = folder / "model.safetensors"
    state = load_file(file)
    state["bert.encoder.layer.0.attention.output.dense.weight"][0, :4] = float("nan")
    save_file(state, str(file))
    result = cli(*command(name, folder, assets, tmp_path))
    result.one_line_error(f"{file}: tensor bert.encoder.layer.0.attention.output.dense.weight holds 4 NaN or "
                          "infinite value(s)", code=WRONG_INPUT)
    assert not (tmp_path / "e.npy").exists() and not (tmp_path / "p.jsonl").exists()



@pytest.mark.parametrize("name", COMMANDS)
def test_integer_weights(cli, assets, tmp_path, single_thread, name):
    """An int32 tensor (a quantized checkpoint's codes) was cast to float silently; evaluate and
    predict also called a corrupt file "not a classification model (fine-tune it first)"."""
    import torch

    folder = assets.copy(source_of(name), tmp_path / "model")
    file = folder / "model.safetensors"
    state = load_file(file)
    key = "bert.encoder.layer.0.attention.output.dense.weight"
    state[key] = state[key].round().to(torch.int32)
    save_file(state, str(file))
    line = cli(*command(name, folder, assets, tmp_path)).one_line_error(
        f"{file}: tensor {key} holds int32 values, not floating point", code=WRONG_INPUT)
    assert "fine-tune it first" not in line

@pytest.mark.parametrize("change", [{"is_decoder": True}, {"add_cross_attention": True},
                                    {"position_embedding_type": "relative_key"}, {"hidden_act": "gelu_new"}])
@pytest.mark.parametrize("name", ["fill-mask", "embed", "evaluate"])
def test_configs_of_models_bert_kit_does_not_build(cli, assets, tmp_path, name, change):
    folder = assets.copy(source_of(name), tmp_path / "model")
    config = folder / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **change}))
    key = next(iter(change))
    line = cli(*command(name, folder, assets, tmp_path)).one_line_error(str(config), key, code=WRONG_INPUT)
    assert "not supported" in line or "it builds BERT encoders only" in line
