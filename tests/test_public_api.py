"""The usage examples of the bert-kit specification (the 001 README), run as written, plus the
import contract of the README, and docs/python_api.md's fine-tune-then-predict on a tiny model.

Run: .venv/bin/python -m pytest tests/test_public_api.py -q
"""

import pytest
import torch


def test_readme_import_contract():
    from bert_kit import (BERTForMaskedLM, BERTForPreTraining, BERTForQuestionAnswering,  # noqa: F401
                          BERTForSequenceClassification, BERTForTokenClassification, BERTModel, BertConfig,
                          SentenceEncoder, create_model_config, get_tokenizer, train_tokenizer)


def test_basic_model_creation_and_mlm_pretraining(minilm_path):
    from bert_kit import BERTForMaskedLM, BERTModel, create_mlm_dataloader, create_model_config, get_tokenizer

    config = create_model_config("bert-base-uncased (110M)")
    model = BERTModel(config)
    assert model.num_parameters() == 109_482_240

    model = BERTForMaskedLM(create_model_config("bert-tiny"))
    tokenizer = get_tokenizer(minilm_path)
    train_loader = create_mlm_dataloader(
        texts=["Your training text...", "A second sentence to mask words in."],
        tokenizer=tokenizer,
        batch_size=8,
        mask_probability=0.15,
    )
    batch = next(iter(train_loader))
    from bert_kit import compute_mlm_loss

    logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    loss = compute_mlm_loss(logits, batch["labels"])
    assert logits.shape[:2] == batch["input_ids"].shape and torch.isfinite(loss)


def test_classification_fine_tuning_and_evaluation(minilm_path):
    from bert_kit import (BERTForSequenceClassification, create_classification_dataloader, create_model_config,
                          evaluate_classification_metrics, get_tokenizer)

    config = create_model_config("bert-tiny")
    model = BERTForSequenceClassification(config, num_labels=2)
    texts = ["Great movie!", "Terrible experience"]
    labels = [1, 0]
    tokenizer = get_tokenizer(minilm_path)
    train_loader = create_classification_dataloader(texts=texts, labels=labels, tokenizer=tokenizer, batch_size=8)
    metrics = evaluate_classification_metrics(model, train_loader, device="cpu", num_classes=2)
    print(f"Accuracy: {metrics['accuracy']:.4f}")
    print(f"F1 Score: {metrics['f1']:.4f}")
    assert {"accuracy", "precision", "recall", "f1", "confusion_matrix"} <= set(metrics)
    assert sum(map(sum, metrics["confusion_matrix"])) == 2


def test_finetune_then_predict_from_python(tmp_path, minilm_path):
    """docs/python_api.md, on a tiny model: FinetuneConfig and finetune() from Python, then the
    predict helper on a list of texts, and the label names of the loaded model."""
    from bert_kit import (BERTForSequenceClassification, BERTModel, BertConfig, FinetuneConfig, TextClassifier,
                          finetune, get_tokenizer)

    torch.manual_seed(0)
    encoder = tmp_path / "encoder"
    BERTModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(encoder)
    get_tokenizer(minilm_path).save(encoder)
    rows = [("a great film", "positive"), ("awful", "negative"), ("so good", "positive"), ("dull and bad", "negative")]
    (tmp_path / "reviews.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows * 4))
    cfg = FinetuneConfig(task="classification", model=str(encoder), train_file=str(tmp_path / "reviews.csv"),
                         validation_file=str(tmp_path / "reviews.csv"), text_column="text", label_column="label",
                         max_length=16, epochs=1, batch_size=8, lr=1e-3, device="cpu",
                         output_dir=str(tmp_path / "runs" / "reviews"))
    results = finetune(cfg)
    assert results["metric"] == "accuracy" and 0.0 <= results["best_value"] <= 1.0

    clf = TextClassifier.from_pretrained(tmp_path / "runs" / "reviews", device="cpu")
    assert clf.labels == ["negative", "positive"]
    predictions = clf.predict(["a great film", "awful " * 20])
    assert [set(p) for p in predictions] == [{"label", "label_id", "probabilities", "truncated"}] * 2
    assert [p["truncated"] for p in predictions] == [False, True]  # 22 tokens > max_length 16
    for p in predictions:
        assert p["label"] == clf.labels[p["label_id"]]
        assert sum(p["probabilities"].values()) == pytest.approx(1, abs=1e-5)
        assert max(p["probabilities"], key=p["probabilities"].get) == p["label"]
    assert clf.predict("a great film") == predictions[0]
    # the same probabilities as the model itself gives
    model = BERTForSequenceClassification.from_pretrained(tmp_path / "runs" / "reviews" / "best")
    batch = get_tokenizer(encoder)(["a great film"], max_length=16)
    probs = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).softmax(-1)[0]
    torch.testing.assert_close(torch.tensor(list(predictions[0]["probabilities"].values())), probs, atol=1e-5, rtol=0)
    assert model.config.id2label == {0: "negative", 1: "positive"}
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got int"):
        clf.predict(["fine", 3])
    with pytest.raises(ValueError, match="2 texts but 1 text_pairs"):
        clf.predict(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="^max_length=1000 exceeds the 64 positions of"):  # not --max-length
        TextClassifier.from_pretrained(tmp_path / "runs" / "reviews", max_length=1000)


def test_the_python_api_doc_names_what_bert_kit_exports():
    import re
    from pathlib import Path

    import bert_kit

    doc = (Path(__file__).resolve().parents[1] / "docs" / "python_api.md").read_text()
    for name in set(re.findall(r"from bert_kit import ([\w, ]+)", doc)):
        for exported in name.split(", "):
            assert exported in bert_kit.__all__, exported
