"""A complete text-classification run on a TSV file, written out with the library's pieces.

    python examples/train_bert_classification.py                       # SST-2 slice, ~30 s on a CPU
    python examples/train_bert_classification.py data.tsv --dev dev.tsv --epochs 3 --max-train 0

The TSV needs a header with `sentence` and `label` columns (other names: --text-column,
--label-column); labels may be ints or names. Steps: read the file, tokenize into dynamically
padded batches, put a classification head on a pretrained encoder, train with AdamW and linear
warmup/decay, evaluate (accuracy, F1, confusion matrix PNG), save an HF-loadable folder and
classify a few new sentences. `bert-kit finetune --task classification` runs the same recipe
with checkpoints, resume, mixed precision and best-model selection (configs/finetune_sst2.yaml).
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from bert_kit import BERTForSequenceClassification, compute_classification_loss, create_classification_dataloader
from bert_kit import evaluate_classification_metrics, get_tokenizer
from bert_kit.data.classification import read_classification_file
from bert_kit.kernels import fast_path
from bert_kit.metrics import plot_confusion_matrix
from bert_kit.training.optim import create_optimizer, create_scheduler
from bert_kit.data.root import data_root

DATA = data_root()  # $BERT_KIT_DATA, else ./data (docs/data.md)
MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # a hub name: its local copy (docs/data.md)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("train", nargs="?", default=str(DATA / "sst2" / "train.tsv"), help="training TSV")
    parser.add_argument("--dev", default=None, help="evaluation TSV (default: SST-2 dev for the default train "
                                                    "file, else 10%% of the training rows)")
    parser.add_argument("--model", default=MODEL, help="model folder, bert-kit run or hub name with a local copy")
    parser.add_argument("--text-column", default="sentence")
    parser.add_argument("--label-column", default="label")
    parser.add_argument("--label-names", nargs="*", default=None,
                        help="names of label ids 0..K-1 (SST-2: negative positive)")
    parser.add_argument("--max-train", type=int, default=500, help="use only N training rows (0: all)")
    parser.add_argument("--max-dev", type=int, default=200, help="evaluate on N rows (0: all)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--output", default="runs/classification_example", help="folder for the model and plots")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    # 1. data: texts and labels from the TSV; a dev split from the same file if none is given
    train = read_classification_file(args.train, args.text_column, args.label_column)
    texts, labels = train.texts, train.labels
    if Path(args.train) == DATA / "sst2" / "train.tsv":  # the default data set
        args.dev = args.dev or str(DATA / "sst2" / "dev.tsv")
        args.label_names = args.label_names or ["negative", "positive"]
    if args.dev:
        dev = read_classification_file(args.dev, args.text_column, args.label_column, label_names=train.label_names)
        dev_texts, dev_labels = dev.texts, dev.labels
    else:
        order = list(range(len(texts)))
        random.Random(0).shuffle(order)
        cut = max(1, len(order) // 10)
        dev_texts, dev_labels = [texts[i] for i in order[:cut]], [labels[i] for i in order[:cut]]
        texts, labels = [texts[i] for i in order[cut:]], [labels[i] for i in order[cut:]]
    if args.max_train:
        texts, labels = texts[: args.max_train], labels[: args.max_train]
    if args.max_dev:
        dev_texts, dev_labels = dev_texts[: args.max_dev], dev_labels[: args.max_dev]
    names = train.label_names or args.label_names or [str(i) for i in range(max(labels) + 1)]
    print(f"{len(texts)} training / {len(dev_texts)} evaluation rows, labels {names}")

    # 2. tokenizer and dynamically padded batches: [CLS] text [SEP], each batch padded to its longest row
    tokenizer = get_tokenizer(args.model)
    train_loader = create_classification_dataloader(texts, labels, tokenizer, batch_size=args.batch_size,
                                                     max_length=args.max_length, seed=0)
    dev_loader = create_classification_dataloader(dev_texts, dev_labels, tokenizer, batch_size=128,
                                                  max_length=args.max_length, shuffle=False)

    # 3. the pretrained encoder with a new, randomly initialised classifier on the pooled [CLS]
    model = BERTForSequenceClassification.from_pretrained(args.model, num_labels=len(names)).to(device)
    model.id2label = {str(i): n for i, n in enumerate(names)}  # saved into config.json
    print(fast_path.apply(model, device, training=True))  # the kernels this device allows (none on a CPU)
    steps = args.epochs * len(train_loader)
    optimizer = create_optimizer(model, "adamw", lr=args.lr, weight_decay=0.01)
    scheduler = create_scheduler(optimizer, warmup_steps=max(1, steps // 10), total_steps=steps)

    # 4. the training loop: forward, loss, backward, clip, step
    start = time.time()
    for epoch in range(args.epochs):
        model.train()
        total = 0.0
        for batch in train_loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])  # (B, C)
            loss = compute_classification_loss(logits, batch["labels"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            total += loss.item()
        metrics = evaluate_classification_metrics(model, dev_loader, device=device, num_classes=len(names))
        print(f"epoch {epoch + 1}: train loss {total / len(train_loader):.4f}, dev accuracy "
              f"{metrics['accuracy']:.4f}, macro F1 {metrics['f1']:.4f} ({time.time() - start:.0f}s)")

    # 5. save: an HF folder (weights, config with label names, tokenizer) and the confusion matrix
    out = Path(args.output)
    model.save_pretrained(out / "model")
    tokenizer.save(out / "model")
    png = plot_confusion_matrix(metrics["confusion_matrix"], names, out / "confusion_matrix.png")
    print(f"saved {out / 'model'} and {png}")

    # 6. use it: probabilities for new sentences
    model.eval()
    new = ["an utterly charming and moving film", "a tedious , joyless mess"]
    batch = tokenizer(new, max_length=args.max_length)
    with torch.no_grad():
        probs = model(**{k: v.to(device) for k, v in batch.items()}).softmax(-1).cpu()
    for text, p in zip(new, probs):
        print(f"{text!r}: {names[int(p.argmax())]} ({float(p.max()):.2f})")


if __name__ == "__main__":
    main()
