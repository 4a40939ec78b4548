"""Named-entity recognition on CoNLL-2003: fine-tune, score entity F1, tag new sentences.

    python examples/ner.py                                   # 500 sentences, ~1-2 minutes on a CPU
    python examples/ner.py --max-train 0 --max-eval 0 --epochs 3 --output runs/ner   # the full data (GPU)

Tags are per word while BERT sees WordPieces: the first piece of each word carries the word's
tag (the others are ignored by the loss, label -100), and a word's prediction is read from its
first piece. Scores are entity-level precision / recall / F1, as conlleval and seqeval count
them. The run itself is `bert_kit.tasks.finetuning.finetune`, the same as `bert-kit finetune
--config configs/finetune_conll.yaml`.
"""

from __future__ import annotations

import argparse

import torch

from bert_kit import BERTForTokenClassification, get_tokenizer
from bert_kit.data.ner import predictions_to_words
from bert_kit.tasks.finetuning import FinetuneConfig, finetune
from bert_kit.metrics import get_entities
from bert_kit.model_folder import read_model_metadata
from bert_kit.data.root import data_root

DATA = data_root()  # $BERT_KIT_DATA, else ./data (docs/data.md)
MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # a hub name: its local copy (docs/data.md)


def tag(model, tokenizer, labels: list[str], words: list[str]) -> list[str]:
    """One tag per word: run the pieces, take each word's first-piece prediction."""
    enc = tokenizer(words, is_split_into_words=True, return_word_ids=True, max_length=256)
    with torch.no_grad():
        logits = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])[0]  # (T, num_labels)
    return predictions_to_words(logits.argmax(-1), enc["word_ids"][0], len(words), labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", default=str(DATA / "conll2003" / "train.txt"), help="CoNLL training file")
    parser.add_argument("--valid", default=str(DATA / "conll2003" / "valid.txt"), help="CoNLL validation file")
    parser.add_argument("--model", default=MODEL, help="model folder, bert-kit run or hub name with a local copy")
    parser.add_argument("--max-train", type=int, default=500, help="training sentences (0: all)")
    parser.add_argument("--max-eval", type=int, default=300, help="validation sentences (0: all)")
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--output", default="runs/ner_example")
    args = parser.parse_args()

    config = FinetuneConfig(
        task="token-classification", model=args.model, train_file=args.train, validation_file=args.valid,
        max_train_examples=args.max_train or None, max_eval_examples=args.max_eval or None,
        max_length=256, epochs=args.epochs, batch_size=16, lr=args.lr, warmup_fraction=0.1,
        unpadded=True, output_dir=args.output, log_every=10)
    results = finetune(config)
    best = results["best_metrics"]
    print(f"\nbest validation entity F1 {best['f1']:.4f} (precision {best['precision']:.4f}, recall "
          f"{best['recall']:.4f}) at step {results['best_step']}; model in {results['best_model']}")

    # tag new sentences with the best model
    folder = results["best_model"]
    model, tokenizer = BERTForTokenClassification.from_pretrained(folder), get_tokenizer(folder)
    labels = read_model_metadata(folder)["label_names"]
    for text in ["Angela Merkel met Emmanuel Macron in Paris on Tuesday .",
                 "Shares of Apple rose 3 percent on the Nasdaq after the Reuters report ."]:
        words = text.split()
        tags = tag(model, tokenizer, labels, words)
        entities = [f"{' '.join(words[a:b + 1])} ({kind})" for kind, a, b in get_entities(tags)]
        print(f"\n{text}\n  tags:     {' '.join(tags)}\n  entities: {', '.join(entities) or 'none'}")


if __name__ == "__main__":
    main()
