"""LoRA through peft: HF target names on bert-kit's layers (query and value of the fused QKV),
a merged model equal to the adapter model, adapters that HF peft loads on transformers' model,
LoRA fine-tuning runs that save the adapter alone, resume, evaluate, merge and export.

Run: .venv/bin/python -m pytest tests/test_lora.py -q -n 0
"""

import copy
import json
import math
import shutil

import pytest
import torch

from bert_kit.config import BertConfig
from bert_kit.heads import BERTForQuestionAnswering, BERTForSequenceClassification, BERTForTokenClassification
from bert_kit.model import BERTModel
from tests.tiny_runs import tiny_settings, tiny_setup

peft = pytest.importorskip("peft")

from bert_kit import lora  # noqa: E402

CONFIG = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    torch.manual_seed(0)
    BERTModel(CONFIG).save_pretrained(folder)
    return folder


def inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 100, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    return ids, mask


def trained(model):
    """Adapters and head away from their start (peft starts B at zero: the update would be zero)."""
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.normal_(0, 0.2)
    return model.eval()


def outputs(model, ids, mask):
    out = model(ids, mask)
    return torch.stack(out) if isinstance(out, tuple) else out


def test_hf_target_names_map_onto_bert_kits_layers(base):
    model = BERTForSequenceClassification(CONFIG)
    chosen, split = lora.resolve_targets(model, ["query", "value"])
    assert split and chosen == [f"bert.encoder.layers.{i}.attention.qkv.{p}" for p in ("query", "value") for i in (0, 1)]
    dense, split = lora.resolve_targets(model, ["dense"])  # every dense layer, as in HF
    assert not split and sorted(dense) == sorted([f"bert.encoder.layers.{i}.{n}" for i in (0, 1)
                                                  for n in ("attention.out", "ffn.up", "ffn.down")] + ["bert.pooler.dense"])
    assert lora.resolve_targets(model, ["intermediate.dense"])[0] == lora.resolve_targets(model, ["ffn.up"])[0]
    assert sorted(lora.resolve_targets(model, ["output.dense"])[0]) == [f"bert.encoder.layers.{i}.{n}" for i in (0, 1)
                                                                        for n in ("attention.out", "ffn.down")]
    with pytest.raises(ValueError, match=r"'qurey' name\(s\) no linear layer of this bert model: expected names "
                                         r"such as .*query.*value"):
        lora.resolve_targets(model, ["qurey"])
    one = lora.add_lora(BERTForSequenceClassification(CONFIG), 4, 8, 0.0, ["encoder.layer.1.attention.self.value"], "b")
    assert one.lora_adapter.modules == ["bert.encoder.layers.1.attention.qkv.value"]
    assert [type(layer.attention.qkv) for layer in one.bert.encoder.layers] == [torch.nn.Linear, lora.SplitQKV]
    distil = BERTForSequenceClassification(BertConfig(**{**CONFIG.__dict__, "model_type": "distilbert",
                                                         "type_vocab_size": 0, "pooler": False}))
    assert lora.resolve_targets(distil, ["q_lin"])[0] == [f"bert.encoder.layers.{i}.attention.qkv.query"
                                                          for i in (0, 1)]


@pytest.mark.parametrize("cls", [BERTForSequenceClassification, BERTForTokenClassification, BERTForQuestionAnswering,
                                 BERTModel])
def test_a_merged_model_and_the_saved_adapter_give_the_adapter_models_outputs(base, tmp_path, cls):
    """Within 1e-5: merging folds each adapter into its layer and fuses the three projections back."""
    model = trained(lora.add_lora(cls.from_pretrained(base), 4, 8, 0.05, ["query", "value", "dense"], str(base)))
    assert model.lora_adapter.head == ([] if cls is BERTModel else [n for n in ("classifier", "qa_outputs")
                                                                    if hasattr(model, n)])
    ids, mask = inputs()
    with torch.no_grad():
        expected = outputs(model, ids, mask)
    lora.save_adapter(model, tmp_path / "adapter")
    merged = lora.merge(copy.deepcopy(model))
    plain = cls.from_pretrained(base)
    assert list(merged.state_dict()) == list(plain.state_dict())  # no trace of peft: a plain model
    assert type(merged.bert.encoder.layers[0].attention.qkv if cls is not BERTModel
                else merged.encoder.layers[0].attention.qkv) is torch.nn.Linear
    loaded = cls.from_pretrained(tmp_path / "adapter")
    with torch.no_grad():
        torch.testing.assert_close(outputs(merged.eval(), ids, mask), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(outputs(loaded, ids, mask), expected, atol=1e-5, rtol=0)
    assert (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_size < 200_000


def test_hf_peft_loads_the_adapter_on_transformers_model(base, tmp_path):
    transformers = pytest.importorskip("transformers")
    model = trained(lora.add_lora(BERTForSequenceClassification.from_pretrained(base, num_labels=3), 4, 8, 0.0,
                                  ["query", "value"], str(base)))
    lora.save_adapter(model, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (sorted(config["target_modules"]), config["modules_to_save"], config["task_type"]) == (
        ["query", "value"], ["classifier"], "SEQ_CLS")
    assert config["base_model_name_or_path"] == str(base)
    hf = transformers.BertForSequenceClassification.from_pretrained(base, num_labels=3)
    hf = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    ids, mask = inputs()
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids, attention_mask=mask).logits, model(ids, mask), atol=1e-5, rtol=0)


def test_the_fast_path_applies_to_a_merged_model_and_not_its_weight_reading_kernels_to_adapters(base):
    from bert_kit.kernels import fast_path
    from bert_kit.kernels.attention import CudaAttention

    model = lora.add_lora(BERTForSequenceClassification.from_pretrained(base), 4, 8, 0.0, ["query"], str(base))
    assert not fast_path.plain_projections(model)
    merged = lora.merge(model)
    assert fast_path.plain_projections(merged)
    fast_path.install(merged, fast_path.FastPath(device="cuda", cuda_attention=True))
    assert all(type(layer.attention) is CudaAttention for layer in merged.bert.encoder.layers)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_setup(tmp_path_factory.mktemp("tiny"))


@pytest.mark.slow
def test_a_lora_run_trains_adapters_alone_resumes_and_every_command_reads_its_folder(tiny, tmp_path):
    """best/ holds the adapter (the encoder stays the base's); a run resumed from a checkpoint ends
    where the uninterrupted one does; evaluate, merge and export take the adapter folder."""
    from safetensors.torch import load_file

    from bert_kit.cli import main
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    settings = dict(lora={"r": 4, "alpha": 8, "dropout": 0.0}, lr=1e-2, max_steps=12, save_every=6)
    full = finetune(FinetuneConfig(**tiny_settings(tiny, tmp_path / "a", **settings)))
    assert full["lora_trainable_parameters"] == 4 * (4 * 32 + 4 * 32) + 2 * 32 + 2
    best = tmp_path / "a" / "best"
    assert sorted(p.name for p in best.iterdir() if p.suffix in (".json", ".safetensors") and p.name[0] != ".") == [
        "adapter_config.json", "adapter_model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((best / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        tiny.encoder.resolve())

    shutil.copytree(tmp_path / "a", tmp_path / "b")  # then lose what came after step 6, as a crash would
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step-0000012")
    (tmp_path / "b" / "results.json").unlink()
    resumed = finetune(FinetuneConfig(**tiny_settings(tiny, tmp_path / "b", **settings)), resume="latest")
    assert resumed["steps"] == 12
    a = load_file(tmp_path / "a" / "checkpoints" / "step-0000012" / "adapter_model.safetensors")
    b = load_file(tmp_path / "b" / "checkpoints" / "step-0000012" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=0, rtol=0)

    merged = BERTForSequenceClassification.from_pretrained(best)
    base = BERTModel.from_pretrained(tiny.encoder)
    for name in ("embeddings.word_embeddings.weight", "encoder.layers.1.ffn.up.weight"):  # never adapted
        torch.testing.assert_close(merged.bert.state_dict()[name], base.state_dict()[name], atol=0, rtol=0)
    assert not torch.equal(merged.bert.encoder.layers[0].attention.qkv.weight, base.encoder.layers[0].attention.qkv.weight)

    evaluated = tmp_path / "eval.json"
    assert main(["evaluate", "--model", str(tmp_path / "a"), "--data", str(tiny.dev), "--output", str(evaluated)]) == 0
    accuracy = json.loads(evaluated.read_text())["accuracy"]
    assert accuracy == pytest.approx(full["best_value"])
    assert main(["merge", str(best), "--output", str(tmp_path / "merged")]) == 0
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    assert main(["evaluate", "--model", str(tmp_path / "merged"), "--data", str(tiny.dev), "--output",
                 str(evaluated)]) == 0
    assert json.loads(evaluated.read_text())["accuracy"] == accuracy
    from bert_kit.weight_files import read_state_dict
    from bert_kit.tasks.inference import TextClassifier  # what `serve` and `predict` load

    with pytest.raises(FileNotFoundError, match=r"holds a LoRA adapter, not a model's weights.*bert-kit merge"):
        read_state_dict(best)  # what reads weights alone (convert, fill-mask) says what the folder is

    texts = ["the happy cat sees the dog", "the sad tree hears the fish"]
    assert TextClassifier.from_pretrained(best).predict(texts) == TextClassifier.from_pretrained(
        tmp_path / "merged").predict(texts)
    pytest.importorskip("onnxruntime")
    assert main(["export", "--model", str(best), "--output", str(tmp_path / "onnx")]) == 0  # merged, then exported


def test_lora_settings_are_checked_and_need_a_model_folder(tiny, tmp_path):
    from bert_kit.checks import ConfigError
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig
    from bert_kit.training.runconfig import load_config

    with pytest.raises(ConfigError, match=r"lora.r=0 is out of range"):
        FinetuneConfig(lora={"r": 0})
    with pytest.raises(ConfigError, match="lora trains with engine=torch and parallel=ddp"):
        FinetuneConfig(lora={}, parallel="fsdp")
    cfg = load_config(FinetuneConfig, None, ["lora.r=4", "lora.target_modules=[query, key]"])
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.target_modules) == (4, 16.0, ["query", "key"])
    assert load_config(FinetuneConfig, None, ["lora={}"]).lora == lora_defaults()
    with pytest.raises(ValueError, match="lora adapts a pretrained model: model='bert-tiny' is a preset"):
        finetune(FinetuneConfig(**tiny_settings(tiny, tmp_path / "p", model="bert-tiny",
                                                tokenizer=str(tiny.encoder), lora={})))


def test_a_lora_run_with_a_metric_for_best_trains(tiny, tmp_path):
    """`metric:` beside `lora:` (as a tune config holds both) adapts the model folder it names."""
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    results = finetune(FinetuneConfig(**tiny_settings(tiny, tmp_path / "run", lora={"r": 2}, metric="f1",
                                                      max_steps=2, eval_every=2)))
    assert results["metric"] == "f1" and results["steps"] == 2
    assert (tmp_path / "run" / "best" / "adapter_model.safetensors").is_file()


def lora_defaults():
    from bert_kit.tasks.finetuning_config import LoRASettings

    return LoRASettings()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_lora_run_on_a_gpu_with_cuda_graphs_and_bf16(tiny, tmp_path):
    """The GPU's fine-tuning path (whole steps replayed as CUDA graphs, bf16, flash varlen attention)
    with adapters: it trains, and the adapter it saves gives the merged model's outputs."""
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    results = finetune(FinetuneConfig(**tiny_settings(tiny, tmp_path / "run", device="cuda", lr=1e-2, max_steps=24,
                                                      lora={"r": 4, "dropout": 0.0})))
    assert results["steps"] == 24 and math.isfinite(results["train_loss"])
    assert results["train_loss"] < results["initial_train_loss"]
    merged = BERTForSequenceClassification.from_pretrained(tmp_path / "run" / "best").cuda()
    ids, mask = inputs()
    ids = ids % 100  # within the tiny vocabulary
    with torch.no_grad():
        assert torch.isfinite(merged(ids.cuda(), mask.cuda())).all()
