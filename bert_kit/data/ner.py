"""Token classification (NER) data: CoNLL reader, word-to-sub-token label alignment, dataset.

WordPiece splits a word into several sub-tokens, while tags are per word. As in the BERT paper
the first sub-token of each word carries the word's label and the other sub-tokens, [CLS],
[SEP] and padding get -100, so the loss ignores them; :func:`predictions_to_words` reads the
first sub-token's prediction back as the word's tag.

A sentence longer than ``max_length`` tokens is cut into overlapping windows, as QA cuts a long
context (``data/squad.py``): consecutive windows share half their tokens, and each word takes its
tag from the window where it has the most context on both sides (the windows' labels mark each
word in that window only). So every word of a sentence of any length gets a tag, and a sentence
that fits is one window, exactly as before windows existed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from bert_kit.data import read_text, setting, split_lines
from bert_kit.data.classification import pad_collate

IGNORE_INDEX = -100

Sentence = tuple[list[str], list[str]]  # (words, tags), same length


def read_conll(path: str | Path, tag_column: int = -1, word_column: int = 0,
               label_names: Sequence[str] | None = None, encoding: str | None = None, text: str | None = None,
               names_from: str | None = None, what: str = "CoNLL file") -> list[Sentence]:
    """Read a CoNLL-style file: one token per line, columns split by any run of whitespace.

    ``word_column`` (default the first) holds the word and ``tag_column`` (default the last) the
    tag; indices are 0-based, negative ones count from the end. Blank lines end sentences and
    ``-DOCSTART-`` lines are document separators: they end the current sentence and are skipped.
    Every token line must have the column count of the first one (a short line would otherwise
    shift the tag column onto another field). With ``label_names`` every tag must be one of them
    (``names_from`` says where those came from, for the error: "the training file's tags").
    ``encoding``: the file's codec (default UTF-8); ``text``: the file's text when it was read
    already; ``what``: how errors name the file. Returns a list of (words, tags); errors name the
    file and line.
    """
    path = Path(path)
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    width = first = None  # column count of the first token line, and that line's number
    allowed = None if label_names is None else set(label_names)

    def flush() -> None:
        if words:
            sentences.append((list(words), list(tags)))
            words.clear()
            tags.clear()

    if text is None:
        text = read_text(path, what, encoding)
    for i, line in enumerate(split_lines(text), start=1):
        fields = line.split()
        if not fields:
            flush()
            continue
        if fields[0] == "-DOCSTART-":
            # a document marker is not a sentence; some files omit the blank line after it
            flush()
            continue
        if len(fields) < 2:
            raise ValueError(f"{path}:{i}: expected a word and a tag, got {line.strip()!r}")
        if width is None:
            width, first = len(fields), i
            for name, column in (("word_column", word_column), ("tag_column", tag_column)):
                if not -width <= column < width:
                    raise ValueError(f"{path}:{i}: no {name} {column} in {line.strip()!r} ({width} columns)")
            if word_column % width == tag_column % width:
                raise ValueError(f"{path}:{i}: tag column {tag_column} is the word column")
        elif len(fields) != width:
            raise ValueError(f"{path}:{i}: {len(fields)} columns but line {first} has {width}: "
                             f"{line.strip()!r} (a word with a space in it?)")
        tag = fields[tag_column]
        if allowed is not None and tag not in allowed:
            if names_from is None:
                raise ValueError(f"{path}:{i}: tag {tag!r} is not one of label_names {list(label_names)}")
            raise ValueError(f"{path}:{i}: tag {tag!r} is not one of {names_from} {list(label_names)}: the model "
                             f"has no output for it; list every tag in {setting('label_names')} to train one")
        words.append(fields[word_column])
        tags.append(tag)
    flush()
    if not sentences:
        raise ValueError(f"{path}: no sentences (expected one 'word ... tag' per line, blank lines between sentences)")
    return sentences


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """Convert IOB1 tags (B- only between adjacent same-type entities) to IOB2 (B- always).

    An I-X that does not continue an entity of type X (after O, after another type, or at the
    start) becomes B-X; every other tag is unchanged.
    """
    out: list[str] = []
    prev = "O"
    for tag in tags:
        if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
            out.append("B-" + tag[2:])
        else:
            out.append(tag)
        prev = tag
    return out


def align_labels(word_ids: Sequence[int | None], word_labels: Sequence[int]) -> list[int]:
    """Token labels (T,) from word labels: first sub-token of a word gets its label id.

    word_ids: the tokenizer's word index per token (None for [CLS]/[SEP]/padding).
    Later sub-tokens of the same word and special tokens get -100.
    """
    labels, prev = [], None
    for w in word_ids:
        # consecutive tokens with the same word id are the pieces of one word
        if w is None or w == prev:
            labels.append(IGNORE_INDEX)
        else:
            if w >= len(word_labels):
                raise IndexError(f"word id {w} but only {len(word_labels)} word labels")
            labels.append(int(word_labels[w]))
        prev = w
    return labels


def predictions_to_words(token_predictions, word_ids: Sequence[int | None],
                         num_words: int | None = None, label_list: Sequence[str] | None = None,
                         fill: Any = "O") -> list:
    """One prediction per word from token predictions (T,): the first sub-token's.

    token_predictions may be label ids or tags (a list, array or tensor, possibly padded beyond
    len(word_ids)); with ``label_list`` ids are mapped to tags. Words that have no token
    (cut by truncation) get ``fill``. num_words defaults to the highest word id + 1; pass
    len(words) so truncated trailing words are included.
    """
    if hasattr(token_predictions, "tolist"):
        token_predictions = token_predictions.tolist()
    seen = [w for w in word_ids if w is not None]
    if num_words is None:
        num_words = max(seen) + 1 if seen else 0
    out: list = [fill] * num_words
    done = [False] * num_words
    for t, w in enumerate(word_ids):
        if w is None or w >= num_words or done[w]:
            continue  # special / padding token, or a later sub-token of a word already read
        pred = token_predictions[t]
        out[w] = label_list[pred] if label_list is not None else pred
        done[w] = True
    return out


class NERDataset(Dataset):
    """Tokenized sentences with aligned token labels, in windows of at most ``max_length`` tokens.

    sentences: list of (words, tags); tags may be None for unlabelled text (all labels -100).
    Items are windows, dicts of Python lists: input_ids, token_type_ids, attention_mask, labels
    (each of length T_k <= max_length). A sentence that fits is one window (item); a longer one
    is several, consecutive windows sharing half their tokens. ``word_ids[k]`` maps window k's
    tokens to the words of its sentence ``window_sentence[k]``; a window labels only the words it
    gives the most context (the first sub-token of each word that :func:`best_windows` gives it),
    and :meth:`sentence_tags` reads each word's tag from that window.
    """

    def __init__(self, sentences: Sequence[tuple[Sequence[str], Sequence[str] | None]],
                 tokenizer, label_list: Sequence[str], max_length: int = 128):
        if max_length < 3:
            raise ValueError(f"max_length must be >= 3 ([CLS], a token, [SEP]), got {max_length}")
        self.label_list = list(label_list)
        self.label_to_id = {tag: i for i, tag in enumerate(self.label_list)}
        self.pad_token_id = getattr(tokenizer, "pad_token_id", 0)
        self.sentences = [(list(words), None if tags is None else list(tags))
                          for words, tags in sentences]
        word_labels = []
        for n, (words, tags) in enumerate(self.sentences):
            if tags is None:
                word_labels.append(None)
                continue
            if len(tags) != len(words):
                raise ValueError(f"sentence {n}: {len(words)} words but {len(tags)} tags")
            unknown = [t for t in tags if t not in self.label_to_id]
            if unknown:
                raise ValueError(f"sentence {n}: tag {unknown[0]!r} not in label_list "
                                 f"{self.label_list}")
            word_labels.append([self.label_to_id[t] for t in tags])
        # one batched call, whole sentences: the Rust tokenizer is far faster on a batch than row by row
        if self.sentences:
            enc = tokenizer([words for words, _ in self.sentences], is_split_into_words=True,
                            padding=False, truncation=False, return_word_ids=True, return_tensors=None)
        else:
            enc = {"input_ids": [], "word_ids": []}
        self.encodings: dict[str, list] = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
        self.word_ids: list[list[int | None]] = []
        self.labels: list[list[int]] = []
        self.window_sentence: list[int] = []  # sentence index of each window (item)
        self.windows_of: list[list[int]] = []  # window (item) indices of each sentence
        self.best_window: list[list[int | None]] = []  # per sentence and word: the window its tag comes from
        budget = max_length - 2  # tokens of a window between [CLS] and [SEP]
        for s, (ids, wids) in enumerate(zip(enc["input_ids"], enc["word_ids"])):
            cls_id, sep_id = ids[0], ids[-1]
            ids, wids = ids[1:-1], list(wids[1:-1])
            spans = window_spans(wids, budget)
            best = best_windows(wids, spans, len(self.sentences[s][0]))
            self.best_window.append([None if k is None else len(self.window_sentence) + k for k in best])
            self.windows_of.append([])
            for k, (start, stop) in enumerate(spans):
                window_wids = [None] + wids[start:stop] + [None]
                self.windows_of[s].append(len(self.window_sentence))
                self.window_sentence.append(s)
                self.word_ids.append(window_wids)
                self.encodings["input_ids"].append([cls_id] + ids[start:stop] + [sep_id])
                self.encodings["token_type_ids"].append([0] * len(window_wids))
                self.encodings["attention_mask"].append([1] * len(window_wids))
                mine = {w for w, b in enumerate(best) if b == k}  # the words this window labels
                self.labels.append(align_labels([w if w in mine else None for w in window_wids], word_labels[s])
                                   if word_labels[s] is not None else [IGNORE_INDEX] * len(window_wids))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, idx: int) -> dict[str, list[int]]:
        item = {k: v[idx] for k, v in self.encodings.items()}
        item["labels"] = self.labels[idx]
        return item

    def collate(self, batch: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        """Pad to the batch's longest: ids with the pad id, masks with 0, labels with -100."""
        return pad_collate(batch, pad_token_id=self.pad_token_id)

    def sentence_tags(self, window_predictions: Sequence[Any], fill: str = "O") -> list[list[str]]:
        """Tags of every word of every sentence from the predictions (T_k,) of label ids of every
        window (item) k: each word's from its best window (see :func:`best_windows`). A word with no
        token at all (only characters the tokenizer drops) gets ``fill``."""
        if len(window_predictions) != len(self):
            raise ValueError(f"{len(window_predictions)} window predictions for {len(self)} windows")
        rows = [p.tolist() if hasattr(p, "tolist") else list(p) for p in window_predictions]
        out = []
        for s, (words, _) in enumerate(self.sentences):
            tags = []
            for w, k in enumerate(self.best_window[s]):
                if k is None:
                    tags.append(fill)
                    continue
                t = self.word_ids[k].index(w)  # the word's first sub-token in that window
                tags.append(self.label_list[rows[k][t]])
            out.append(tags)
        return out

    def predictions_to_tags(self, idx: int, token_predictions) -> list[str]:
        """Tags for every word of the sentence of window idx from that window's predictions (T,)
        alone; words outside it get "O". For a sentence of one window, its tags (see sentence_tags)."""
        return predictions_to_words(token_predictions, self.word_ids[idx],
                                    num_words=len(self.sentences[self.window_sentence[idx]][0]),
                                    label_list=self.label_list)


def window_spans(word_ids: Sequence[int | None], budget: int) -> list[tuple[int, int]]:
    """[start, stop) token spans of the windows over a sentence's tokens (T,) (no specials), each
    at most `budget` long, consecutive ones sharing about half their tokens; one span if it fits.
    A window starts at a word's first sub-token where it can, so it does not open mid-word."""
    n = len(word_ids)
    if n <= budget:
        return [(0, n)]
    step = max(1, budget - budget // 2)
    spans, start = [], 0
    while True:
        stop = min(start + budget, n)
        spans.append((start, stop))
        if stop >= n:
            return spans
        nxt = start + step
        back = nxt
        while back > start + 1 and word_ids[back] == word_ids[back - 1]:
            back -= 1  # to the start of the word that `nxt` falls in
        start = back if back > start + 1 else nxt


def best_windows(word_ids: Sequence[int | None], spans: Sequence[tuple[int, int]], num_words: int) -> list[int | None]:
    """For each word, the window (index into spans) whose tokens hold its first sub-token with the
    most context: the largest min(tokens before it, tokens after it) in the window (the earlier
    window on a tie, as HF's max-context rule for QA). None for a word without tokens."""
    first: dict[int, int] = {}
    for t, w in enumerate(word_ids):
        if w is not None and w not in first:
            first[w] = t
    best: list[int | None] = [None] * num_words
    for w, t in first.items():
        if w >= num_words:
            continue
        scores = [(min(t - a, b - 1 - t), -k) for k, (a, b) in enumerate(spans) if a <= t < b]
        best[w] = -max(scores)[1]
    return best


def collate_ner(batch: list[dict[str, list[int]]], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad NER items into (B, T) int64 tensors; labels are padded with -100."""
    return pad_collate(batch, pad_token_id=pad_token_id)


def create_ner_dataloader(sentences, tokenizer, label_list: Sequence[str], batch_size: int = 32,
                          max_length: int = 128, shuffle: bool = True) -> DataLoader:
    """DataLoader of padded NER batches (see :class:`NERDataset`)."""
    dataset = NERDataset(sentences, tokenizer, label_list, max_length=max_length)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, collate_fn=dataset.collate)


def get_label_list(sentences: Sequence[Sentence]) -> list[str]:
    """Sorted tag set of a corpus with "O" first (so id 0 is the outside tag)."""
    tags = {t for _, ts in sentences for t in ts}
    return ["O"] * ("O" in tags) + sorted(tags - {"O"})
