"""``python -m bert_kit.numpy_ref --config X.yaml --output results.json``: train and evaluate."""

from .runner import main

if __name__ == "__main__":
    main()
