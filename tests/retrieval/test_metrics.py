"""Retrieval metrics against pytrec_eval (trec_eval) on random runs with graded, zero and negative
judgments and tied scores, and by hand where pytrec_eval is absent.

    .venv/bin/python -m pytest tests/retrieval/test_metrics.py -q    # pip install pytrec-eval-terrier
"""

import math
import random

import pytest

from bert_kit.retrieval.metrics import check_cutoffs, evaluate_run, metric_names, query_metrics, ranked

CUTOFFS = {"ndcg": (1, 3, 10), "mrr": (1, 3, 10), "recall": (1, 5, 10, 100), "map": (5, 100), "precision": (1, 5)}
TREC = {"ndcg": "ndcg_cut_{}", "recall": "recall_{}", "map": "map_cut_{}", "precision": "P_{}"}


def random_case(rng: random.Random) -> tuple[dict, dict]:
    """Judgments with grades -1..3 (0 and -1 not relevant) and a run whose scores tie often."""
    docs = [f"d{i}" for i in range(rng.randint(1, 40))]
    qrels, run = {}, {}
    for q in range(rng.randint(1, 6)):
        judged = rng.sample(docs, rng.randint(1, len(docs)))
        qrels[f"q{q}"] = {d: rng.choice([-1, 0, 0, 1, 1, 2, 3]) for d in judged}
        retrieved = rng.sample(docs, rng.randint(1, len(docs)))
        run[f"q{q}"] = {d: rng.choice([0.1, 0.25, 0.5, rng.random()]) for d in retrieved}
    run["unjudged"] = {docs[0]: 1.0}  # a query the judgments do not name: left out, as pytrec_eval does
    return qrels, run


def test_metrics_equal_pytrec_eval_on_random_runs_with_ties():
    pytrec_eval = pytest.importorskip("pytrec_eval")
    rng = random.Random(0)
    measures = {"ndcg_cut.1,3,10", "recall.1,5,10,100", "map_cut.5,100", "P.1,5"}
    for _ in range(300):
        qrels, run = random_case(rng)
        ours = evaluate_run(qrels, run, CUTOFFS, per_query=True)
        reference = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
        assert set(ours) == set(reference) == set(qrels)
        for q in reference:
            for name, pattern in TREC.items():
                for k in CUTOFFS[name]:
                    assert ours[q][f"{name}@{k}"] == pytest.approx(reference[q][pattern.format(k)], abs=1e-12)
            for k in CUTOFFS["mrr"]:  # MTEB's MRR@k: trec_eval's reciprocal rank of the top k
                top = dict(sorted(run[q].items(), key=lambda x: (x[1], x[0]), reverse=True)[:k])
                rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate({q: top})[q]["recip_rank"]
                assert ours[q][f"mrr@{k}"] == pytest.approx(rr, abs=1e-12)
        means = evaluate_run(qrels, run, CUTOFFS)
        assert means["ndcg@10"] == pytest.approx(sum(r["ndcg_cut_10"] for r in reference.values()) / len(reference))


def test_ties_rank_by_document_id_highest_first():
    assert ranked(["d1", "d2", "d10", "d3"], [0.5, 0.5, 0.5, 0.9]) == ["d3", "d2", "d10", "d1"]
    # d2 ("d2" > "d10") outranks d1 at an equal score: the relevant d1 comes second
    assert query_metrics({"d1": 1}, ranked(["d1", "d2"], [0.5, 0.5]), {"mrr": (10,)}) == {"mrr@10": 0.5}


def test_one_query_by_hand():
    judged = {"a": 2, "b": 1, "c": 0, "d": -1, "e": 1}  # 3 relevant; e is never retrieved
    ranking = ["d", "a", "x", "b", "c"]  # grades -1 (a gain of 0), 2, 0 (unjudged), 1, 0
    got = query_metrics(judged, ranking, {"ndcg": (3,), "mrr": (1, 10), "recall": (2, 5), "map": (5,),
                                          "precision": (4,)})
    dcg3 = 2 / math.log2(3)
    idcg3 = 2 + 1 / math.log2(3) + 1 / math.log2(4)
    assert got == pytest.approx({"ndcg@3": dcg3 / idcg3, "mrr@1": 0.0, "mrr@10": 0.5, "recall@2": 1 / 3,
                                 "recall@5": 2 / 3, "map@5": (1 / 2 + 2 / 4) / 3, "precision@4": 2 / 4})
    nothing = query_metrics({"a": 0}, ["a", "b"], {"ndcg": (10,), "recall": (10,), "map": (10,)})
    assert nothing == {"ndcg@10": 0.0, "recall@10": 0.0, "map@10": 0.0}  # no relevant document: 0, not NaN


def test_cutoffs_are_checked_and_named_in_order():
    assert check_cutoffs({"recall": [100, 1, 10, 10], "ndcg": [10]}) == {"recall": (1, 10, 100), "ndcg": (10,)}
    assert metric_names({"recall": (1, 10), "ndcg": (10,)}) == ["ndcg@10", "recall@1", "recall@10"]
    with pytest.raises(ValueError, match="unknown retrieval metric 'ndgc'"):
        check_cutoffs({"ndgc": [10]})
    with pytest.raises(ValueError, match="must be >= 1"):
        check_cutoffs({"ndcg": [0]})
    with pytest.raises(ValueError, match="no retrieval metric"):
        check_cutoffs({"ndcg": []})
