"""Data: pretraining corpora and masking, and the fine-tuning task readers.

pretraining: corpus.py (readers, token cache, streaming), masking.py (MLM masking and collator),
pretraining.py (MLM / NSP datasets, resumable samplers, loaders).
tasks: classification.py, ner.py, squad.py, sts.py.
"""
