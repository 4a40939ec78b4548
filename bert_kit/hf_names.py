"""What each family's HF folders call the weights of bert-kit's classes: one mapping per family,
our name -> HF name, inverted for import (`bert_kit.hf` does the renaming).

"{i}" stands for the layer index. Encoder weights sit under the family's prefix in HF's head
classes (`bert.`, `roberta.`, `distilbert.`, `model.`) and under `bert.` in ours; head weights
sit at the top level in both. Where HF names one of our weights two ways depending on the head
(RoBERTa's sequence classifier is `classifier.dense` + `classifier.out_proj`, its token
classifier a bare `classifier`), `by_head` holds the names of that head. BERT, RoBERTa and
DistilBERT keep query, key and value apart (`qkv`): bert-kit fuses them into one projection.
Imports neither torch nor NumPy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


def _pair(ours: str, hf: str) -> dict[str, str]:
    """A layer's weight and bias."""
    return {f"{ours}.weight": f"{hf}.weight", f"{ours}.bias": f"{hf}.bias"}


def _layers(hf: str, parts: dict[str, str]) -> dict[str, str]:
    """Per-layer names: our encoder.layers.{i}.X -> HF's `hf`.{i}.Y for each X: Y of `parts`."""
    out = {}
    for ours, theirs in parts.items():
        out.update(_pair(f"encoder.layers.{{i}}.{ours}", f"{hf}.{{i}}.{theirs}"))
    return out


# BERT: the encoder (RoBERTa's too) and its heads
_BERT_ENCODER = {
    "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
    "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
    **_pair("embeddings.norm", "embeddings.LayerNorm"),
    **_layers("encoder.layer", {"attention.out": "attention.output.dense",
                                "attention_norm": "attention.output.LayerNorm",
                                "ffn.up": "intermediate.dense", "ffn.down": "output.dense",
                                "ffn_norm": "output.LayerNorm"}),
}
# `logit_scale`: an embedding model's learned contrastive scale (`tasks.embedding.EmbeddingModel`), in its checkpoints
_COMMON_HEADS = {**_pair("classifier", "classifier"), **_pair("qa_outputs", "qa_outputs"), "logit_scale": "logit_scale"}
TO_HF = {
    **_BERT_ENCODER,
    **_pair("pooler.dense", "pooler.dense"),
    **_pair("mlm.dense", "cls.predictions.transform.dense"),
    **_pair("mlm.norm", "cls.predictions.transform.LayerNorm"),
    "mlm.decoder.bias": "cls.predictions.bias",
    **_pair("nsp", "cls.seq_relationship"),
    **_COMMON_HEADS,
}

ROBERTA_TO_HF = {
    **_BERT_ENCODER,
    **_pair("pooler.dense", "pooler.dense"),
    **_pair("mlm.dense", "lm_head.dense"),
    **_pair("mlm.norm", "lm_head.layer_norm"),
    "mlm.decoder.bias": "lm_head.bias",
    **_COMMON_HEADS,
}

DISTILBERT_TO_HF = {
    "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
    "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
    **_pair("embeddings.norm", "embeddings.LayerNorm"),
    **_layers("transformer.layer", {"attention.out": "attention.out_lin", "attention_norm": "sa_layer_norm",
                                    "ffn.up": "ffn.lin1", "ffn.down": "ffn.lin2", "ffn_norm": "output_layer_norm"}),
    **_pair("mlm.dense", "vocab_transform"),
    **_pair("mlm.norm", "vocab_layer_norm"),
    "mlm.decoder.bias": "vocab_projector.bias",
    **_pair("pre_classifier", "pre_classifier"),
    **_COMMON_HEADS,
}

MODERNBERT_TO_HF = {
    "embeddings.word_embeddings.weight": "embeddings.tok_embeddings.weight",
    **_pair("embeddings.norm", "embeddings.norm"),
    **_pair("layers.{i}.attention_norm", "layers.{i}.attn_norm"),
    **_pair("layers.{i}.attention.qkv", "layers.{i}.attn.Wqkv"),
    **_pair("layers.{i}.attention.out", "layers.{i}.attn.Wo"),
    **_pair("layers.{i}.ffn_norm", "layers.{i}.mlp_norm"),
    **_pair("layers.{i}.ffn.up", "layers.{i}.mlp.Wi"),
    **_pair("layers.{i}.ffn.down", "layers.{i}.mlp.Wo"),
    **_pair("final_norm", "final_norm"),
    **_pair("head.dense", "head.dense"),
    **_pair("head.norm", "head.norm"),
    "decoder.bias": "decoder.bias",
    **_pair("classifier", "classifier"),
    "logit_scale": "logit_scale",
}

BUFFERS = r"(^|\.)(position_ids|token_type_ids)$"  # HF buffers some folders hold: nothing of ours


@dataclass(frozen=True)
class Names:
    """How one family's HF folders name the weights of bert-kit's classes."""

    to_hf: dict[str, str]  # our name -> HF name ("{i}": the layer index)
    prefix: str  # the encoder's name in HF's head classes
    heads: tuple[str, ...]  # our head weights start with one of these (top level of the head classes)
    tied: tuple[str, str]  # (ours, HF's) MLM decoder weight, the word embeddings themselves
    qkv: str | None = None  # HF's separate query/key/value layers: "{i}", "{part}" and "{kind}" (weight | bias)
    qkv_parts: tuple[str, str, str] = ("query", "key", "value")
    skip: str = BUFFERS  # a regex of HF keys that hold nothing of ours
    aliases: dict[str, str] = field(default_factory=dict)  # a second HF name of a weight -> the one read
    by_head: dict[str, dict[str, str]] = field(default_factory=dict)  # head role -> its names that differ

    def for_head(self, role: str) -> "Names":
        """These names with a head's own ("ForSequenceClassification", as HF's class names end)."""
        if role not in self.by_head:
            return self
        return Names({**self.to_hf, **self.by_head[role]}, self.prefix, self.heads, self.tied, self.qkv,
                     self.qkv_parts, self.skip, self.aliases)

    @property
    def from_hf(self) -> dict[str, str]:
        """HF name -> ours, every head's names included (a name means one weight of ours)."""
        out = {v: k for k, v in self.to_hf.items()}
        for names in self.by_head.values():
            out.update({v: k for k, v in names.items()})
        return out

    @property
    def qkv_pattern(self) -> re.Pattern | None:
        """Matches one of HF's query/key/value weights: groups (layer, part, kind)."""
        if self.qkv is None:
            return None
        parts = "|".join(self.qkv_parts)
        escaped = re.escape(self.qkv)
        for slot, group in (("{i}", r"(\d+)"), ("{part}", f"({parts})"), ("{kind}", "(weight|bias)")):
            escaped = escaped.replace(re.escape(slot), group)
        return re.compile(escaped)


BERT_HEADS = ("mlm.", "nsp.", "classifier.", "qa_outputs.", "pre_classifier.", "logit_scale")
QKV = "encoder.layers.{i}.attention.qkv.{kind}"  # our fused projection (BERT's layout)

FAMILY_NAMES = {
    "bert": Names(TO_HF, "bert.", BERT_HEADS, ("mlm.decoder.weight", "cls.predictions.decoder.weight"),
                  qkv="encoder.layer.{i}.attention.self.{part}.{kind}",
                  aliases={"cls.predictions.decoder.bias": "cls.predictions.bias"}),
    # RoBERTa's folders may hold the pooler of HF's RobertaModel: no head of either family reads it
    "roberta": Names(ROBERTA_TO_HF, "roberta.", BERT_HEADS, ("mlm.decoder.weight", "lm_head.decoder.weight"),
                     qkv="encoder.layer.{i}.attention.self.{part}.{kind}", skip=BUFFERS + r"|(^|\.)pooler\.",
                     aliases={"lm_head.decoder.bias": "lm_head.bias"},
                     by_head={"ForSequenceClassification": {**_pair("pre_classifier", "classifier.dense"),
                                                            **_pair("classifier", "classifier.out_proj")}}),
    "distilbert": Names(DISTILBERT_TO_HF, "distilbert.", BERT_HEADS, ("mlm.decoder.weight", "vocab_projector.weight"),
                        qkv="transformer.layer.{i}.attention.{part}.{kind}", qkv_parts=("q_lin", "k_lin", "v_lin")),
    "modernbert": Names(MODERNBERT_TO_HF, "model.", ("head.", "decoder.", "classifier.", "logit_scale"),
                        ("decoder.weight", "decoder.weight")),
}
FAMILY_NAMES["xlm-roberta"] = FAMILY_NAMES["roberta"]

# the start of the MLM head's weight names in each family's folders (ModernBERT's `head.` is also
# the classifiers' dense layer: there it is an MLM head when no classifier sits beside it)
_MLM_PREFIX = {"bert": "cls.predictions.", "roberta": "lm_head.", "xlm-roberta": "lm_head.",
               "distilbert": "vocab_transform.", "modernbert": "head."}


def holds_mlm_head(keys: list[str], model_type: str = "bert") -> bool:
    """Whether HF weight names (a folder's) hold the family's MLM head."""
    if model_type == "modernbert" and any(k == "classifier.weight" for k in keys):
        return False
    return any(k.startswith(_MLM_PREFIX.get(model_type, "cls.predictions.")) for k in keys)
