"""The usage examples of the bert-kit specification (the 001 README), run as written, plus the
import contract of the README.

Run: .venv/bin/python -m pytest tests/test_public_api.py -q
"""

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
