"""A small BEIR folder written by the tests: short medical documents, queries and graded qrels."""

import gzip
import json
from pathlib import Path

DOCS = {
    "d1": ("Statins and breast cancer", "Statin use was linked to lower breast cancer mortality in Finland."),
    "d2": ("Vitamin D", "Vitamin D supplements did not prevent fractures in older adults."),
    "d3": ("", "Cholesterol feeds the growth of breast cancer cells in the laboratory."),
    "d4": ("Asthma and diet", "Children eating more fruit and vegetables had fewer asthma attacks."),
    "d5": ("Coffee", "Drinking coffee was associated with a lower risk of liver disease."),
    "d6": ("Eczema", "Probiotics given to infants reduced the rate of eczema."),
    "d7": ("Red meat", "Processed red meat intake raised the risk of colorectal cancer."),
    "d8": ("Sleep", "Short sleep was tied to weight gain among adolescents."),
    "d9": ("Green tea", "Green tea catechins lowered blood pressure slightly."),
    "d10": ("Fiber", "A high fiber diet improved blood sugar control in type 2 diabetes."),
    "d11": ("Salt", "Cutting dietary salt reduced blood pressure in hypertensive patients."),
    "d12": ("Nuts", "Eating nuts daily was associated with lower mortality."),
}
QUERIES = {
    "q1": "Do breast cancer cells feed on cholesterol?",
    "q2": "Can diet treat asthma and eczema?",
    "q3": "Does salt raise blood pressure?",
    "q4": "Is coffee good for the liver?",
    "q5": "Which foods lower mortality?",
    "q9": "A query of another split",
}
QRELS = {
    "q1": {"d3": 2, "d1": 1},
    "q2": {"d4": 2, "d6": 1, "d2": 0},
    "q3": {"d11": 2, "d9": 1},
    "q4": {"d5": 1},
    "q5": {"d12": 1, "d1": 0},
}


def write_beir(folder: Path, docs: dict = DOCS, queries: dict = QUERIES, qrels: dict = QRELS,
               split: str = "test", gz: bool = False) -> Path:
    """corpus.jsonl, queries.jsonl and qrels/{split}.tsv (with BEIR's header), gzipped with gz."""
    (folder / "qrels").mkdir(parents=True, exist_ok=True)

    def write(path: Path, text: str) -> None:
        if gz:
            with gzip.open(f"{path}.gz", "wt", encoding="utf-8") as f:
                f.write(text)
        else:
            path.write_text(text, encoding="utf-8")

    write(folder / "corpus.jsonl", "".join(json.dumps({"_id": d, "title": t, "text": x, "metadata": {}}) + "\n"
                                           for d, (t, x) in docs.items()))
    write(folder / "queries.jsonl", "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    write(folder / "qrels" / f"{split}.tsv", "query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{s}\n" for q, judged in qrels.items() for d, s in judged.items()))
    return folder
