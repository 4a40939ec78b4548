"""Token classification tags every word of a long sentence: a sentence longer than max_length is
cut into overlapping windows and each word takes the model's tag from the window where it has
the most context. Before, every word past max_length was tagged "O" (F1 0.05 on a 500-word
sentence, counted as the model's). A sentence that fits is tagged exactly as before.

Run: .venv/bin/python -m pytest tests/tasks/test_inference_windows.py -q
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from bert_kit.cli import main as cli_main
from bert_kit.config import BertConfig
from bert_kit.data.ner import best_windows, predictions_to_words, window_spans
from bert_kit.heads import BERTForTokenClassification
from bert_kit.model_folder import write_model_metadata
from bert_kit.tasks.inference import load_task_model
from bert_kit.tokenizer import get_tokenizer

WORDS = "the a cat dog sat ran on mat rug and is good bad very film john smith paris".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ing"]
CONFIG = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=64)
TAGS = ["O", "B-PER", "I-PER"]
MAX_LENGTH = 32

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tagger(folder, never_o: bool = False):
    torch.manual_seed(0)
    model = BERTForTokenClassification(CONFIG, num_labels=3)
    if never_o:  # a model that tags every word B-PER: a word tagged "O" was never shown to it
        with torch.no_grad():
            model.classifier.bias.copy_(torch.tensor([-50.0, 50.0, 0.0]))
    model.id2label = {str(i): t for i, t in enumerate(TAGS)}
    model.eval().save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    write_model_metadata(folder, {"task": "token-classification", "max_length": MAX_LENGTH})
    return folder


def sentence(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(WORDS) + rng.choice(["", "", "s", "ing"]) for _ in range(n)]  # some words of two pieces


def test_a_500_word_sentence_gets_the_models_tag_for_every_word(tmp_path):
    folder = tagger(tmp_path / "ner", never_o=True)
    words = sentence(500)
    (tmp_path / "long.txt").write_text(" ".join(words) + "\n")
    assert cli_main(["predict", "--model", str(folder), "--input", str(tmp_path / "long.txt"),
                     "--output", str(tmp_path / "p.jsonl"), "--device", "cpu"]) == 0
    record = json.loads((tmp_path / "p.jsonl").read_text())
    assert record["words"] == words and record["tags"] == ["B-PER"] * 500  # before: "O" past the 30th token

    # evaluate: a sentence is never cut, so the model's own tags score 1.0
    (tmp_path / "gold.txt").write_text("".join(f"{w} B-PER\n" for w in words))
    assert cli_main(["evaluate", "--model", str(folder), "--data", str(tmp_path / "gold.txt"),
                     "--output", str(tmp_path / "e.json"), "--device", "cpu"]) == 0
    metrics = json.loads((tmp_path / "e.json").read_text())
    assert metrics["accuracy"] == 1.0 and metrics["f1"] == 1.0


def test_windows_equal_the_model_on_each_window_and_today_for_what_fits(tmp_path):
    folder = tagger(tmp_path / "ner")
    args = type("Args", (), {"model": str(folder), "task": None, "max_length": None, "batch_size": 8, "device": "cpu",
                             "precision": "fp32", "backend": "torch"})()
    task, model, precision = load_task_model(args, verbose=False)
    tokenizer = get_tokenizer(folder)
    short = [sentence(n, seed) for seed, n in enumerate((3, 9, 14))]  # each fits in 32 tokens
    long = sentence(200, seed=7)
    tagged = task.tag_words(model, short + [long], precision)

    # a sentence that fits: one window, the tags of one truncated encoding (as before windows existed)
    for words, tags in zip(short, tagged):
        enc = tokenizer([words], is_split_into_words=True, max_length=MAX_LENGTH, truncation=True,
                        return_word_ids=True, return_tensors=None)
        assert len(enc["input_ids"][0]) < MAX_LENGTH
        with torch.no_grad():
            logits = model(torch.tensor(enc["input_ids"]))[0]
        assert tags == predictions_to_words(logits.argmax(-1), enc["word_ids"][0], len(words), TAGS)

    # a long one: each word's tag is the model's on the window where it has the most context
    enc = tokenizer([long], is_split_into_words=True, truncation=False, return_word_ids=True, return_tensors=None)
    ids, wids = enc["input_ids"][0][1:-1], enc["word_ids"][0][1:-1]
    spans = window_spans(wids, MAX_LENGTH - 2)
    assert len(spans) > 6 and all(b - a <= MAX_LENGTH - 2 for a, b in spans)
    window_tags = []
    for a, b in spans:
        with torch.no_grad():
            logits = model(torch.tensor([[tokenizer.cls_token_id] + ids[a:b] + [tokenizer.sep_token_id]]))[0]
        window_tags.append([TAGS[i] for i in logits.argmax(-1).tolist()])
    expected = []
    for w, k in enumerate(best_windows(wids, spans, len(long))):
        first = wids.index(w)  # the word's first sub-token, in the sentence
        expected.append(window_tags[k][first - spans[k][0] + 1])
    assert tagged[-1] == expected and len(expected) == 200
