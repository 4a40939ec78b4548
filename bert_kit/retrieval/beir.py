"""BEIR data: a corpus, queries and graded relevance judgments, in the layout BEIR distributes.

    FOLDER/corpus.jsonl      {"_id": "MED-10", "title": "...", "text": "...", ...}  one document a line
    FOLDER/queries.jsonl     {"_id": "PLAIN-3", "text": "..."}                      one query a line
    FOLDER/qrels/test.tsv    query-id <TAB> corpus-id <TAB> score, after that header line

Each file may also be gzipped (`corpus.jsonl.gz`, `qrels/test.tsv.gz`), as MTEB's copies are.
Judgments may also be TREC qrels lines (`query-id 0 corpus-id score`, whitespace separated).

As BEIR and MTEB read them:
- a document is embedded as its title and text joined by a space, stripped (the text alone when
  it has no title);
- the queries of a split are the ones its qrels judge (queries.jsonl may hold every split's);
- scores are integer grades: nDCG uses them as gains; a score <= 0 means not relevant;
- a judged document missing from the corpus still counts as relevant (it cannot be retrieved),
  as pytrec_eval counts it; `read_beir` says how many there are.

Malformed input is a ValueError naming the file and line: bad JSON, a missing `_id` or `text`,
a repeated `_id`, a score that is not an integer, a judged query that queries.jsonl lacks.
`subsample` keeps a few queries and a part of the corpus, for a quick evaluation during training.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from bert_kit.data import decode_error


@dataclass
class BeirData:
    """One split of a BEIR folder.

    corpus_ids, corpus_texts: the documents in file order, texts as embedded (title + " " + text);
    queries: query id -> text, for the queries the split judges (in the qrels' order);
    qrels: query id -> {document id: integer grade}.
    """

    corpus_ids: list[str]
    corpus_texts: list[str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    name: str = ""
    split: str = ""
    missing_docs: int = field(default=0)  # judged documents that are not in the corpus

    def __post_init__(self) -> None:
        if len(self.corpus_ids) != len(self.corpus_texts):
            raise ValueError(f"{len(self.corpus_ids)} corpus ids but {len(self.corpus_texts)} texts")

    @property
    def unanswerable(self) -> int:
        """Queries without a relevant (score > 0) judgment: they score 0 on every metric (as in MTEB)."""
        return sum(1 for judged in self.qrels.values() if not any(s > 0 for s in judged.values()))


def find_file(folder: Path, name: str) -> Path:
    """FOLDER/name, or FOLDER/name.gz; a FileNotFoundError naming both when neither is there."""
    for path in (folder / name, folder / f"{name}.gz"):
        if path.is_file():
            return path
    raise FileNotFoundError(f"{folder / name} not found (nor {name}.gz): a BEIR folder holds corpus.jsonl, "
                            "queries.jsonl and qrels/SPLIT.tsv")


def beir_files(folder: str | Path) -> list[Path]:
    """The data files of a BEIR folder (corpus, queries, every split's qrels) that exist: the inputs
    a command's output must not replace; none for a path that is not a folder."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [folder / f"{name}{gz}" for name in ("corpus.jsonl", "queries.jsonl") for gz in ("", ".gz")]
    return [p for p in found if p.is_file()] + sorted((folder / "qrels").glob("*.tsv*"))


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line of a UTF-8 file, gzipped or not, read as a stream."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise decode_error(path, raw, e, lineno) from None
                if lineno == 1:
                    line = line.removeprefix("\ufeff")
                if line.strip():
                    yield lineno, line
    except (gzip.BadGzipFile, EOFError) as e:
        raise ValueError(f"{path}: not a readable gzip file ({e})") from None


def read_jsonl_records(path: Path) -> Iterator[tuple[str, dict]]:
    """("file:line", record) of a JSON Lines file whose lines are objects."""
    for lineno, line in read_lines(path):
        at = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{at}: invalid JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{at}: expected a JSON object with \"_id\" and \"text\", got {type(record).__name__}")
        yield at, record


def _record_id(record: dict, at: str) -> str:
    value = record.get("_id")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{at}: needs an \"_id\" (a string), got {'none' if value is None else repr(value)}")
    return str(value)


def _field(record: dict, key: str, at: str, required: bool = True) -> str:
    value = record.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        got = "no such key" if key not in record else type(value).__name__
        raise ValueError(f"{at}: \"{key}\" must be a text, got {got}")
    return value


def document_text(title: str, text: str) -> str:
    """A document as BEIR and MTEB embed it: title and text joined by a space and stripped."""
    return (title + " " + text).strip() if title else text.strip()


def read_corpus(path: str | Path) -> tuple[list[str], list[str]]:
    """(ids, texts as embedded) of a BEIR corpus.jsonl(.gz), in file order."""
    path = Path(path)
    ids, texts, seen = [], [], {}
    for at, record in read_jsonl_records(path):
        doc_id = _record_id(record, at)
        if doc_id in seen:
            raise ValueError(f"{at}: \"_id\" {doc_id!r} is already used on line {seen[doc_id]}")
        seen[doc_id] = at.rsplit(":", 1)[1]
        ids.append(doc_id)
        texts.append(document_text(_field(record, "title", at, required=False), _field(record, "text", at)))
    if not ids:
        raise ValueError(f"{path}: no documents (the file is empty)")
    return ids, texts


def read_queries(path: str | Path, wanted: set[str] | None = None) -> dict[str, str]:
    """Query id -> text of a BEIR queries.jsonl(.gz) (only the `wanted` ids, when given)."""
    path, queries, seen = Path(path), {}, {}
    for at, record in read_jsonl_records(path):
        query_id = _record_id(record, at)
        if query_id in seen:
            raise ValueError(f"{at}: \"_id\" {query_id!r} is already used on line {seen[query_id]}")
        seen[query_id] = at.rsplit(":", 1)[1]
        if wanted is None or query_id in wanted:
            queries[query_id] = _field(record, "text", at)
    return queries


def read_qrels(path: str | Path) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """(query id -> {document id: grade}, query id -> "file:line" of its first judgment) of a BEIR
    qrels TSV (query-id, corpus-id, score; a header line) or TREC qrels (query-id, 0, corpus-id, score)."""
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    first: dict[str, str] = {}
    header_allowed = True  # on the first line only
    for lineno, line in read_lines(path):
        at = f"{path}:{lineno}"
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) != 3:
            fields = line.split()
            fields = [fields[0], fields[2], fields[3]] if len(fields) == 4 else fields
        if len(fields) != 3:
            raise ValueError(f"{at}: expected query-id, corpus-id and score separated by tabs (or TREC's "
                             f"query-id 0 corpus-id score), got {len(fields)} field(s)")
        query_id, doc_id, score = (f.strip() for f in fields)
        try:
            grade = int(score)
        except ValueError:
            if header_allowed:  # `query-id corpus-id score`
                header_allowed = False
                continue
            raise ValueError(f"{at}: score {score!r} is not an integer grade") from None
        header_allowed = False
        if not query_id or not doc_id:
            raise ValueError(f"{at}: empty query-id or corpus-id")
        judged = qrels.setdefault(query_id, {})
        if doc_id in judged and judged[doc_id] != grade:
            raise ValueError(f"{at}: {query_id} {doc_id} is judged {grade} here but {judged[doc_id]} before")
        judged[doc_id] = grade
        first.setdefault(query_id, at)
    if not qrels:
        raise ValueError(f"{path}: no judgments (the file is empty or holds only a header)")
    return qrels, first


def read_beir(folder: str | Path, split: str = "test", warn: bool = True) -> BeirData:
    """The `split` of a BEIR folder: its judged queries, their judgments and the whole corpus."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"BEIR folder not found: {folder}" if not folder.exists() else
                                f"{folder} is a file: retrieval data is a BEIR folder (corpus.jsonl, queries.jsonl, "
                                "qrels/SPLIT.tsv)")
    qrels_folder = folder / "qrels"
    try:
        qrels_path = find_file(qrels_folder, f"{split}.tsv")
    except FileNotFoundError:
        have = sorted(p.name.split(".")[0] for p in qrels_folder.glob("*.tsv*")) if qrels_folder.is_dir() else []
        raise FileNotFoundError(f"{qrels_folder / split}.tsv not found: the split {split!r} is not in {folder}"
                                + (f" (it has {', '.join(have)})" if have else "")) from None
    qrels, first = read_qrels(qrels_path)
    queries_path = find_file(folder, "queries.jsonl")
    queries = read_queries(queries_path, set(qrels))
    missing = [q for q in qrels if q not in queries]
    if missing:
        raise ValueError(f"{first[missing[0]]}: query {missing[0]!r} is not in {queries_path}"
                         + (f" ({len(missing)} judged queries are not)" if len(missing) > 1 else ""))
    ids, texts = read_corpus(find_file(folder, "corpus.jsonl"))
    known = set(ids)
    absent = len({doc for judged in qrels.values() for doc in judged if doc not in known})
    if absent and warn:
        print(f"warning: {qrels_path}: {absent} judged document(s) are not in the corpus; they count as relevant "
              "and never retrieved, as in pytrec_eval", file=sys.stderr)
    return BeirData(ids, texts, {q: queries[q] for q in qrels}, qrels, folder.name, split, absent)


def subsample(data: BeirData, max_queries: int | None = None, max_docs: int | None = None,
              seed: int = 0) -> BeirData:
    """A smaller split for a quick score (during training): `max_queries` queries drawn at random,
    the documents judged for them, and other documents drawn at random up to `max_docs` in all.
    Scores on it are higher than on the whole corpus (fewer distractors): for comparing the
    checkpoints of a run, not for quoting beside published figures."""
    rng = random.Random(seed)
    query_ids = list(data.qrels)
    if max_queries is not None and max_queries < len(query_ids):
        drawn = set(rng.sample(query_ids, max_queries))
        query_ids = [q for q in query_ids if q in drawn]
    qrels = {q: data.qrels[q] for q in query_ids}
    judged = {doc for q in query_ids for doc in qrels[q]}
    keep = [i for i, doc in enumerate(data.corpus_ids) if doc in judged]
    others = [i for i, doc in enumerate(data.corpus_ids) if doc not in judged]
    room = len(others) if max_docs is None else max(0, max_docs - len(keep))
    keep = sorted(keep + rng.sample(others, min(room, len(others))))
    return BeirData([data.corpus_ids[i] for i in keep], [data.corpus_texts[i] for i in keep],
                    {q: data.queries[q] for q in query_ids}, qrels, data.name, data.split, data.missing_docs)
