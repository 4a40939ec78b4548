"""STS-B data: the reader on the real benchmark files (quotes, extra fields) and malformed files,
the regression loader and the correlation scoring.

Run: .venv/bin/python -m pytest tests/data/test_sts.py -q
"""

import numpy as np
import pytest
import scipy.stats
import torch

from bert_kit.data.sts import (
    cosine_similarity_scores,
    create_sts_dataloader,
    evaluate_sts_predictions,
    read_pair_file,
    read_sts,
)


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from bert_kit.tokenizer import get_tokenizer

    return get_tokenizer(minilm_path)


@pytest.mark.parametrize("split,count", [("train", 5749), ("dev", 1500), ("test", 1379)])
def test_read_sts_published_counts(data_dir, split, count):
    s1, s2, scores = read_sts(data_dir / "stsb" / f"sts-{split}.csv")
    assert len(s1) == len(s2) == len(scores) == count
    assert all(0.0 <= s <= 5.0 for s in scores) and all(type(s) is float for s in scores)


def test_read_sts_dev_rows(data_dir):
    s1, s2, scores = read_sts(data_dir / "stsb" / "sts-dev.csv")
    assert (s1[0], s2[0], scores[0]) == ("A man with a hard hat is dancing.",
                                        "A man wearing a hard hat is dancing.", 5.0)
    # line 268 holds literal quotes, which a CSV parser would take as field delimiters
    assert (s2[267], scores[267]) == ('a woman is standing by a pillar where "u2" is written.', 4.2)
    raw = (data_dir / "stsb" / "sts-dev.csv").read_text(encoding="utf-8").splitlines()
    extra = [i for i, line in enumerate(raw) if len(line.split("\t")) > 7]
    assert len(extra) == 22  # rows with two trailing source notes (published figure)
    for i in extra[:5]:
        fields = raw[i].split("\t")
        assert (s1[i], s2[i], scores[i]) == (fields[5], fields[6], float(fields[4]))


def write(tmp_path, text):
    path = tmp_path / "sts-bad.csv"
    path.write_text(text, encoding="utf-8")
    return path


GOOD = "g\tf\t2012\t0001\t4.0\tA cat.\tA dog.\n"


@pytest.mark.parametrize("bad,match", [
    ("g\tf\t2012\t0002\t3.5\tonly one sentence\n", r"sts-bad\.csv:2: expected at least 7"),
    ("g\tf\t2012\t0002\tabc\ts1\ts2\n", r"sts-bad\.csv:2: score 'abc' \(field 5\) is not a number"),
    ("g\tf\t2012\t0002\tnan\ts1\ts2\n", r"sts-bad\.csv:2: score 'nan' is not finite"),
    ("g\tf\t2012\t0002\t5.2\ts1\ts2\n", r"sts-bad\.csv:2: score '5\.2' is outside the score range \[0, 5\]"),
    ("g\tf\t2012\t0002\t-0.1\ts1\ts2\n", r"sts-bad\.csv:2: score '-0\.1' is outside the score range"),
])
def test_malformed_sts_names_file_and_line(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        read_sts(write(tmp_path, GOOD + bad))


def test_glue_layout_with_header(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                    "sentence2\tscore\n0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\t"
                    'A "man".\tA man.\t5.000\n1\tg\tf\ty\to\ts\ts\tshort\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"dev\.tsv:3: expected at least 10"):
        read_sts(path)
    path.write_text("\n".join(path.read_text(encoding="utf-8").splitlines()[:2]), encoding="utf-8")
    assert read_sts(path) == (['A "man".'], ["A man."], [5.0])


def test_loader_makes_float_pair_batches(data_dir, tokenizer):
    s1, s2, scores = read_sts(data_dir / "stsb" / "sts-dev.csv")
    data = (s1[:20], s2[:20], scores[:20])
    batch = next(iter(create_sts_dataloader(data, tokenizer, batch_size=8, shuffle=False)))
    assert batch["labels"].dtype == torch.float32
    torch.testing.assert_close(batch["labels"], torch.tensor(scores[:8]))
    first = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
    assert first == tokenizer.encode(s1[0], s2[0])
    assert batch["token_type_ids"][0].sum() > 0  # second sentence is segment 1
    norm = next(iter(create_sts_dataloader(data, tokenizer, batch_size=8, shuffle=False,
                                           normalize=True)))
    torch.testing.assert_close(norm["labels"], torch.tensor(scores[:8]) / 5)


def test_scoring_matches_scipy():
    rng = np.random.default_rng(0)
    gold = np.round(rng.uniform(0, 5, 100), 1)
    pred = gold + rng.normal(0, 1, 100)
    out = evaluate_sts_predictions(pred, gold)
    assert out["pearson"] == pytest.approx(scipy.stats.pearsonr(pred, gold)[0], abs=1e-12)
    assert out["spearman"] == pytest.approx(scipy.stats.spearmanr(pred, gold)[0], abs=1e-12)
    with pytest.raises(ValueError, match="3 predictions but 2"):
        evaluate_sts_predictions([1, 2, 3], [1, 2])


def test_cosine_similarity_scores():
    a = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    b = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    ref = torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=1)
    torch.testing.assert_close(torch.from_numpy(cosine_similarity_scores(a, b)), ref,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cosine_similarity_scores(a, a), np.ones(6), rtol=1e-12)


def test_sts_file_with_bom_crlf_and_a_declared_range(tmp_path):
    path = tmp_path / "sts.csv"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.replace("4.0", "4.5").replace("\n", "\r\n").encode())
    assert read_sts(path) == (["A cat."], ["A dog."], [4.5])
    with pytest.raises(ValueError, match=r"sts\.csv:1: score '4\.5' is outside the score range \[1, 4\]"):
        read_sts(path, score_range=(1, 4))


PAIRS = "id,left,right,similarity,fold\n1,a cat sits,a cat is sitting,4.5,train\n2,a man runs,rain falls,1,test\n" \
        "3,two dogs,dogs play,3.25,train\n"


def test_pair_file_with_named_columns_range_and_split_column(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text(PAIRS, encoding="utf-8")
    s1, s2, scores = read_pair_file(path, "left", "right", "similarity", (1, 5), where={"fold": "train"})
    assert (s1, s2, scores) == (["a cat sits", "two dogs"], ["a cat is sitting", "dogs play"], [4.5, 3.25])
    s1, s2, scores = read_pair_file(path, 1, 2, None, header=True, where={4: "test"})  # by index, unscored
    assert (s1, s2, scores) == (["a man runs"], ["rain falls"], None)
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"a": "x", "b": "y", "s": 5}\n{"a": "p", "b": "q", "s": 1.5}\n', encoding="utf-8")
    assert read_pair_file(jsonl, "a", "b", "s", (1, 5)) == (["x", "p"], ["y", "q"], [5.0, 1.5])


@pytest.mark.parametrize("row,match", [
    ("4,a,b,0.5,train", r"pairs\.csv:5: score '0\.5' is outside the score range \[1, 5\]"),
    ("4,a,b,5.5,train", r"pairs\.csv:5: score '5\.5' is outside the score range \[1, 5\]"),
    ("4,a,b,high,train", r"pairs\.csv:5: score 'high' is not a number"),
    ("4,a,b,,train", r"pairs\.csv:5: score '' is not a number"),
    ("4,a,b,inf,train", r"pairs\.csv:5: score 'inf' is not finite"),
])
def test_pair_file_bad_scores_name_the_line(tmp_path, row, match):
    path = tmp_path / "pairs.csv"
    path.write_text(PAIRS + row + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        read_pair_file(path, "left", "right", "similarity", (1, 5))


def test_pair_file_json_types(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"a": "x", "b": "y", "s": true}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.jsonl:1: score True is not a number"):
        read_pair_file(path, "a", "b", "s")
    path.write_text('{"a": "x", "b": 3, "s": 1}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.jsonl:1: column 'b' holds int, expected a sentence"):
        read_pair_file(path, "a", "b", "s")
