"""LoRA (Hu et al. 2021) on bert-kit models, through the `peft` library (`pip install "bert-kit[lora]"`).

    lora: {r: 8, alpha: 16, dropout: 0.05, target_modules: [query, value]}    # any fine-tuning task

`add_lora` freezes the encoder and puts peft's LoRA layers (`LoraConfig`, `get_peft_model`) on the
linear layers that `target_modules` names; the task's head is trained whole (peft's
`modules_to_save`). The names are those users write for HF models, matched as peft matches them
(a module whose name is the target or ends with "." + target) against the HF name of each of
the model's layers (`bert_kit.hf_names`): `query`, `key`, `value`, `dense` (every dense layer:
attention output, intermediate, output, pooler), `attention.output.dense`, `intermediate.dense`,
`output.dense`; DistilBERT's `q_lin`, `v_lin`, `lin1`...; bert-kit's own names (`attention.out`,
`ffn.up`, `ffn.down`) work too.

The fused QKV projection: bert-kit keeps query, key and value as one (H -> 3H) `qkv` layer, HF as
three. A LoRA on `query` and `value` is two adapters of rank r, one per projection, as in HF
(not one adapter on the fused layer, which would adapt the keys too and have another rank). So
where a target names one of the three, `add_lora` first splits that layer's `qkv` into a
`SplitQKV` of three `nn.Linear` (the same weights, the output the same concatenation), on
which peft puts its adapters; `merge` folds the adapters into the weights and fuses the three
back into one `qkv`. The split costs three smaller matmuls instead of one while training.

Saved alone (`save_adapter`), an adapter is a folder as HF peft writes one: `adapter_model.safetensors`
(the LoRA matrices and the head under HF names, a few MB), `adapter_config.json` (a `LoraConfig`
whose `base_model_name_or_path` names the base model folder), plus `config.json` (the head's
labels) and what the task saves beside it. HF peft loads it on the matching transformers model
(`PeftModel.from_pretrained(BertForSequenceClassification.from_pretrained(base), folder)`), and
bert-kit loads it anywhere a model folder goes (`from_pretrained`: evaluate, predict, serve,
export, embed) as the merged model (`load_merged`): a plain model, so the fast path applies to
it as to any other. `bert-kit merge ADAPTER OUT` writes that merged folder.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # where peft's saved names start
QKV_PART = re.compile(r"^(.*attention\.qkv)\.(query|key|value)$")
TASK_TYPES = {"ForSequenceClassification": "SEQ_CLS", "ForTokenClassification": "TOKEN_CLS",
              "ForQuestionAnswering": "QUESTION_ANS", "Model": "FEATURE_EXTRACTION"}


class SplitQKV(nn.Module):
    """The fused QKV projection as three linear layers, for adapters on one or two of them:
    x (..., H) -> [query(x); key(x); value(x)] (..., 3H), as `nn.Linear(H, 3H)` computes it."""

    def __init__(self, fused: nn.Linear) -> None:
        super().__init__()
        hidden = fused.in_features
        parts = []
        for i in range(3):
            part = nn.Linear(hidden, hidden, device=fused.weight.device, dtype=fused.weight.dtype)
            with torch.no_grad():
                part.weight.copy_(fused.weight[i * hidden:(i + 1) * hidden])
                part.bias.copy_(fused.bias[i * hidden:(i + 1) * hidden])
            parts.append(part)
        self.query, self.key, self.value = parts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.query(x), self.key(x), self.value(x)], dim=-1)

    def fused(self) -> nn.Linear:
        """The one (H -> 3H) layer of the three (plain `nn.Linear`s again, after `merge`)."""
        hidden = self.query.in_features
        layer = nn.Linear(hidden, 3 * hidden, device=self.query.weight.device, dtype=self.query.weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(torch.cat([self.query.weight, self.key.weight, self.value.weight]))
            layer.bias.copy_(torch.cat([self.query.bias, self.key.bias, self.value.bias]))
        return layer


@dataclass
class Adapter:
    """What a model with LoRA layers records about them (`model.lora_adapter`)."""

    r: int
    alpha: float
    dropout: float
    targets: list[str]  # the target names as given (HF's or bert-kit's)
    modules: list[str]  # our names of the adapted layers
    head: list[str]  # our names of the modules trained whole (the head)
    base: str  # the base model folder


def require_peft() -> Any:
    try:
        import peft
    except ModuleNotFoundError:
        raise ImportError('lora needs the peft library: pip install "bert-kit[lora]"') from None
    return peft


def hf_module_name(model: nn.Module, name: str) -> str:
    """The HF name of our linear layer `name` ("bert.encoder.layers.0.attention.qkv.query" ->
    "bert.encoder.layer.0.attention.self.query"), or `name` itself where HF has none."""
    from bert_kit.hf import names_for, to_hf_state_dict

    names = names_for(model)
    part = QKV_PART.match(name)
    if part is not None and names.qkv is not None:
        layer = re.search(r"layers\.(\d+)\.", name).group(1)
        hf = names.qkv.format(i=layer, part=names.qkv_parts[("query", "key", "value").index(part.group(2))],
                              kind="weight")
        return (names.prefix if name.startswith("bert.") else "") + hf.removesuffix(".weight")
    probe = {f"{name}.weight": torch.zeros(3, 1)}
    try:
        hf = to_hf_state_dict(model, probe)
    except KeyError:
        return name
    return next(iter(hf)).removesuffix(".weight") if len(hf) == 1 else name


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def linear_layers(model: nn.Module, split: bool) -> dict[str, str]:
    """{our name: HF name} of the encoder's linear layers; with `split`, each qkv's three parts."""
    encoder = model.bert if hasattr(model, "bert") else model
    prefix = "bert." if encoder is not model else ""
    found = {}
    for name, module in encoder.named_modules():
        if not isinstance(module, nn.Linear) or not name:
            continue
        if split and name.endswith("attention.qkv"):
            for part in ("query", "key", "value"):
                found[f"{prefix}{name}.{part}"] = hf_module_name(model, f"{prefix}{name}.{part}")
        else:
            found[prefix + name] = hf_module_name(model, prefix + name)
    return found


def resolve_targets(model: nn.Module, targets: list[str]) -> tuple[list[str], bool]:
    """(our names of the layers `targets` names, whether the qkv layers must be split for them)."""
    from bert_kit.hf import names_for

    separate = names_for(model).qkv is not None  # HF keeps query, key and value apart in this family
    layers = linear_layers(model, split=separate)
    chosen, unknown = [], []
    for target in targets:
        hit = [ours for ours, hf in layers.items() if _matches(hf, target) or _matches(ours, target)]
        if not hit:
            unknown.append(target)
        chosen += [h for h in hit if h not in chosen]
    if unknown:
        shown = sorted({hf.rsplit(".", 1)[-1] for hf in layers.values()} | {"attention.out", "ffn.up", "ffn.down"})
        raise ValueError(f"lora.target_modules: {', '.join(map(repr, unknown))} name(s) no linear layer of this "
                         f"{model.config.model_type} model: expected names such as {', '.join(shown)}")
    return chosen, any(QKV_PART.match(name) for name in chosen)


def head_modules(model: nn.Module) -> list[str]:
    """The head: the model's own modules with weights, beside the encoder (trained whole)."""
    if not hasattr(model, "bert"):
        return []  # an encoder alone (a bi-encoder): adapters only
    return [name for name, child in model.named_children() if name != "bert" and any(True for _ in child.parameters())]


def add_lora(model: nn.Module, r: int, alpha: float, dropout: float, targets: list[str], base: str) -> nn.Module:
    """Freeze `model` and put peft's LoRA layers on the linear layers `targets` names, the head
    trained whole; returns the same model (peft changes it in place), with `model.lora_adapter`.
    base: the folder of the base model (named in the saved adapter)."""
    peft = require_peft()
    chosen, split = resolve_targets(model, list(targets))
    if split:  # the qkv layers with an adapter on a part of them (the others stay fused)
        parts = {found.group(1) for name in chosen if (found := QKV_PART.match(name))}
        for name in sorted(parts):
            attention = model.get_submodule(name.removesuffix(".qkv"))
            attention.qkv = SplitQKV(attention.qkv)
    head = head_modules(model)
    config = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=chosen,
                             modules_to_save=head or None)
    wrapped = peft.get_peft_model(model, config)
    model = wrapped.base_model.model  # ours, with peft's layers in it (the wrapper is not kept)
    model.lora_adapter = Adapter(r, alpha, dropout, list(targets), chosen, head, str(base))
    return model


def is_lora(model: nn.Module) -> bool:
    return getattr(model, "lora_adapter", None) is not None


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """(parameters trained, all parameters)."""
    return (sum(p.numel() for p in model.parameters() if p.requires_grad), sum(p.numel() for p in model.parameters()))


# ---- the adapter alone, as HF peft saves it ---------------------------------------------------------

def adapter_names(model: nn.Module, keys: Any) -> dict[str, str]:
    """{our state dict key: the name HF peft saves it under} of the LoRA matrices and the head among
    `keys` ("bert.encoder.layers.0.attention.qkv.query.lora_A.default.weight" ->
    "base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight")."""
    from bert_kit.hf import to_hf_state_dict

    out = {}
    for key in keys:
        found = re.match(r"^(.*)\.(lora_[AB])\.default\.weight$", key)
        if found is not None:
            out[key] = f"{PEFT_PREFIX}{hf_module_name(model, found.group(1))}.{found.group(2)}.weight"
            continue
        found = re.match(r"^(.*)\.modules_to_save\.default\.(.*)$", key)
        if found is not None:
            ours = f"{found.group(1)}.{found.group(2)}"
            out[key] = PEFT_PREFIX + next(iter(to_hf_state_dict(model, {ours: torch.zeros(3, 1)})))
    return out


def adapter_tensors(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The LoRA matrices and the head of `model` (or of its state dict `state`, a copy taken
    earlier) under the names HF peft saves, on the CPU."""
    state = model.state_dict() if state is None else state
    return {hf: state[key].detach().cpu().contiguous() for key, hf in adapter_names(model, state).items()}


def save_adapter(model: nn.Module, folder: str | Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """adapter_model.safetensors + adapter_config.json (+ config.json, the head's labels) in `folder`."""
    from safetensors.torch import save_file

    from bert_kit.checks import writing
    from bert_kit.config import architecture_role
    from bert_kit.hf import hf_config

    peft = require_peft()
    adapter: Adapter = model.lora_adapter
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = adapter_tensors(model, state)
    role = architecture_role(getattr(model, "hf_architecture", "BertModel")).removeprefix("Bert")
    hf_names = {hf_module_name(model, name) for name in adapter.modules}
    head = sorted({k.removeprefix(PEFT_PREFIX).split(".")[0] for k in tensors if ".lora_" not in k})
    config = peft.LoraConfig(r=adapter.r, lora_alpha=adapter.alpha, lora_dropout=adapter.dropout,
                             target_modules=sorted({n.rsplit(".", 1)[-1] for n in hf_names}),
                             modules_to_save=head or None, task_type=TASK_TYPES.get(role),
                             base_model_name_or_path=adapter.base)
    tmp = folder / f"{ADAPTER_WEIGHTS}.tmp"
    with writing(tmp):
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(folder / ADAPTER_WEIGHTS)
    config.save_pretrained(str(folder))
    with writing(folder / "config.json"):
        (folder / "config.json").write_text(json.dumps(hf_config(model), indent=2) + "\n")


def is_adapter_folder(folder: str | Path) -> bool:
    """Whether `folder` holds a LoRA adapter without the base weights."""
    from bert_kit.weight_files import weights_present

    folder = Path(folder)
    return (folder / ADAPTER_CONFIG).is_file() and (folder / ADAPTER_WEIGHTS).is_file() and not weights_present(folder)


def read_adapter(folder: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(adapter_config.json, adapter_model.safetensors's tensors) of an adapter folder."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from bert_kit.checks import CorruptFileError, read_json
    from bert_kit.weight_files import check_finite

    folder = Path(folder)
    config = read_json(folder / ADAPTER_CONFIG)
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA" or "r" not in config:
        raise CorruptFileError(f"{folder / ADAPTER_CONFIG}: not the config of a LoRA adapter")
    try:
        tensors = load_file(str(folder / ADAPTER_WEIGHTS))
    except SafetensorError as e:
        raise CorruptFileError(f"{folder / ADAPTER_WEIGHTS} is not a readable safetensors file ({e})") from None
    check_finite(tensors, str(folder / ADAPTER_WEIGHTS))
    return config, tensors


def base_folder(folder: Path, config: dict[str, Any]) -> Path:
    """The base model folder an adapter names (a path, relative to the adapter folder or not, or a
    hub name with a local copy)."""
    from bert_kit.model_folder import resolve_model

    base = config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{folder / ADAPTER_CONFIG} names no base model (base_model_name_or_path)")
    for candidate in (Path(base).expanduser(), folder / base):
        if (candidate / "config.json").is_file():
            return candidate
    try:
        return Path(resolve_model(base))
    except (OSError, ValueError):
        raise FileNotFoundError(f"{folder / ADAPTER_CONFIG}: the base model {base!r} is not there: the adapter "
                                "needs the model it was trained on") from None


def load_adapter_into(model: nn.Module, folder: str | Path) -> None:
    """Set the LoRA matrices and head of `model` (with `add_lora`'s layers) from an adapter folder
    (a checkpoint of a LoRA run, or its best/). Every tensor must match, both ways."""
    _, tensors = read_adapter(folder)
    state = model.state_dict()
    names = adapter_names(model, state)
    missing, unknown = sorted(set(names.values()) - set(tensors)), sorted(set(tensors) - set(names.values()))
    if missing or unknown:
        raise ValueError(f"{Path(folder) / ADAPTER_WEIGHTS} does not fit this model's adapters: "
                         f"missing {missing[:3]}, unexpected {unknown[:3]}")
    with torch.no_grad():
        for key, hf in names.items():
            if tensors[hf].shape != state[key].shape:
                raise ValueError(f"{Path(folder) / ADAPTER_WEIGHTS}: {hf} has shape {tuple(tensors[hf].shape)}, "
                                 f"this model's {tuple(state[key].shape)} (another rank or model?)")
            state[key].copy_(tensors[hf])


def merge(model: nn.Module) -> nn.Module:
    """Fold the adapters into the weights (peft's `merge` of each LoRA layer) and put back plain
    layers: the trained head, one fused `qkv`. Returns the same model, with no trace of peft."""
    require_peft()
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils import ModulesToSaveWrapper

    replace = []
    for name, module in model.named_modules():
        if isinstance(module, BaseTunerLayer):
            module.merge()
            replace.append((name, module.get_base_layer()))
        elif isinstance(module, ModulesToSaveWrapper):
            replace.append((name, next(iter(module.modules_to_save.values()))))  # the trained copy
    for name, plain in replace:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, plain)
    for module in list(model.modules()):
        if isinstance(getattr(module, "qkv", None), SplitQKV):
            module.qkv = module.qkv.fused()
    model.requires_grad_(True)
    for attr in ("lora_adapter", "peft_config"):
        if hasattr(model, attr):
            delattr(model, attr)
    return model


def load_merged(cls: type, folder: str | Path, dtype: torch.dtype | None = None, **head_args: Any) -> nn.Module:
    """`cls` with the base model's weights and the adapter of `folder` merged into them: a plain model."""
    import warnings

    from bert_kit.hf import NewWeightsWarning

    folder = Path(folder)
    strict = head_args.pop("strict", False)  # the head must come from the adapter (the base has none)
    config, tensors = read_adapter(folder)
    base = base_folder(folder, config)
    head = {k.removeprefix(PEFT_PREFIX): v for k, v in tensors.items() if ".lora_" not in k}
    if strict and not head and cls.__name__ != "BERTModel":
        raise ValueError(f"{folder / ADAPTER_WEIGHTS} holds no head for {cls.__name__} (modules_to_save)")
    labels = json.loads((folder / "config.json").read_text()).get("id2label") if (folder / "config.json").is_file() \
        else None
    if "classifier.weight" in head and "num_labels" not in head_args and cls.__name__ != "BERTModel":
        head_args["num_labels"] = head["classifier.weight"].shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NewWeightsWarning)  # the head comes from the adapter, below
        model = cls.from_pretrained(base, dtype=dtype, **head_args)  # (itself an adapter folder, maybe)
    targets = config.get("target_modules") or []
    model = add_lora(model, int(config["r"]), float(config.get("lora_alpha", config["r"])), 0.0,
                     [targets] if isinstance(targets, str) else list(targets), str(base))
    load_adapter_into(model, folder)
    model = merge(model)
    if labels and hasattr(model, "num_labels") and len(labels) == model.num_labels:
        model.id2label = {int(k): v for k, v in labels.items()}
    return model.eval()
