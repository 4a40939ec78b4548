"""Extractive question answering on SQuAD v1.1: fine-tune, score EM / F1, answer a new question.

    python examples/question_answering.py                    # a short CPU run: the mechanics, low scores
    python examples/question_answering.py --max-train 0 --max-eval 0 --epochs 2 --max-length 384 \\
        --doc-stride 128 --batch-size 32 --output runs/squad  # the full split (GPU)

QA needs a few thousand steps: the short default run (50 steps) only shows the pipeline at
work, while the full split with all-MiniLM-L6-v2 reached exact match 48 / F1 62 on the 10
held-out articles after 2 epochs (550 steps, half a minute on one H200).

Only the SQuAD dev file ships with the data, so it is split by article: the first 38 articles
train, the last 10 evaluate (no paragraph in both). A long context is cut into windows that
overlap by `doc_stride` tokens; the model scores every token as a start and as an end, and the
best valid span (start <= end, inside the context, at most 30 tokens) over all windows is the
answer. The run itself is `bert_kit.tasks.finetuning.finetune` (`bert-kit finetune --config
configs/finetune_squad.yaml`).
"""

from __future__ import annotations

import argparse

import torch

from bert_kit import BERTForQuestionAnswering, get_tokenizer
from bert_kit.data.squad import postprocess_predictions, prepare_eval_features
from bert_kit.tasks.finetuning import FinetuneConfig, finetune
from bert_kit.data.root import data_root

DATA = data_root()  # $BERT_KIT_DATA, else ./data (docs/data.md)
MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # a hub name: its local copy (docs/data.md)
CONTEXT = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is "
           "named after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 "
           "to 1889. It is 330 metres tall, about the height of an 81-storey building.")
QUESTIONS = ["Who is the tower named after?", "How tall is the Eiffel Tower?", "When was the tower built?"]


def answer(model, tokenizer, question: str, context: str, max_length: int, doc_stride: int) -> str:
    """Windows of the context -> start/end logits per window -> the best span's text."""
    example = {"id": "q", "question": question, "context": context, "answers": []}
    features = prepare_eval_features([example], tokenizer, max_length, doc_stride)
    starts, ends = [], []
    with torch.no_grad():
        for f in features:
            start, end = model(torch.tensor([f["input_ids"]]), token_type_ids=torch.tensor([f["token_type_ids"]]))
            starts.append(start[0].numpy())
            ends.append(end[0].numpy())
    return postprocess_predictions([example], features, starts, ends)["q"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--squad", default=str(DATA / "squad-v1.1" / "dev-v1.1.json"), help="SQuAD v1.1 JSON")
    parser.add_argument("--train-articles", type=int, default=38, help="articles to train on; the rest evaluate")
    parser.add_argument("--model", default=MODEL, help="model folder, bert-kit run or hub name with a local copy")
    parser.add_argument("--max-train", type=int, default=800, help="training windows (0: all)")
    parser.add_argument("--max-eval", type=int, default=100, help="evaluation questions (0: all)")
    parser.add_argument("--max-length", type=int, default=192)
    parser.add_argument("--doc-stride", type=int, default=64)
    parser.add_argument("--epochs", type=float, default=1)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--output", default="runs/qa_example")
    args = parser.parse_args()

    config = FinetuneConfig(
        task="qa", model=args.model, train_file=args.squad,
        qa={"train_articles": args.train_articles, "doc_stride": args.doc_stride},
        max_train_examples=args.max_train or None, max_eval_examples=args.max_eval or None,
        max_length=args.max_length, epochs=args.epochs, batch_size=args.batch_size,
        lr=args.lr, unpadded=True, output_dir=args.output, log_every=10)
    results = finetune(config)
    best = results["best_metrics"]
    print(f"\nheld-out articles: exact match {best['exact_match']:.1f}, F1 {best['f1']:.1f} on "
          f"{best['num_examples']} questions; model in {results['best_model']}")

    folder = results["best_model"]
    model, tokenizer = BERTForQuestionAnswering.from_pretrained(folder), get_tokenizer(folder)
    print(f"\n{CONTEXT}")
    for question in QUESTIONS:
        print(f"  Q: {question}\n  A: {answer(model, tokenizer, question, CONTEXT, args.max_length, args.doc_stride)}")


if __name__ == "__main__":
    main()
