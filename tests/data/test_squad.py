"""SQuAD data: the reader on the real v1.1 dev file and malformed files, article split, the
sliding windows (against HF's only_second overflow encoding), answer positions and decoding.

Run: .venv/bin/python -m pytest tests/data/test_squad.py -q
"""

import json
import unicodedata

import numpy as np
import pytest
import torch

from bert_kit.data.squad import (
    create_squad_dataloader,
    postprocess_predictions,
    prepare_eval_features,
    prepare_train_features,
    read_squad,
    split_by_article,
)
from bert_kit.metrics import squad_evaluate

MAX_LEN, STRIDE = 128, 32  # small windows so that many contexts need several


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from bert_kit.tokenizer import get_tokenizer

    return get_tokenizer(minilm_path)


@pytest.fixture(scope="module")
def examples(data_dir):
    return read_squad(data_dir / "squad-v1.1" / "dev-v1.1.json")


@pytest.fixture(scope="module")
def sample(examples):
    return examples[:: 25]  # 423 questions spread over all articles


# ------------------------------------------------------------------------------ reader


def test_read_squad_dev(examples):
    assert len(examples) == 10570
    assert len({ex["title"] for ex in examples}) == 48
    assert len({ex["context"] for ex in examples}) == 2067
    first = examples[0]
    assert first["id"] == "56be4db0acb8001400a502ec" and first["title"] == "Super_Bowl_50"
    assert first["question"] == "Which NFL team represented the AFC at Super Bowl 50?"
    assert first["answers"][0] == {"text": "Denver Broncos", "answer_start": 177}
    # every answer_start points at its text
    for ex in examples:
        for ans in ex["answers"]:
            start = ans["answer_start"]
            assert ex["context"][start: start + len(ans["text"])] == ans["text"]


def test_malformed_squad_files(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"data": [\n  {"title": "x",\n   "paragraphs": [}\n]}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.json:3: invalid JSON"):
        read_squad(bad)
    doc = {"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
        {"id": "1", "question": "q", "answers": [{"text": "a", "answer_start": 0}]},
        {"question": "q", "answers": []}]}]}]}
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(KeyError, match=r"missing\.json: data\[0\]\.paragraphs\[0\]\.qas\[1\] has no key 'id'"):
        read_squad(missing)
    missing.write_text(json.dumps({"version": "1.1"}), encoding="utf-8")
    with pytest.raises(KeyError, match=r"missing\.json: top level has no key 'data'"):
        read_squad(missing)


def test_split_by_article(examples):
    train, held_out = split_by_article(examples, 38)
    assert len({e["title"] for e in train}) == 38 and len({e["title"] for e in held_out}) == 10
    assert not {e["context"] for e in train} & {e["context"] for e in held_out}
    assert len(train) + len(held_out) == 10570
    assert train[0] is examples[0] and held_out[-1] is examples[-1]
    with pytest.raises(ValueError, match=r"\[1, 47\]"):
        split_by_article(examples, 48)


# ------------------------------------------------------------------------------ features


def test_windows_match_hf_only_second_overflow(sample, tokenizer, minilm_path):
    from transformers import BertTokenizerFast

    hf = BertTokenizerFast.from_pretrained(str(minilm_path))
    enc = hf([e["question"].lstrip() for e in sample], [e["context"] for e in sample],
             truncation="only_second", max_length=MAX_LEN, stride=STRIDE,
             return_overflowing_tokens=True, return_offsets_mapping=True)
    feats = prepare_eval_features(sample, tokenizer, max_length=MAX_LEN, doc_stride=STRIDE)
    assert len(feats) == len(enc["input_ids"]) > 1.5 * len(sample)
    for i, f in enumerate(feats):
        assert f["input_ids"] == enc["input_ids"][i]
        assert f["token_type_ids"] == enc["token_type_ids"][i]
        assert f["example_id"] == sample[enc["overflow_to_sample_mapping"][i]]["id"]
        seq = enc.sequence_ids(i)
        ref = [tuple(o) if s == 1 else None for o, s in zip(enc["offset_mapping"][i], seq)]
        assert f["offset_mapping"] == ref  # None outside the context


def squash(text: str) -> str:
    """Lower-cased text without punctuation, spaces or accents (the uncased tokenizer strips
    accents and decode() spaces out punctuation, so only these characters are comparable)."""
    text = unicodedata.normalize("NFD", text.lower())
    return "".join(ch for ch in text if ch.isalnum() and not unicodedata.combining(ch))


def decode_span(feature, tokenizer):
    """Text of a training feature's target tokens, decoded by the tokenizer."""
    s, e = feature["start_positions"], feature["end_positions"]
    return tokenizer.decode(feature["input_ids"][s: e + 1])


def test_train_windows_cover_the_answer(sample, tokenizer):
    feats = prepare_train_features(sample, tokenizer, max_length=MAX_LEN, doc_stride=STRIDE)
    eval_feats = prepare_eval_features(sample, tokenizer, max_length=MAX_LEN, doc_stride=STRIDE)
    assert len(feats) == len(eval_feats)
    by_id = {}
    for f, ef in zip(feats, eval_feats):
        by_id.setdefault(ef["example_id"], []).append((f, ef))
    exact = n_hits = 0
    for ex in sample:
        answer = ex["answers"][0]
        a_start, a_end = answer["answer_start"], answer["answer_start"] + len(answer["text"])
        hits = [(f, ef) for f, ef in by_id[ex["id"]] if f["start_positions"] > 0]
        assert hits, ex["id"]  # some window holds the whole answer
        for f, ef in by_id[ex["id"]]:
            s, e = f["start_positions"], f["end_positions"]
            assert len(f["input_ids"]) <= MAX_LEN
            if s == 0:
                assert e == 0
                offs = [o for o in ef["offset_mapping"] if o is not None]
                assert offs[0][0] > a_start or offs[-1][1] < a_end  # answer not inside
                continue
            offs = ef["offset_mapping"]
            assert offs[s] is not None and offs[e] is not None and s <= e
            # the smallest token span covering the answer characters
            assert offs[s][0] <= a_start < offs[s][1] and offs[e][0] < a_end <= offs[e][1]
            decoded, gold = squash(decode_span(f, tokenizer)), squash(answer["text"])
            assert gold in decoded
            exact += decoded == gold
            n_hits += 1
    assert exact >= 0.99 * n_hits  # answers rarely start or end mid-token


def test_postprocess_recovers_gold_from_one_hot_logits(sample, tokenizer):
    feats = prepare_train_features(sample, tokenizer, max_length=MAX_LEN, doc_stride=STRIDE)
    eval_feats = prepare_eval_features(sample, tokenizer, max_length=MAX_LEN, doc_stride=STRIDE)
    # padded (N, T) logits as a model would return them for padded batches
    start = np.zeros((len(feats), MAX_LEN), np.float32)
    end = np.zeros((len(feats), MAX_LEN), np.float32)
    expected = {}
    for i, (f, ef) in enumerate(zip(feats, eval_feats)):
        if f["start_positions"] > 0 and ef["example_id"] not in expected:
            start[i, f["start_positions"]] = end[i, f["end_positions"]] = 10.0
            offs = ef["offset_mapping"]
            ex = next(e for e in sample if e["id"] == ef["example_id"])
            expected[ex["id"]] = ex["context"][offs[f["start_positions"]][0]: offs[f["end_positions"]][1]]
    preds = postprocess_predictions(sample, eval_feats, torch.from_numpy(start),
                                    torch.from_numpy(end), n_best=20, max_answer_length=30)
    long_answers = [k for k, v in expected.items() if len(tokenizer.tokenize(v)) > 30]
    assert len(expected) == len(sample)
    for qid, text in expected.items():
        if qid not in long_answers:
            assert preds[qid] == text
    scores = squad_evaluate(preds, sample)
    assert scores["exact_match"] > 95.0 and scores["f1"] > 97.0


def test_postprocess_only_returns_valid_spans(tokenizer):
    ex = {"id": "q", "question": "Who won?", "answers": [],
          "context": "The Denver Broncos beat the Carolina Panthers 24 to 10."}
    feats = prepare_eval_features([ex], tokenizer, max_length=64, doc_stride=16)
    offs = feats[0]["offset_mapping"]
    ctx = [i for i, o in enumerate(offs) if o is not None]
    first, last = ctx[0], ctx[-1]
    start, end = np.zeros((1, 64)), np.zeros((1, 64))
    start[0, 1], end[0, 2] = 100.0, 100.0      # question tokens: not allowed
    start[0, last], end[0, first] = 50.0, 50.0  # end before start: not allowed
    start[0, first + 2], end[0, first + 3] = 5.0, 5.0  # the best valid span: "broncos beat"
    pred = postprocess_predictions([ex], feats, start, end)
    assert pred == {"q": ex["context"][offs[first + 2][0]: offs[first + 3][1]]}
    # a length limit of one token forbids that span: the best one-token span wins
    pred = postprocess_predictions([ex], feats, start, end, n_best=64, max_answer_length=1)
    assert pred["q"] == ex["context"][offs[last][0]: offs[last][1]]
    # random logits: every prediction is a piece of the context
    rng = np.random.default_rng(0)
    for _ in range(20):
        s, e = rng.normal(size=(1, 64)), rng.normal(size=(1, 64))
        text = postprocess_predictions([ex], feats, s, e, max_answer_length=4)["q"]
        assert text and text in ex["context"] and len(tokenizer.tokenize(text)) <= 4
    with pytest.raises(ValueError, match="1 features but 2 start"):
        postprocess_predictions([ex], feats, np.zeros((2, 64)), np.zeros((2, 64)))


def test_feature_errors_and_loader(sample, tokenizer):
    with pytest.raises(ValueError, match="need > doc_stride 128"):
        prepare_train_features(sample[:1], tokenizer, max_length=64, doc_stride=128)
    feats = prepare_train_features(sample[:10], tokenizer, max_length=MAX_LEN, doc_stride=STRIDE)
    batch = next(iter(create_squad_dataloader(feats, batch_size=4, shuffle=False)))
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "start_positions",
                          "end_positions"}
    assert batch["input_ids"].shape == (4, max(len(f["input_ids"]) for f in feats[:4]))
    torch.testing.assert_close(batch["start_positions"],
                               torch.tensor([f["start_positions"] for f in feats[:4]]))
    eval_batch = next(iter(create_squad_dataloader(
        prepare_eval_features(sample[:4], tokenizer), batch_size=4, shuffle=False)))
    assert set(eval_batch) == {"input_ids", "token_type_ids", "attention_mask"}


# ------------------------------------------------------------------------------ answer checks

CONTEXT = "The Normans were a people in Normandy, France."


def squad_file(tmp_path, qas, context=CONTEXT, name="qa.json", raw=None):
    doc = {"version": "1.1", "data": [{"title": "Normans", "paragraphs": [{"context": context, "qas": qas}]}]}
    path = tmp_path / name
    path.write_text(raw if raw is not None else json.dumps(doc), encoding="utf-8")
    return path


def qa(qid, text="Normans", start=4, **extra):
    return {"id": qid, "question": "Who?", "answers": [{"text": text, "answer_start": start}], **extra}


def test_good_answers_bom_and_integral_float_offsets(tmp_path):
    path = squad_file(tmp_path, [qa("a"), qa("b", "Normandy", 29.0)])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    examples = read_squad(path)
    assert [ex["answers"] for ex in examples] == [[{"text": "Normans", "answer_start": 4}],
                                                 [{"text": "Normandy", "answer_start": 29}]]
    assert type(examples[1]["answers"][0]["answer_start"]) is int


@pytest.mark.parametrize("bad,match", [
    (qa("q1", start=60), r"question 'q1' \(data\[0\]\.paragraphs\[0\]\.qas\[0\]\.answers\[0\]\): answer_start 60 "
                         r"is outside the context \(46 characters\)"),
    (qa("q1", start=-1), r"question 'q1' .*answer_start -1 is outside the context"),
    (qa("q1", start=5), r"question 'q1' .*answer 'Normans' does not match the context at answer_start 5 \('ormans "),
    (qa("q1", "normans"), r"answer 'normans' does not match the context at answer_start 4 \('Normans'\)"),
    (qa("q1", start=4.5), r"question 'q1' .*answer_start 4\.5 is not a whole character offset"),
    (qa("q1", " "), r"question 'q1' .*the answer text is empty"),
])
def test_bad_answers_are_errors_naming_the_question(tmp_path, bad, match):
    path = squad_file(tmp_path, [bad])
    with pytest.raises(ValueError, match=r"qa\.json: .*" + match + r".*skip_bad_answers=true"):
        read_squad(path)


def test_skip_bad_answers_counts_and_drops(tmp_path, capsys):
    two = {"id": "two", "question": "Where?", "answers": [{"text": "France", "answer_start": 0},
                                                          {"text": "France", "answer_start": 39}]}
    path = squad_file(tmp_path, [qa("good"), qa("bad", start=9), two, {"id": "none", "question": "?", "answers": []}])
    examples = read_squad(path, skip_bad_answers=True)
    assert [ex["id"] for ex in examples] == ["good", "two", "none"]  # "bad" lost its only answer
    assert examples[1]["answers"] == [{"text": "France", "answer_start": 39}]
    assert "qa.json: skipped 2 answer(s) that do not match their context; dropped 1 question(s)" in capsys.readouterr().err


@pytest.mark.parametrize("qas,match", [
    ([qa("d"), qa("d")], r"question id 'd' appears twice \(data\[0\]\.paragraphs\[0\]\.qas\[0\] and .*qas\[1\]\)"),
    ([qa("a", start="4")], r"qas\[0\]\.answers\[0\]\.answer_start should be an integer or a number, got a string"),
    ([qa("a", start=True)], r"answer_start should be an integer or a number, got a boolean"),
    ([qa("a", text=7)], r"answers\[0\]\.text should be a string, got an integer"),
    ([{"id": "a", "question": None, "answers": []}], r"qas\[0\]\.question should be a string, got null"),
    ([{"id": ["a"], "question": "q", "answers": []}], r"qas\[0\]\.id should be a string or an integer, got an array"),
    ([{"id": "a", "question": "q", "answers": {"text": "x"}}], r"qas\[0\]\.answers should be an array, got an object"),
    (["not a question"], r"qas\[0\] should be a JSON object, got a string"),
])
def test_fields_of_the_wrong_type(tmp_path, qas, match):
    with pytest.raises(ValueError, match=r"qa\.json: .*" + match):
        read_squad(squad_file(tmp_path, qas))


def test_wrong_types_higher_up(tmp_path):
    with pytest.raises(ValueError, match=r"top level\.data should be an array, got an object"):
        read_squad(squad_file(tmp_path, [], raw='{"data": {}}'))
    with pytest.raises(ValueError, match=r"data\[0\]\.paragraphs\[0\]\.context should be a string, got an integer"):
        read_squad(squad_file(tmp_path, [], context=5))
    path = tmp_path / "latin1.json"
    path.write_bytes('{"data": [{"title": "Caf\u00e9"}]}'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.json:1: not UTF-8 text \(byte 0xe9 at column 25\)"):
        read_squad(path)
