"""SentenceEncoder's batching: token-budget batches, the tokenizing thread, precision.

Every text's vector must not depend on the batch it ran in: each is checked against the text
run alone through the padded model (what `encode` computed before batches held a token budget),
with texts from one character to far past max_length, in shuffled order. GPU tests (bf16
against fp32, the asynchronous copies) skip on the CPU:

    .venv/bin/python -m pytest tests/test_embeddings_batching.py -q
"""

import threading

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from bert_kit import embeddings
from bert_kit.config import BertConfig
from bert_kit.embeddings import SentenceEncoder, inference_dtype, mean_pool, token_batches
from bert_kit.model import BERTModel
from bert_kit.tokenizer import get_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

WORDS = "the patient was given a daily dose of vitamin d and followed for twelve months".split()


def varied_texts(n: int = 60, seed: int = 0) -> list[str]:
    """Texts of 0 to 300 words (past max_length=64 tokens), some repeated, in random order."""
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=int(k))) for k in rng.integers(0, 300, size=n)]
    texts += ["", "a", "x y", texts[3], "Hello, world!"]
    return [texts[i] for i in rng.permutation(len(texts))]


@pytest.fixture(scope="module")
def tiny(minilm_path):
    """A seeded 2-layer BERT with MiniLM's vocabulary and tokenizer."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=128)
    return BERTModel(config).eval(), get_tokenizer(minilm_path)


def alone(model, tokenizer, texts, pooling="mean", normalize=True, max_length=64) -> np.ndarray:
    """Each text through the padded model on its own (no batch, no packing)."""
    rows = []
    with torch.no_grad():
        for text in texts:
            enc = tokenizer([text], max_length=max_length)
            hidden = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
            v = mean_pool(hidden, enc["attention_mask"]) if pooling == "mean" else hidden[:, 0]
            rows.append(torch.nn.functional.normalize(v, dim=-1) if normalize else v)
    return torch.cat(rows).numpy()


def test_token_batches_hold_the_padded_budget():
    # texts x the longest (first) text of each batch stays within the budget
    assert token_batches([10, 9, 9, 3, 3, 3, 2], 20) == [slice(0, 2), slice(2, 4), slice(4, 7)]
    assert token_batches([50, 4, 4], 20) == [slice(0, 1), slice(1, 3)]  # too long for the budget: alone
    assert token_batches([3] * 10, 30, max_texts=4) == [slice(0, 4), slice(4, 8), slice(8, 10)]
    assert token_batches([], 8) == []


@pytest.mark.parametrize("budget, batch_size, chunk", [(None, None, 4096), (70, None, 4096), (600, None, 7),
                                                       (10**6, 5, 13), (10**6, None, 4096)])
def test_every_batching_gives_each_text_its_own_vector_in_input_order(tiny, monkeypatch, budget, batch_size, chunk):
    model, tokenizer = tiny
    monkeypatch.setattr(embeddings, "CHUNK_TEXTS", chunk)  # several tokenizing chunks on a small input
    texts = varied_texts()
    encoder = SentenceEncoder(model, tokenizer, max_length=64, device="cpu", max_tokens_per_batch=budget)
    got = encoder.encode(texts, batch_size=batch_size)
    assert got.shape == (len(texts), 32) and got.dtype == np.float32
    np.testing.assert_allclose(got, alone(model, tokenizer, texts), rtol=0, atol=1e-5)


@pytest.mark.parametrize("budget, batch_size", [(None, None), (70, None), (10**6, 5)])
def test_texts_tokenized_first_get_the_vectors_of_encode(tiny, budget, batch_size):
    """`encode_tokenized(tokenize(texts))` (what `bert-kit embed` runs: the texts tokenized once,
    sorted by tokens across the whole input) gives each text the vector `encode` gives it."""
    model, tokenizer = tiny
    texts = varied_texts(seed=3)
    encoder = SentenceEncoder(model, tokenizer, max_length=64, device="cpu", max_tokens_per_batch=budget)
    ids = encoder.tokenize(texts)
    counted = []
    got = encoder.encode_tokenized(ids, batch_size=batch_size, progress=counted.append)
    assert got.shape == (len(texts), 32) and got.dtype == np.float32 and sum(counted) == len(texts)
    np.testing.assert_allclose(got, encoder.encode(texts, batch_size=batch_size), rtol=0, atol=1e-6)
    np.testing.assert_allclose(got, alone(model, tokenizer, texts), rtol=0, atol=1e-5)
    tensor = encoder.encode_tokenized(ids, convert_to_tensor=True)
    assert_close(tensor, torch.from_numpy(got), rtol=0, atol=1e-6)
    assert encoder.encode_tokenized([]).shape == (0, 32)


def test_ids_are_checked_on_the_host(tiny):
    """Ids the model has no row for, or an empty row, fail on the host with the model's message,
    before any batch runs."""
    model, tokenizer = tiny
    encoder = SentenceEncoder(model, tokenizer, max_length=64, device="cpu")
    with pytest.raises(ValueError, match="token id 30522 out of range for vocab_size 30522"):
        encoder.encode_tokenized([[101, 2000, 102], [101, 30522, 102]])
    with pytest.raises(ValueError, match="token id -1 out of range"):
        encoder.host_batch([[101, -1, 102]])
    with pytest.raises(ValueError, match=r"ids\[0\] is empty"):
        encoder.encode_tokenized([[], [101, 102]])
    with pytest.raises(ValueError, match="batch_size=0 is out of range"):
        encoder.encode_tokenized([[101, 102]], batch_size=0)


def test_cls_pooling_raw_vectors_and_the_padded_path(tiny):
    model, tokenizer = tiny
    texts = varied_texts(30, seed=1)
    expect = alone(model, tokenizer, texts, pooling="cls", normalize=False)
    for unpadded in (True, False):
        encoder = SentenceEncoder(model, tokenizer, "cls", normalize=False, max_length=64, device="cpu",
                                  unpadded=unpadded, max_tokens_per_batch=200)
        np.testing.assert_allclose(encoder.encode(texts), expect, rtol=0, atol=1e-5)


def test_tensor_output_progress_and_single_text(tiny):
    model, tokenizer = tiny
    texts = varied_texts(25, seed=2)
    encoder = SentenceEncoder(model, tokenizer, max_length=64, device="cpu", max_tokens_per_batch=300)
    counted = []
    array = encoder.encode(texts, progress=counted.append)
    assert sum(counted) == len(texts) and len(counted) > 1
    tensor = encoder.encode(texts, convert_to_tensor=True)
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
    assert_close(tensor, torch.from_numpy(array), rtol=0, atol=1e-6)
    np.testing.assert_allclose(encoder.encode(texts[4]), array[4], rtol=0, atol=1e-6)
    assert encoder.encode([]).shape == (0, 32)


def test_errors_name_the_input_and_stop_the_batching_thread(tiny, monkeypatch):
    model, tokenizer = tiny
    encoder = SentenceEncoder(model, tokenizer, max_length=64, device="cpu")
    with pytest.raises(ValueError, match=r"texts\[1\] holds a lone surrogate"):
        encoder.encode(["fine", "bad \ud800 text"])  # named by its place in the input, not in a sorted chunk
    calls = []

    def failing(texts):
        calls.append(len(texts))
        if len(calls) == 2:
            raise RuntimeError("tokenizer broke")
        return SentenceEncoder.tokenize(encoder, texts)

    monkeypatch.setattr(embeddings, "CHUNK_TEXTS", 5)
    monkeypatch.setattr(encoder, "tokenize", failing)
    with pytest.raises(RuntimeError, match="tokenizer broke"):
        encoder.encode(varied_texts(20))
    assert not [t for t in threading.enumerate() if t.name == "embed-batches"]


def test_encode_checks_ids_on_the_host_and_skips_the_models_check(tiny, minilm_path, monkeypatch):
    """The model's check reads the ids back from the device (a wait every batch on a GPU): `encode`
    checks them on the host instead and skips it; `encode_ids` keeps the model's check too."""
    import bert_kit.input_checks

    model, tokenizer = tiny
    checked = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: checked.append(
        not bert_kit.input_checks._inputs_checked_by_caller) or forward(*a, **k))
    encoder = SentenceEncoder(model, tokenizer, max_length=64, device="cpu", max_tokens_per_batch=100)
    encoder.encode(varied_texts(10))
    assert checked and not any(checked)
    checked.clear()
    encoder.encode_ids([[101, 2000, 102]])
    assert checked == [True]
    small = BERTModel(BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=128))
    with pytest.raises(ValueError, match="out of range for vocab_size 1000"):
        SentenceEncoder(small, tokenizer, max_length=64, device="cpu").encode(["a word outside the first thousand"])


def test_precision_choices_and_bf16_autocast_on_the_cpu(minilm_path):
    assert inference_dtype("auto", torch.device("cpu")) == torch.float32
    assert inference_dtype("fp16", torch.device("cpu")) == torch.float16
    with pytest.raises(ValueError, match="precision='fp8'"):
        inference_dtype("fp8", torch.device("cpu"))
    texts = ["A man is eating food.", "Statins and breast cancer survival in Finland", "x"]
    fp32 = SentenceEncoder.from_pretrained(minilm_path, device="cpu", precision="fp32").encode(texts)
    bf16 = SentenceEncoder.from_pretrained(minilm_path, device="cpu", precision="bf16")
    assert bf16.precision == "bf16"
    cosines = np.einsum("nh,nh->n", fp32, bf16.encode(texts))
    assert cosines.min() > 0.99  # bf16's 8-bit mantissa on the CPU; the GPU test holds 1e-3


@cuda
def test_gpu_bf16_vectors_within_1e_3_cosine_of_fp32_and_fp32_equal_to_the_cpu(minilm_path, data_dir):
    from bert_kit.data.tables import read_texts

    texts = read_texts(data_dir / "sst2" / "dev.tsv", "sentence") + varied_texts()
    cpu = SentenceEncoder.from_pretrained(minilm_path, device="cpu").encode(texts)
    gpu32 = SentenceEncoder.from_pretrained(minilm_path, device="cuda", precision="fp32").encode(texts)
    np.testing.assert_allclose(gpu32, cpu, rtol=0, atol=1e-4)
    auto = SentenceEncoder.from_pretrained(minilm_path, device="cuda")
    assert auto.precision == ("bf16" if torch.cuda.is_bf16_supported() else "fp16")
    assert auto.max_tokens_per_batch > embeddings.CPU_TOKEN_BUDGET
    cosines = np.einsum("nh,nh->n", auto.encode(texts), cpu)
    assert cosines.min() > 1 - 1e-3
    on_device = auto.encode(texts, convert_to_tensor=True)
    assert on_device.device.type == "cuda"


@cuda
def test_gpu_vectors_tokenized_first_and_both_ways_out_of_the_device(minilm_path, data_dir, monkeypatch):
    """On a GPU `encode_tokenized` gives `encode`'s vectors, whether they are gathered on the device
    and copied out once or (past DEVICE_OUTPUT_BYTES) copied out batch by batch."""
    from bert_kit.data.tables import read_texts

    texts = read_texts(data_dir / "sst2" / "dev.tsv", "sentence") + varied_texts()
    cpu = SentenceEncoder.from_pretrained(minilm_path, device="cpu").encode(texts)
    gpu32 = SentenceEncoder.from_pretrained(minilm_path, device="cuda", precision="fp32")
    ids = gpu32.tokenize(texts)
    gathered = gpu32.encode_tokenized(ids)
    np.testing.assert_allclose(gathered, cpu, rtol=0, atol=1e-4)
    monkeypatch.setattr(embeddings, "DEVICE_OUTPUT_BYTES", 0)
    np.testing.assert_allclose(gpu32.encode_tokenized(ids), gathered, rtol=0, atol=1e-6)
    np.testing.assert_allclose(gpu32.encode(texts), gathered, rtol=0, atol=1e-4)


def test_embed_command_tokenizes_each_text_once_and_prints_its_phases(tiny, tmp_path, monkeypatch, capsys):
    """`bert-kit embed` tokenizes the texts once, for the truncation report and the device (only
    a text that fills max_length is tokenized again, to count it); --profile says when each phase
    ran. The vectors are `encode`'s."""
    from bert_kit.cli import main as cli_main
    from bert_kit.tokenizer import FastTokenizer

    model, tokenizer = tiny
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save(folder)
    texts = [f"short text number {i}" for i in range(50)] + ["long " * 200]
    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    counted, call = [], FastTokenizer.__call__
    monkeypatch.setattr(FastTokenizer, "__call__", lambda self, texts, *a, **k: counted.append(len(texts)) or
                        call(self, texts, *a, **k))
    rc = cli_main(["embed", "--model", str(folder), "--input", str(tmp_path / "in.txt"), "--output",
                   str(tmp_path / "v.npy"), "--max-length", "64", "--device", "cpu", "--profile"])
    out, err = capsys.readouterr()
    assert rc == 0 and "embedded 51 texts" in out
    assert counted == [51, 1]  # every text, then the one cut to count its tokens
    assert "1 of 51 texts were longer than --max-length 64 and were cut (median 202 tokens" in err
    table = err[err.index("\nphase "):].splitlines()[2:]  # a row per phase: name, from, to, took
    assert {"start", "read", "tokenize", "import", "load", "encode", "save", "done"} <= \
        {row.split()[0] for row in table}
    monkeypatch.setattr(FastTokenizer, "__call__", call)
    expect = SentenceEncoder(model, tokenizer, max_length=64, device="cpu").encode(texts)
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), expect, rtol=0, atol=1e-6)


class FakeDriver:
    """libcuda's three calls `start_cuda_driver` makes, recorded; `devices` GPUs."""

    def __init__(self, devices: int = 2):
        self.calls, self.devices, self.done = [], devices, threading.Event()

    def cuInit(self, flags):
        self.calls.append(("cuInit", flags))
        return 0

    def cuDeviceGet(self, handle, index):
        self.calls.append(("cuDeviceGet", index))
        handle._obj.value = index
        return 0 if index < self.devices else 101  # CUDA_ERROR_INVALID_DEVICE

    def cuDevicePrimaryCtxRetain(self, context, handle):
        self.calls.append(("cuDevicePrimaryCtxRetain", handle.value))
        self.done.set()
        return 0


@pytest.mark.parametrize("device, calls", [
    ("cuda:1", [("cuInit", 0), ("cuDeviceGet", 1), ("cuDevicePrimaryCtxRetain", 1)]),
    (None, [("cuInit", 0), ("cuDeviceGet", 0), ("cuDevicePrimaryCtxRetain", 0)]),
    ("cuda:5", [("cuInit", 0), ("cuDeviceGet", 5)]),  # no such GPU: left for torch to report
    ("cpu", []), ("mps", [])])
def test_embed_starts_the_cuda_context_through_the_driver_beside_torchs_import(device, calls, monkeypatch):
    """`bert-kit embed` on a GPU creates the primary context through libcuda in a thread (torch is
    still importing); with a CPU device, or a torch without CUDA, it loads no driver."""
    from bert_kit.cli import embed as embed_cli

    driver = FakeDriver()
    loaded = []
    monkeypatch.setattr(embed_cli.ctypes, "CDLL", lambda name: loaded.append(name) or driver)
    monkeypatch.setattr(embed_cli, "torch_has_cuda", lambda: True)
    embed_cli.start_cuda_driver(device)
    if calls and calls[-1][0] == "cuDevicePrimaryCtxRetain":
        assert driver.done.wait(5)
    else:
        threading.Event().wait(0.2)  # time for a thread that should not call more
    assert driver.calls == calls and loaded == (["libcuda.so.1"] if calls else [])
    monkeypatch.setattr(embed_cli, "torch_has_cuda", lambda: False)
    driver.calls.clear()
    embed_cli.start_cuda_driver("cuda:0")
    threading.Event().wait(0.2)
    assert driver.calls == []


def test_a_torch_without_cuda_is_known_by_its_files(tmp_path, monkeypatch):
    from importlib.machinery import ModuleSpec

    from bert_kit.cli import embed as embed_cli

    (tmp_path / "lib").mkdir()
    spec = ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(embed_cli.importlib.util, "find_spec", lambda name: spec)
    assert not embed_cli.torch_has_cuda()
    (tmp_path / "lib" / "libtorch_cuda.so").touch()
    assert embed_cli.torch_has_cuda()


def test_embed_starts_no_cuda_context_for_onnx_runtime(tmp_path):
    """ONNX Runtime runs on the CPU: `--backend onnx`, or an exported folder with auto, creates no
    CUDA context; a plain folder, an unknown name or an unreadable config.json is left to the loader."""
    import json

    from bert_kit.cli.embed import runs_on_onnx

    plain, exported, broken = (tmp_path / name for name in ("plain", "exported", "broken"))
    for folder, config in ((plain, {"model_type": "bert"}), (exported, {"bert_kit": {"onnx": {"graph": "m.onnx"}}})):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert runs_on_onnx(str(exported), "auto") and runs_on_onnx(str(plain), "onnx")
    assert not runs_on_onnx(str(plain), "auto") and not runs_on_onnx(str(exported), "torch")
    assert not runs_on_onnx(str(broken), "auto") and not runs_on_onnx(str(tmp_path / "missing"), "auto")
