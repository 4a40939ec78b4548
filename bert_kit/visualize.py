"""Attention maps: every layer's and head's attention probabilities, and the `bert-kit attention` PNG.

The model's fast path never forms the attention matrix (`F.scaled_dot_product_attention` fuses
softmax(QK^T / sqrt(d)) V), so this module computes it explicitly from the model's own weights:
the encoder is run layer by layer with the real layer modules, and before each layer the
query and key rows of its fused `attention.qkv` projection give

    P = softmax(Q K^T / sqrt(head_dim) + mask)      (B, nh, T, T), padding keys at probability 0.

Nothing in `model.py` changes; `attention_maps` also returns the hidden state after every layer,
which the tests check against the model's own forward pass.

    bert-kit attention --model sentence-transformers/all-MiniLM-L6-v2 --text "The cat sat on the mat." --output attn.png
"""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from bert_kit.checks import ConfigError
from bert_kit.outputs import write_file
from bert_kit.model import BERTModel, MultiHeadAttention

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# with more tokens than this the axis labels would overlap, so they are left off
MAX_LABELLED_TOKENS = 40


def attention_probabilities(attention: MultiHeadAttention, x: torch.Tensor,
                            attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention probabilities of one layer: x (B, T, H), mask (B, T) -> (B, nh, T, T) float32.

    Uses the query and key rows of the layer's fused qkv projection (rows [query; key; value]).
    """
    B, T, H = x.shape
    nh, hd = attention.num_heads, attention.head_dim
    qkv = attention.qkv(x).view(B, T, 3, nh, hd).permute(2, 0, 3, 1, 4).float()  # (3, B, nh, T, hd)
    q, k = qkv[0], qkv[1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)  # (B, nh, T, T)
    if attention_mask is not None:
        keep = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): padding keys get nothing
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores.softmax(dim=-1)


@torch.inference_mode()
def attention_maps(model: BERTModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   token_type_ids: torch.Tensor | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Run the encoder layer by layer, recording states and attention.

    input_ids, attention_mask, token_type_ids: (B, T).
    Returns (hidden_states, attentions): hidden_states is a list of L + 1 tensors (B, T, H) (the
    embedding output, then the output of each layer: the last equals `model(...)`), attentions
    is (L, B, nh, T, T) float32 with rows summing to 1.
    """
    was_training = model.training
    model.eval()  # no dropout: the maps are those of inference
    try:
        x = model.embeddings(input_ids, token_type_ids)  # (B, T, H)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
        hidden_states, attentions = [x], []
        for layer in model.encoder.layers:
            attentions.append(attention_probabilities(layer.attention, x, attention_mask))
            x = layer(x, mask)  # the real layer module, so the states are the model's own
            hidden_states.append(x)
    finally:
        model.train(was_training)
    return hidden_states, torch.stack(attentions)


def _parse_indices(spec: str | None, n: int, what: str) -> list[int]:
    """"0,2,5" or "1-3" or None (all) -> sorted indices, each checked against n: a part that is no
    index or range, a range written high to low, or an index past the model's is a ConfigError."""
    if spec is None or spec == "all":
        return list(range(n))
    out: set[int] = set()
    for part in spec.split(","):
        found = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if found is None:
            raise ConfigError(f"--{what} {spec}: cannot read {part.strip()!r}; use e.g. 0,2,5 or 1-3 (0-based)")
        lo, hi = int(found[1]), int(found[2] or found[1])
        if lo > hi:
            raise ConfigError(f"--{what} {spec}: the range {part.strip()} runs from high to low; write {hi}-{lo}")
        if hi >= n:
            raise ConfigError(f"--{what} {spec}: index {hi} is out of range: the model has {n} {what}, 0-{n - 1}")
        out.update(range(lo, hi + 1))
    return sorted(out)


def attention_title(model: str, text: str, text_pair: str | None = None, width: int = 60) -> str:
    """"MODEL: attention over 'TEXT' + 'PAIR'", each text cut to `width` characters."""
    def cut(t: str) -> str:
        return repr(t if len(t) <= width else t[: width - 3] + "...")

    return f"{model}: attention over {cut(text)}" + (f" + {cut(text_pair)}" if text_pair else "")


def attention_figure(attentions: torch.Tensor | np.ndarray, tokens: Sequence[str],
                     layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                     title: str | None = None) -> Figure:
    """A matplotlib Figure of attention maps: rows = layers, columns = heads.

    attentions: (L, nh, T, T) for one text, rows the queries (the attending tokens), columns the
    keys (the tokens attended to); tokens: T labels, drawn on the axes of the first column and the
    last row when there are at most MAX_LABELLED_TOKENS. One colour scale, 0 to 1, for every map,
    shown by the colour bar; "query" and "key" name the axes; `title` above all.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    att = attentions.detach().cpu().numpy() if torch.is_tensor(attentions) else np.asarray(attentions)
    if att.ndim != 4 or att.shape[2] != att.shape[3] or att.shape[2] != len(tokens):
        raise ValueError(f"attentions must be (layers, heads, T, T) with T = {len(tokens)} tokens, got {att.shape}")
    layers = list(range(att.shape[0])) if layers is None else list(layers)
    heads = list(range(att.shape[1])) if heads is None else list(heads)
    labelled = len(tokens) <= MAX_LABELLED_TOKENS
    cell = 1.6 if not labelled else max(1.6, 0.12 * len(tokens))
    fig = Figure(figsize=(cell * len(heads) + 2.5, cell * len(layers) + 1.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(layers), len(heads), squeeze=False)
    image = None
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            image = ax.imshow(att[layer, head], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"head {head}", fontsize=8)
            if c == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=8)
            if labelled and c == 0:  # queries on the left column
                ax.set_yticks(range(len(tokens)), tokens, fontsize=5)
            if labelled and r == len(layers) - 1:  # keys under the bottom row
                ax.set_xticks(range(len(tokens)), tokens, fontsize=5, rotation=90)
    fig.colorbar(image, ax=axes, label="attention probability", shrink=min(1.0, 0.3 + 0.2 * len(layers)))
    fig.supylabel("query (the token attending), one row per token", fontsize=9)
    fig.supxlabel("key (the token attended to), one column per token", fontsize=9)
    if title:
        fit_title(fig, title)
    return fig


def fit_title(fig: Figure, title: str, fontsize: float = 10.0) -> None:
    """`title` above the figure, wrapped at spaces to the figure's width (a title of two texts
    is wider than a grid of a few heads, and was clipped), in smaller type if a line still does not fit."""
    renderer = fig.canvas.get_renderer()
    room = 0.96 * fig.bbox.width  # pixels
    text = fig.suptitle(title, fontsize=fontsize)
    chars = max(12, int(room / (0.6 * fontsize * fig.dpi / 72)))  # a character is about 0.6 em wide
    while True:
        text.set_text("\n".join(textwrap.wrap(title, chars, break_on_hyphens=False)))
        width = text.get_window_extent(renderer).width
        if width <= room:
            return
        if chars > 12:
            chars = max(12, int(chars * room / width) - 1)
        elif text.get_fontsize() > 5:
            text.set_fontsize(text.get_fontsize() - 1)
        else:
            return


def plot_attention_grid(attentions: torch.Tensor | np.ndarray, tokens: Sequence[str], path: str | Path,
                        layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                        title: str | None = None) -> Path:
    """Write `attention_figure(...)` as a PNG; returns the path."""
    fig = attention_figure(attentions, tokens, layers, heads, title)
    write_file(path, lambda f: fig.savefig(f, format="png", dpi=110), binary=True)  # whole, through a link
    return Path(path)
