"""`bert-kit evaluate` and `bert-kit predict`: metrics equal independent references (scipy,
scikit-learn, seqeval, sentence-transformers) computed on the same models, predictions equal
the model's own outputs, and clear errors for a folder without the task's head.

Run: .venv/bin/python -m pytest tests/tasks/test_inference.py -q
"""

import json

import numpy as np
import pytest
import torch

from bert_kit.cli import main as cli_main
from bert_kit.config import BertConfig
from bert_kit.data.sts import read_sts
from bert_kit.heads import BERTForQuestionAnswering, BERTForSequenceClassification, BERTForTokenClassification
from bert_kit.model import BERTModel
from bert_kit.model_folder import write_model_metadata
from bert_kit.tokenizer import get_tokenizer

TINY = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=256)
NER_LABELS = ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return get_tokenizer(minilm_path)


def saved(folder, model, tokenizer, labels=None, **meta):
    """A folder as `bert-kit finetune` writes it: weights, tokenizer, id2label, task settings."""
    if labels is not None:
        model.id2label = {str(i): n for i, n in enumerate(labels)}
    model.eval().save_pretrained(folder)
    tokenizer.save(folder)
    if meta:
        write_model_metadata(folder, meta)
    return folder


def rows(path, n, skip_header=True):
    lines = path.read_text().splitlines()
    return lines[1: n + 1] if skip_header else lines[:n]


def test_similarity_of_minilm_matches_sentence_transformers_and_scipy(minilm_path, data_dir, tmp_path, capsys):
    st = pytest.importorskip("sentence_transformers")
    from scipy.stats import pearsonr, spearmanr

    data = data_dir / "stsb" / "sts-dev.csv"
    out = tmp_path / "sts.json"
    assert cli_main(["evaluate", "--task", "similarity", "--model", str(minilm_path), "--data", str(data),
                     "--max-examples", "200", "--output", str(out), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    s1, s2, gold = (x[:200] for x in read_sts(data))
    reference = st.SentenceTransformer(str(minilm_path), device="cpu")
    a, b = reference.encode(s1, convert_to_numpy=True), reference.encode(s2, convert_to_numpy=True)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert result["num_examples"] == 200 and result["similarity_mode"] == "bi-encoder"
    assert result["pearson"] == pytest.approx(pearsonr(cos, gold)[0], abs=1e-4)
    assert result["spearman"] == pytest.approx(spearmanr(cos, gold)[0], abs=1e-4)
    assert f"pearson {result['pearson']:.4f}, spearman {result['spearman']:.4f}" in printed
    assert result["spearman"] > 0.8  # all-MiniLM-L6-v2 is a strong STS model


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    model = BERTForSequenceClassification(TINY, num_labels=2)
    return saved(tmp_path_factory.mktemp("cls"), model, tokenizer, ["negative", "positive"],
                 task="classification", max_length=64)


def test_evaluate_classification_matches_sklearn(classifier, tokenizer, data_dir, tmp_path, capsys):
    from sklearn.metrics import accuracy_score, f1_score

    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\n" + "\n".join(rows(data_dir / "sst2" / "dev.tsv", 40)) + "\n")
    out = tmp_path / "eval.json"
    assert cli_main(["evaluate", "--model", str(classifier), "--data", str(dev), "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    texts = [r.split("\t")[0] for r in rows(dev, 40)]
    gold = [int(r.split("\t")[1]) for r in rows(dev, 40)]
    model = BERTForSequenceClassification.from_pretrained(classifier)
    enc = tokenizer(texts, max_length=64)
    with torch.no_grad():
        pred = model(**enc).argmax(-1).numpy()
    assert result["accuracy"] == pytest.approx(accuracy_score(gold, pred), abs=1e-12)
    assert result["f1"] == pytest.approx(f1_score(gold, pred, average="macro", zero_division=0), abs=1e-12)
    assert [c["label"] for c in result["per_class"]] == ["negative", "positive"]
    png = tmp_path / "eval_confusion_matrix.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and f"wrote {png}" in capsys.readouterr().out


def test_evaluate_token_classification_matches_seqeval(tokenizer, data_dir, tmp_path):
    seqeval = pytest.importorskip("seqeval.metrics")
    from bert_kit.data.ner import NERDataset, read_conll

    torch.manual_seed(1)
    folder = saved(tmp_path / "ner", BERTForTokenClassification(TINY, num_labels=9), tokenizer, NER_LABELS,
                   task="token-classification", max_length=128)
    valid = tmp_path / "valid.txt"
    valid.write_text("\n".join(rows(data_dir / "conll2003" / "valid.txt", 200, skip_header=False)) + "\n")
    assert cli_main(["evaluate", "--model", str(folder), "--data", str(valid), "--output", str(tmp_path / "e.json")]) == 0
    result = json.loads((tmp_path / "e.json").read_text())
    sentences = read_conll(valid)
    ds = NERDataset(sentences, tokenizer, NER_LABELS, 128)
    model = BERTForTokenClassification.from_pretrained(folder)
    predicted = []
    with torch.no_grad():
        for i in range(len(ds)):
            ids = torch.tensor([ds[i]["input_ids"]])
            predicted.append(ds.predictions_to_tags(i, model(ids)[0].argmax(-1)))
    gold = [tags for _, tags in sentences]
    assert result["num_sentences"] == len(sentences)
    assert result["f1"] == pytest.approx(seqeval.f1_score(gold, predicted), abs=1e-9)
    assert result["precision"] == pytest.approx(seqeval.precision_score(gold, predicted), abs=1e-9)

    # predict on the CoNLL file itself (format detected) and on plain sentences
    assert cli_main(["predict", "--model", str(folder), "--input", str(valid),
                     "--output", str(tmp_path / "p.jsonl")]) == 0
    preds = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [p["tags"] for p in preds] == predicted
    (tmp_path / "s.txt").write_text(" ".join(sentences[0][0]) + "\n")
    assert cli_main(["predict", "--model", str(folder), "--input", str(tmp_path / "s.txt"), "--output",
                     str(tmp_path / "s.jsonl")]) == 0
    one = json.loads((tmp_path / "s.jsonl").read_text())
    assert one["words"] == sentences[0][0] and one["tags"] == predicted[0]


def test_evaluate_and_predict_qa(tokenizer, data_dir, tmp_path):
    from bert_kit.data.squad import postprocess_predictions, prepare_eval_features, read_squad
    from bert_kit.metrics import squad_evaluate

    squad = json.loads((data_dir / "squad-v1.1" / "dev-v1.1.json").read_text())
    small = {"version": "1.1", "data": [{"title": a["title"], "paragraphs": a["paragraphs"][:1]}
                                        for a in squad["data"][:2]]}
    (tmp_path / "squad.json").write_text(json.dumps(small))
    torch.manual_seed(2)
    folder = saved(tmp_path / "qa", BERTForQuestionAnswering(TINY), tokenizer, task="qa", max_length=128,
                   doc_stride=32, max_query_length=64)
    assert cli_main(["evaluate", "--model", str(folder), "--data", str(tmp_path / "squad.json"), "--split-articles",
                     "1", "--output", str(tmp_path / "e.json")]) == 0
    result = json.loads((tmp_path / "e.json").read_text())
    held_out = [ex for ex in read_squad(tmp_path / "squad.json") if ex["title"] == small["data"][1]["title"]]
    assert result["num_examples"] == len(held_out)
    # the same numbers from the model's logits, window by window
    features = prepare_eval_features(held_out, tokenizer, 128, 32, 64)
    model = BERTForQuestionAnswering.from_pretrained(folder)
    with torch.no_grad():
        logits = [model(torch.tensor([f["input_ids"]]), token_type_ids=torch.tensor([f["token_type_ids"]]))
                  for f in features]
    answers = postprocess_predictions(held_out, features, [s[0].numpy() for s, _ in logits],
                                      [e[0].numpy() for _, e in logits])
    expect = squad_evaluate(answers, held_out)
    assert result["exact_match"] == pytest.approx(expect["exact_match"], abs=1e-9)
    assert result["f1"] == pytest.approx(expect["f1"], abs=1e-9)
    assert cli_main(["predict", "--model", str(folder), "--input", str(tmp_path / "squad.json"), "--output",
                     str(tmp_path / "p.jsonl")]) == 0
    preds = {p["id"]: p["answer"] for p in map(json.loads, (tmp_path / "p.jsonl").read_text().splitlines())}
    assert all(preds[qid] == a for qid, a in answers.items())


def test_similarity_predict_bi_and_cross_encoder(tokenizer, data_dir, tmp_path):
    from scipy.stats import pearsonr

    from bert_kit.embeddings import SentenceEncoder

    s1, s2, gold = (x[:30] for x in read_sts(data_dir / "stsb" / "sts-dev.csv"))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{a}\t{b}\n" for a, b in zip(s1, s2)))
    torch.manual_seed(3)
    bi = saved(tmp_path / "bi", BERTModel(TINY), tokenizer, task="similarity", similarity_mode="bi-encoder",
               pooling="mean", max_length=128)
    assert cli_main(["predict", "--model", str(bi), "--input", str(pairs), "--output", str(tmp_path / "bi.jsonl")]) == 0
    got = [json.loads(line)["score"] for line in (tmp_path / "bi.jsonl").read_text().splitlines()]
    enc = SentenceEncoder.from_pretrained(bi, max_length=128)
    expect = (enc.encode(s1) * enc.encode(s2)).sum(1)
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-5)

    cross = saved(tmp_path / "cross", BERTForSequenceClassification(TINY, num_labels=1), tokenizer, ["score"],
                  task="similarity", similarity_mode="cross-encoder", max_length=128)
    data = tmp_path / "sts.csv"
    data.write_text("\n".join((data_dir / "stsb" / "sts-dev.csv").read_text().splitlines()[:30]) + "\n")
    assert cli_main(["evaluate", "--model", str(cross), "--data", str(data), "--output", str(tmp_path / "e.json")]) == 0
    result = json.loads((tmp_path / "e.json").read_text())
    model = BERTForSequenceClassification.from_pretrained(cross)
    with torch.no_grad():
        scores = model(**tokenizer(s1, s2, max_length=128))[:, 0].numpy()
    assert result["similarity_mode"] == "cross-encoder"
    assert result["pearson"] == pytest.approx(pearsonr(scores, gold)[0], abs=1e-5)
    assert result["mse"] == pytest.approx(float(np.mean((scores - np.array(gold)) ** 2)), rel=1e-5)


def test_classification_regression_predictions(tokenizer, tmp_path):
    torch.manual_seed(4)
    folder = saved(tmp_path / "reg", BERTForSequenceClassification(TINY, num_labels=1), tokenizer, ["score"],
                   task="classification", max_length=64)
    (tmp_path / "in.jsonl").write_text('{"sentence": "fine"}\n{"sentence": "not fine at all"}\n')
    assert cli_main(["predict", "--model", str(folder), "--input", str(tmp_path / "in.jsonl"), "--output",
                     str(tmp_path / "out.jsonl")]) == 0
    got = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    with torch.no_grad():
        expect = BERTForSequenceClassification.from_pretrained(folder)(**tokenizer(["fine", "not fine at all"]))
    assert [g["text"] for g in got] == ["fine", "not fine at all"]
    np.testing.assert_allclose([g["score"] for g in got], expect[:, 0].numpy(), atol=1e-5)


def test_clear_errors(minilm_path, tmp_path, capsys, data_dir):
    dev = data_dir / "sst2" / "dev.tsv"
    # an encoder without a classifier is not a classification model
    assert cli_main(["evaluate", "--task", "classification", "--model", str(minilm_path), "--data", str(dev)]) == 2
    assert "holds a BertModel, but task classification runs BertForSequenceClassification" in capsys.readouterr().err
    # a folder that does not record its task needs --task
    assert cli_main(["evaluate", "--model", str(minilm_path), "--data", str(dev)]) == 2
    assert "pass --task" in capsys.readouterr().err
    assert cli_main(["predict", "--task", "similarity", "--model", str(minilm_path), "--input",
                     str(tmp_path / "missing.txt"), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "input file not found" in capsys.readouterr().err


def test_jsonl_prediction_inputs_name_the_bad_line(tmp_path):
    from bert_kit.tasks.inference import read_pairs, read_questions

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"sentence1": "a", "sentence2": "b"}\n\n{"sentence1": "c"}\n')
    with pytest.raises(KeyError, match=r"pairs\.jsonl:3: needs keys 'sentence1' and 'sentence2'"):
        read_pairs(None, pairs)
    pairs.write_text('{"sentence1": "a", "sentence2": "b"}\n{"sentence1": "c", "sentence2": "d"}\n')
    assert read_pairs(None, pairs) == (["a", "c"], ["b", "d"])
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"question": "q?", "context": "c."}\n{"question": \n')
    with pytest.raises(ValueError, match=r"questions\.jsonl:2: invalid JSON"):
        read_questions(questions)
