"""Retrieval evaluation beside sentence-transformers: a model zero-shot on a BEIR split, both ways.

bert-kit: `bert-kit evaluate --task retrieval` (its own process, launch to exit), which writes
its metrics JSON and its ranking as a TREC run. sentence-transformers: `SentenceTransformer.encode`
of the same texts (title + " " + text, stripped, as MTEB; max_seq_length from the model, 256 for
all-MiniLM-L6-v2; batch 32 as MTEB), cosine scores, the top 1,000 per query as MTEB keeps them,
in its own process too. Both rankings are scored by the same code (`bert_kit.retrieval.metrics`)
and, where pytrec_eval is installed, by trec_eval's nDCG@10 as well. Printed side by side, with
each side's wall time and the figure MTEB publishes (nfcorpus, all-MiniLM-L6-v2: 31.59).

    python benchmarks/retrieval_eval.py                           # nfcorpus test from BERT_KIT_DATA
    python benchmarks/retrieval_eval.py --device cuda --data /path/to/beir/scifact

Targets (issue 50): bert-kit within 0.1 nDCG@10 of sentence-transformers on the same files, and
within 0.3 of MTEB's published figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
MTEB_PUBLISHED = {("nfcorpus", MODEL): 31.59}  # nDCG@10 x 100, MTEB's leaderboard
NAMES = ["ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100", "map@100"]


def st_worker(args: argparse.Namespace) -> None:
    """sentence-transformers' side, in this process: embed, score, keep the top 1,000, write the run."""
    import torch
    from sentence_transformers import SentenceTransformer

    from bert_kit.model_folder import resolve_model
    from bert_kit.retrieval.beir import read_beir

    data = read_beir(args.data, args.split, warn=False)
    model = SentenceTransformer(str(resolve_model(args.model)), device=args.device or None)
    query_ids = list(data.qrels)
    queries = model.encode([data.queries[q] for q in query_ids], batch_size=32, convert_to_tensor=True)
    docs = model.encode(data.corpus_texts, batch_size=32, convert_to_tensor=True, show_progress_bar=True)
    scores = model.similarity(queries, docs)  # cosine for this model, as MTEB scores it
    values, indices = torch.topk(scores, min(1000, scores.shape[1]), dim=1)
    run = {q: {data.corpus_ids[j]: float(v) for v, j in zip(vrow, irow)}
           for q, vrow, irow in zip(query_ids, values.tolist(), indices.tolist())}
    Path(args.worker_output).write_text(json.dumps({"run": run, "max_seq_length": model.max_seq_length}))


def score(run: dict, qrels: dict) -> dict:
    """bert-kit's metrics of a run, plus pytrec_eval's nDCG@10 where it is installed."""
    from bert_kit.retrieval.metrics import evaluate_run

    out = evaluate_run(qrels, run, {"ndcg": (10,), "mrr": (10,), "recall": (1, 10, 100), "map": (100,)})
    try:
        import pytrec_eval
    except ImportError:
        return out
    per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    out["trec_eval ndcg@10"] = sum(m["ndcg_cut_10"] for m in per_query.values()) / len(per_query)
    return out


def read_trec_run(path: Path) -> dict:
    run: dict = {}
    for line in path.read_text().splitlines():
        query, _, doc, _, value, _ = line.split()
        run.setdefault(query, {})[doc] = float(value)
    return run


def timed(command: list[str]) -> float:
    """Seconds from launch to exit; the command's output passes through."""
    t0 = time.perf_counter()
    subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = Path(os.environ.get("BERT_KIT_DATA", REPO.parent / "shared" / "data"))
    parser.add_argument("--data", type=Path, default=root / "nfcorpus", help="a BEIR folder (default nfcorpus)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda if available)")
    parser.add_argument("--worker", choices=("st",), help=argparse.SUPPRESS)
    parser.add_argument("--worker-output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return st_worker(args)

    from bert_kit.retrieval.beir import read_beir
    from bert_kit.retrieval.metrics import ranked

    qrels = read_beir(args.data, args.split, warn=False).qrels
    device = ["--device", args.device] if args.device else []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bk_seconds = timed([sys.executable, "-m", "bert_kit", "evaluate", "--task", "retrieval", "--model", args.model,
                            "--data", str(args.data), "--split", args.split, "--output", str(tmp / "bk.json"),
                            "--save-run", str(tmp / "bk.run"), "--top-k", "1000", *device])
        st_seconds = timed([sys.executable, __file__, "--worker", "st", "--worker-output", str(tmp / "st.json"),
                            "--data", str(args.data), "--split", args.split, "--model", args.model, *device])
        bk_json = json.loads((tmp / "bk.json").read_text())
        bk_run = read_trec_run(tmp / "bk.run")
        st = json.loads((tmp / "st.json").read_text())
    bk, ref = score(bk_run, qrels), score(st["run"], qrels)
    top10 = lambda run, q: ranked(list(run[q]), list(run[q].values()))[:10]  # noqa: E731  (ties by id)
    same_top10 = sum(top10(bk_run, q) == top10(st["run"], q) for q in qrels)
    print(f"\n{args.data.name} {args.split}: {len(qrels)} queries, {bk_json['num_docs']} documents, {args.model}, "
          f"max length {bk_json['max_length']} (sentence-transformers {st['max_seq_length']}), "
          f"bert-kit in {bk_json['precision']}")
    print(f"{'metric (x100)':<20} {'bert-kit':>10} {'sentence-tr.':>13} {'difference':>11}")
    for name in [*NAMES, "trec_eval ndcg@10"]:
        if name in bk:
            print(f"{name:<20} {100 * bk[name]:>10.2f} {100 * ref[name]:>13.2f} {100 * (bk[name] - ref[name]):>+11.3f}")
    published = MTEB_PUBLISHED.get((args.data.name, args.model))
    if published is not None:
        print(f"{'MTEB published':<20} {published:>10.2f}    bert-kit {100 * bk['ndcg@10'] - published:+.3f}")
    print(f"same top 10 for {same_top10} of {len(qrels)} queries")
    print(f"{'wall, launch to exit':<20} {bk_seconds:>9.1f}s {st_seconds:>12.1f}s")


if __name__ == "__main__":
    main()
