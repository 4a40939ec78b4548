"""Attention maps: the layer-by-layer run reproduces the model's hidden states, the probabilities
match transformers' eager attention on the real MiniLM weights, and the CLI writes a PNG grid.

Run: .venv/bin/python -m pytest tests/test_visualize.py -q
"""

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from bert_kit.cli import main as cli_main
from bert_kit.config import BertConfig
from bert_kit.model import BERTModel
from bert_kit.visualize import _parse_indices, attention_maps, attention_probabilities, plot_attention_grid

TINY = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=32)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def padded_batch():
    torch.manual_seed(0)
    ids = torch.randint(5, 100, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    types = torch.zeros_like(ids)
    types[0, 5:] = 1
    return ids, mask, types


def layer_outputs_by_hooks(model, ids, mask, types):
    """The model's own per-layer outputs, captured by forward hooks during a normal forward."""
    captured = []
    hooks = [layer.register_forward_hook(lambda m, inp, out: captured.append(out.detach()))
             for layer in model.encoder.layers]
    try:
        with torch.no_grad():
            last = model(ids, mask, types)
    finally:
        for h in hooks:
            h.remove()
    return captured, last


def test_hidden_states_equal_the_models():
    torch.manual_seed(1)
    model = BERTModel(TINY).eval()
    ids, mask, types = padded_batch()
    hidden, attn = attention_maps(model, ids, mask, types)
    expected, last = layer_outputs_by_hooks(model, ids, mask, types)
    assert len(hidden) == TINY.num_hidden_layers + 1 and attn.shape == (3, 3, 4, 9, 9)
    keep = mask.bool()
    for mine, theirs in zip(hidden[1:], expected):
        assert_close(mine[keep], theirs[keep], rtol=1e-6, atol=1e-6)
    assert_close(hidden[-1][keep], last[keep], rtol=1e-6, atol=1e-6)


def test_probabilities_reproduce_the_attention_output():
    """P @ V through the output projection equals the layer's SDPA attention output."""
    torch.manual_seed(2)
    model = BERTModel(TINY).eval()
    ids, mask, types = padded_batch()
    with torch.no_grad():
        x = model.embeddings(ids, types)
        att = model.encoder.layers[0].attention
        probs = attention_probabilities(att, x, mask)  # (B, nh, T, T)
        v = att.qkv(x).view(3, 9, 3, 4, 8)[:, :, 2].transpose(1, 2)  # (B, nh, T, hd)
        manual = att.out((probs @ v).transpose(1, 2).reshape(3, 9, 32))
        expect = att(x, mask.bool()[:, None, None, :])
    assert_close(manual, expect, rtol=1e-5, atol=1e-6)
    assert_close(probs.sum(-1), torch.ones(3, 4, 9), rtol=0, atol=1e-6)
    assert float(probs[2, :, :, 3:].abs().max()) == 0.0  # padding keys get no attention


def test_attention_matches_transformers_on_minilm(minilm_path):
    transformers = pytest.importorskip("transformers")
    from bert_kit.tokenizer import get_tokenizer

    texts = ["The quick brown fox jumps over the lazy dog.", "A short one."]
    enc = get_tokenizer(minilm_path)(texts)
    ours = BERTModel.from_pretrained(minilm_path)
    ref = transformers.BertModel.from_pretrained(minilm_path, attn_implementation="eager").eval()
    hidden, attn = attention_maps(ours, enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    with torch.no_grad():
        out = ref(**enc, output_attentions=True, output_hidden_states=True)
    keep = enc["attention_mask"].bool()
    assert_close(attn, torch.stack(out.attentions), rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(hidden, out.hidden_states):
        assert_close(mine[keep], theirs[keep], rtol=1e-5, atol=1e-5)


def test_attention_cli_writes_png(tmp_path, minilm_path, capsys):
    import matplotlib.image

    out = tmp_path / "attn.png"
    rc = cli_main(["attention", "--model", str(minilm_path), "--text", "The cat sat on the mat.",
                   "--output", str(out), "--save-npy", str(tmp_path / "attn.npy")])
    assert rc == 0 and "6 layers x 12 heads over 9 tokens" in capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    grid = matplotlib.image.imread(out)
    assert grid.shape[1] > grid.shape[0]  # 12 head columns are wider than 6 layer rows
    saved = np.load(tmp_path / "attn.npy")
    assert saved.shape == (6, 12, 9, 9)
    np.testing.assert_allclose(saved.sum(-1), 1.0, atol=1e-5)
    small = tmp_path / "small.png"
    assert cli_main(["attention", "--model", str(minilm_path), "--text", "hello world",
                     "--output", str(small), "--layers", "0,5", "--heads", "0-1"]) == 0
    assert matplotlib.image.imread(small).shape[0] < grid.shape[0]
    # a layer the model does not have is a one-line user error
    assert cli_main(["attention", "--model", str(minilm_path), "--text", "hi", "--output",
                     str(small), "--layers", "7"]) == 2  # a wrong flag: exit 2
    assert "--layers 7: index 7 is out of range: the model has 6 layers, 0-5" in capsys.readouterr().err


def test_index_parsing_and_shape_errors(tmp_path):
    assert _parse_indices("0,2-4", 6, "layers") == [0, 2, 3, 4]
    assert _parse_indices(None, 3, "heads") == [0, 1, 2]
    with pytest.raises(ValueError, match="cannot read"):
        _parse_indices("a", 3, "heads")
    # a range written high to low drew an empty grid: matplotlib's "Number of rows must be a positive integer"
    with pytest.raises(ValueError, match=r"^--layers 1-0: the range 1-0 runs from high to low; write 0-1$"):
        _parse_indices("1-0", 2, "layers")
    for spec in ("1-", "-1", "", "0,,1", "1 - 2", "0x1"):
        with pytest.raises(ValueError, match=r"cannot read .*; use e\.g\. 0,2,5 or 1-3"):
            _parse_indices(spec, 3, "heads")
    with pytest.raises(ValueError, match=r"--heads 0-3: index 3 is out of range: the model has 3 heads, 0-2"):
        _parse_indices("0-3", 3, "heads")
    with pytest.raises(ValueError, match="T = 2 tokens"):
        plot_attention_grid(np.zeros((1, 1, 3, 3)), ["a", "b"], tmp_path / "x.png")


def test_figure_has_colour_bar_axis_names_and_a_title_with_model_and_texts(tmp_path, minilm_path, capsys,
                                                                           monkeypatch):
    import bert_kit.visualize as visualize
    from bert_kit.visualize import attention_figure, attention_title

    att = torch.softmax(torch.randn(2, 3, 4, 4), dim=-1)
    title = attention_title("org/model", "The cat sat.", "It was tired.")
    assert title == "org/model: attention over 'The cat sat.' + 'It was tired.'"
    assert attention_title("m", "x" * 100, None) == f"m: attention over '{'x' * 57}...'"
    fig = attention_figure(att, ["[CLS]", "a", "b", "[SEP]"], title=title)
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 1 and bars[0].get_ylabel() == "attention probability"
    assert tuple(bars[0].get_ylim()) == (0.0, 1.0)  # one scale for every map
    assert fig.get_suptitle().replace("\n", " ") == title  # wrapped to the figure's width where wider
    assert fig.get_supylabel().startswith("query") and fig.get_supxlabel().startswith("key")
    grid = [ax for ax in fig.axes if ax not in bars]
    assert len(grid) == 6 and grid[0].get_title() == "head 0" and grid[0].get_ylabel() == "layer 0"
    # the command names the model as given and both texts
    titles = []
    monkeypatch.setattr(visualize, "plot_attention_grid",  # the command imports it when it runs
                        lambda *a, title, **k: titles.append(title) or plot_attention_grid(*a, title=title, **k))
    out = tmp_path / "pair.png"
    assert cli_main(["attention", "--model", str(minilm_path), "--text", "The cat sat.", "--text-pair",
                     "It was tired.", "--output", str(out), "--layers", "0", "--heads", "0-1",
                     "--device", "cpu"]) == 0
    assert "1 layers x 2 heads over 11 tokens" in capsys.readouterr().out and out.is_file()
    assert titles == [f"{minilm_path}: attention over 'The cat sat.' + 'It was tired.'"]


@pytest.mark.parametrize("layers, heads", [(1, 1), (2, 3)])
def test_a_long_title_fits_the_figure(layers, heads):
    """The title of a model path and two texts (up to 60 characters each) was one line wider than a
    figure of a few heads, clipped at both sides: it is wrapped (or set smaller) inside the figure."""
    from bert_kit.visualize import attention_figure, attention_title

    title = attention_title("runs/demo/pretrain/final/a-long-model-folder-name",
                            "anna lives in rome. rome is a city in italy. she works as a baker there.",
                            "she speaks italian at home and her dog barks at the postman every day.")
    att = torch.softmax(torch.randn(layers, heads, 5, 5), dim=-1)
    fig = attention_figure(att, ["[CLS]", "anna", "lives", "in", "[SEP]"], title=title)
    fig.canvas.draw()  # the layout is done when drawn
    renderer, frame = fig.canvas.get_renderer(), fig.bbox
    for text in (fig._suptitle, fig._supxlabel, fig._supylabel):
        box = text.get_window_extent(renderer)
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, text
    assert "".join(fig.get_suptitle().split()) == "".join(title.split())  # all of it, only wrapped
