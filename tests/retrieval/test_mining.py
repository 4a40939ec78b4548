"""Hard-negative mining against a brute-force reference of sentence-transformers' rules, the
output files a training run reads back, and `bert-kit mine-negatives`.

    .venv/bin/python -m pytest tests/retrieval/test_mining.py -q
"""

import json

import numpy as np
import pytest
import torch

from bert_kit.cli import main as cli_main
from bert_kit.config import BertConfig
from bert_kit.data.tables import read_table
from bert_kit.embeddings import SentenceEncoder
from bert_kit.model import BERTModel
from bert_kit.retrieval.beir import read_beir
from bert_kit.retrieval.mining import MiningSettings, mine_hard_negatives, write_rows
from bert_kit.tokenizer import get_tokenizer
from tests.retrieval.beir_files import DOCS, write_beir

pytestmark = pytest.mark.usefixtures("one_torch_thread")
WORDS = "heart liver cancer diet salt sugar sleep coffee tea fiber nuts meat fruit kidney bone".split()


@pytest.fixture(scope="module")
def encoder(minilm_path):
    torch.manual_seed(0)
    model = BERTModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=64))
    return SentenceEncoder(model, get_tokenizer(minilm_path), max_length=32, device="cpu")


def pairs_and_corpus(seed: int = 0):
    """12 queries with one or two positives each (one query listed twice), 40 other passages (one repeated)."""
    rng = np.random.default_rng(seed)
    text = lambda n: " ".join(rng.choice(WORDS, size=n))  # noqa: E731
    queries = [text(3) for _ in range(12)]
    anchors, positives = [], []
    for i, q in enumerate(queries):
        for _ in range(1 + i % 2):
            anchors.append(q)
            positives.append(text(6))
    corpus = [text(6) for _ in range(40)]
    return anchors, positives, corpus + [corpus[0], positives[0]]


def reference(encoder, anchors, positives, corpus, s: MiningSettings):
    """Each unique query's negatives by the rules, computed on the full score matrix."""
    queries, passages = list(dict.fromkeys(anchors)), list(dict.fromkeys([*corpus, *positives]))
    own = {q: {passages.index(p) for a, p in zip(anchors, positives) if a == q} for q in queries}
    scores = encoder.encode(queries) @ encoder.encode(passages).T  # unit vectors: cosine
    window = s.window(max(map(len, own.values())))
    out = {}
    for i, q in enumerate(queries):
        weakest = min(scores[i, j] for j in own[q])
        raw = np.argsort(-scores[i], kind="stable")[: window + max(map(len, own.values()))]
        kept = [j for j in raw if j not in own[q]
                and (s.margin is None or scores[i, j] + s.margin <= weakest)
                and (s.relative_margin is None or scores[i, j] <= weakest - abs(weakest) * s.relative_margin)
                and (s.max_score is None or scores[i, j] <= s.max_score)
                and (s.min_score is None or scores[i, j] >= s.min_score)]
        out[q] = [passages[j] for j in kept[s.range_min: window][: s.num_negatives]]
    return out


@pytest.mark.parametrize("settings", [
    MiningSettings(),
    MiningSettings(num_negatives=4, range_min=2, range_max=9, margin=0.0),
    MiningSettings(num_negatives=2, relative_margin=0.05, max_score=0.99, min_score=-0.5),
    MiningSettings(num_negatives=5, range_min=3, margin=0.02),
])
def test_negatives_follow_the_rules(encoder, settings):
    anchors, positives, corpus = pairs_and_corpus()
    mined = mine_hard_negatives(encoder, anchors, positives, corpus, settings)
    expect = reference(encoder, anchors, positives, corpus, settings)
    got = {mined.anchors[q]: [mined.corpus[j] for j in negs] for q, negs in enumerate(mined.negatives)}
    assert got == expect
    assert len(mined.corpus) == 40 + len(positives)  # a repeated passage, and a positive in the corpus, count once
    for q, negs in enumerate(mined.negatives):
        assert not set(negs) & {p for qq, p in mined.pairs if qq == q}  # never a positive of its query
    for scores in mined.negative_scores:
        assert scores == sorted(scores, reverse=True)
    filtered = [v for v in (settings.margin, settings.relative_margin, settings.max_score) if v is not None]
    assert sum(mined.skipped.values()) > 0 or not filtered  # the rules had candidates to drop


def test_triplets_and_n_tuples(encoder):
    anchors, positives, corpus = pairs_and_corpus(1)
    mined = mine_hard_negatives(encoder, anchors, positives, corpus, MiningSettings(num_negatives=3, margin=0.05))
    triplets = mined.rows("triplet", scores=True)
    assert len(triplets) == sum(len(mined.negatives[q]) for q, _ in mined.pairs)
    assert set(triplets[0]) == {"anchor", "positive", "negative", "scores"}
    assert triplets[0]["anchor"] == anchors[0] and triplets[0]["positive"] == positives[0]
    assert triplets[0]["scores"][0] > triplets[0]["scores"][1]  # the margin holds
    tuples = mined.rows("n-tuple")
    full = [i for i, (q, _) in enumerate(mined.pairs) if len(mined.negatives[q]) == 3]
    assert len(tuples) == len(full) and set(tuples[0]) == {"anchor", "positive", "negative_1", "negative_2",
                                                            "negative_3"}
    assert "pair(s) got fewer than 3 negatives" in mined.summary() or len(full) == len(mined.pairs)


def test_random_sampling_draws_from_the_window(encoder):
    anchors, positives, corpus = pairs_and_corpus(2)
    top = mine_hard_negatives(encoder, anchors, positives, corpus, MiningSettings(num_negatives=12, range_max=12))
    drawn = mine_hard_negatives(encoder, anchors, positives, corpus,
                                MiningSettings(num_negatives=3, range_max=12, sampling="random", seed=5))
    again = mine_hard_negatives(encoder, anchors, positives, corpus,
                                MiningSettings(num_negatives=3, range_max=12, sampling="random", seed=5))
    assert drawn.negatives == again.negatives
    assert any(d != t[:3] for d, t in zip(drawn.negatives, top.negatives))  # not simply the best three
    for d, t, scores in zip(drawn.negatives, top.negatives, drawn.negative_scores):
        assert set(d) <= set(t) and len(d) == 3 and scores == sorted(scores, reverse=True)


def test_rescoring_replaces_the_embedding_scores(encoder):
    """The seam for a cross-encoder: its scores decide the negatives and the margin."""
    anchors, positives, corpus = pairs_and_corpus(3)
    by_length = lambda query, passages: [float(len(p)) for p in passages]  # noqa: E731
    mined = mine_hard_negatives(encoder, anchors, positives, corpus, MiningSettings(num_negatives=2),
                                rescore=by_length)
    for q, negs in enumerate(mined.negatives):
        assert mined.negative_scores[q] == [float(len(mined.corpus[j])) for j in negs]
    assert mined.positive_scores == [float(len(mined.corpus[p])) for _, p in mined.pairs]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="fewer than num_negatives 5 places"):
        MiningSettings(num_negatives=5, range_min=10, range_max=12).window(1)
    with pytest.raises(ValueError, match="sampling must be"):
        MiningSettings(sampling="best")
    with pytest.raises(ValueError, match="margin must be >= 0"):
        MiningSettings(margin=-0.1)
    with pytest.raises(ValueError, match="min_score 0.9 is above max_score 0.1"):  # it mined nothing, after the search
        MiningSettings(min_score=0.9, max_score=0.1)
    assert MiningSettings(num_negatives=3, range_min=2).window(2) == 2 + 3 + 2
    assert MiningSettings(num_negatives=3, relative_margin=0.05).window(1) == 3 * 10 + 1  # room for the margin


@pytest.mark.parametrize("suffix", [".jsonl", ".tsv", ".csv"])
def test_written_rows_read_back(tmp_path, suffix):
    rows = [{"anchor": "q, one", "positive": 'a "quoted" text', "negative_1": "n1", "negative_2": "n2"},
            {"anchor": "q2", "positive": "p2", "negative_1": "n3", "negative_2": "n4"}]
    path = write_rows(tmp_path / f"rows{suffix}", rows)
    columns = ["anchor", "positive", "negative_1", "negative_2"]
    back = [values for _, values in read_table(path, columns, header=None if suffix == ".jsonl" else True)]
    assert back == [[r[c] for c in columns] for r in rows]


def test_a_tsv_refuses_texts_with_tabs(tmp_path):
    with pytest.raises(ValueError, match=r"row 1: the positive text holds a tab .* rows.jsonl or rows.csv"):
        write_rows(tmp_path / "rows.tsv", [{"anchor": "a", "positive": "b\tc", "negative": "d"}])


def test_mine_negatives_command_on_a_beir_folder_and_a_pairs_file(tmp_path, minilm_path, capsys):
    folder = write_beir(tmp_path / "med", split="train")
    out = tmp_path / "hard.jsonl"
    rc = cli_main(["mine-negatives", "--model", str(minilm_path), "--data", str(folder), "--output", str(out),
                   "--num-negatives", "2", "--output-scores"])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    data = read_beir(folder, "train")
    relevant = {data.queries[q]: {dict(zip(data.corpus_ids, data.corpus_texts))[d] for d, g in j.items() if g > 0}
                for q, j in data.qrels.items()}
    assert len(rows) == 2 * sum(len(r) for r in relevant.values())  # 12 documents: 2 negatives for every pair
    for row in rows:
        assert row["positive"] in relevant[row["anchor"]] and row["negative"] not in relevant[row["anchor"]]
    assert "wrote 16 triplet row(s)" in capsys.readouterr().out

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("query\tanswer\n" + "".join(f"{t}\t{x}\n" for t, x in list(DOCS.values())[:4] if t))
    extra = tmp_path / "extra.txt"
    extra.write_text("\n".join(x for _, x in list(DOCS.values())[4:]) + "\n")
    tsv = tmp_path / "hard.tsv"
    rc = cli_main(["mine-negatives", "--model", str(minilm_path), "--data", str(pairs), "--anchor-column", "query",
                   "--positive-column", "answer", "--corpus", str(extra), "--output", str(tsv), "--format", "n-tuple",
                   "--num-negatives", "3"])
    assert rc == 0
    lines = tsv.read_text().splitlines()
    assert lines[0].split("\t") == ["anchor", "positive", "negative_1", "negative_2", "negative_3"]
    assert len(lines) == 1 + 3  # three titled documents among the first four
    bad = cli_main(["mine-negatives", "--model", str(minilm_path), "--data", str(pairs), "--output",
                    str(tmp_path / "x.jsonl"), "--range-min", "5", "--range-max", "6", "--num-negatives", "3"])
    assert bad == 2 and "fewer than num_negatives 3 places" in capsys.readouterr().err
    # a margin no cosine can keep: every candidate skipped; it exited 0 after writing an empty file
    none = tmp_path / "none.jsonl"
    rc = cli_main(["mine-negatives", "--model", str(minilm_path), "--data", str(pairs), "--output", str(none),
                   "--margin", "2.5"])
    captured = capsys.readouterr()
    assert rc == 1 and not none.exists() and "skipped" in captured.out, captured.out + captured.err
    assert "no triplet row to write" in captured.err and f"{none} not written" in captured.err


def test_mine_negatives_never_writes_over_a_file_of_its_beir_folder(tmp_path, minilm_path, capsys):
    folder = write_beir(tmp_path / "med", split="train")
    before = (folder / "corpus.jsonl").read_bytes()
    rc = cli_main(["mine-negatives", "--model", str(minilm_path), "--data", str(folder), "--output",
                   str(folder / "corpus.jsonl")])
    assert rc == 2 and "is the input file" in capsys.readouterr().err
    assert (folder / "corpus.jsonl").read_bytes() == before


@pytest.mark.parametrize("name, text", [
    ("pairs.tsv", "query\tanswer\n{}\t{}\n{}\t{}\n{}\t{}\n"),
    ("pairs.jsonl", '{{"query": "{}", "answer": "{}"}}\n' * 3),
])
def test_mine_negatives_reads_a_pairs_file_by_its_header_by_default(tmp_path, minilm_path, capsys, name, text):
    """The default columns are the first two of the header line or JSON keys: read by index, the
    header line was mined as a pair and a JSON record was refused."""
    pairs = [(f"{title}?", body) for title, body in list(DOCS.values())[:3]]
    source = tmp_path / name
    source.write_text(text.format(*[t for pair in pairs for t in pair]))
    out = tmp_path / "hard.jsonl"
    rc = cli_main(["mine-negatives", "--model", str(minilm_path), "--data", str(source), "--output", str(out),
                   "--num-negatives", "1"])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["anchor"], r["positive"]) for r in rows) == sorted(pairs)
    header_only = tmp_path / "header.tsv"
    header_only.write_text("query\tanswer\n")
    assert cli_main(["mine-negatives", "--model", str(minilm_path), "--data", str(header_only), "--output",
                     str(out)]) == 2
    assert f"{header_only}: only a header line, no data rows" in capsys.readouterr().err
