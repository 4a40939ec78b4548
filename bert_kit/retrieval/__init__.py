"""Retrieval with embedding models: BEIR data, MTEB's metrics, exact search, hard negatives.

| module       | what                                                                              |
| ------------ | --------------------------------------------------------------------------------- |
| beir.py      | read a BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv, gzipped or not)  |
| metrics.py   | nDCG, MRR, Recall, MAP, P at k with trec_eval's (pytrec_eval's) and MTEB's rules   |
| search.py    | top-k per query: exact matrix products on the device in corpus chunks, or FAISS    |
| evaluator.py | `RetrievalEvaluator`: embed, search and score a split (`bert-kit evaluate --task retrieval`) |
| mining.py    | hard negatives for (query, positive) pairs (`bert-kit mine-negatives`)             |

Embedding goes through `bert_kit.embeddings.SentenceEncoder` (token-budget batches, bf16 on a
GPU). See docs/retrieval.md.
"""
