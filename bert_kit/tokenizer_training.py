"""Training a BERT WordPiece vocabulary: `train_tokenizer`, on text files or strings.

It runs the `tokenizers` WordPiece trainer with BERT's pipeline (`bert_kit.tokenizer`) and
returns a `WordPieceTokenizer` whose ids are canonical: the special tokens first, then
characters, "##" characters and longer pieces, each sorted. The trainer alone is not
deterministic: it numbers the "##x" pieces in hash-map order, which differs from process to
process, and breaks ties between equally frequent merges by those numbers. So training takes two
passes (`_learn_vocab`): the first finds the alphabet, the second gets it as initial tokens in
sorted order, and the same corpus and settings give the same vocabulary in every process.
Lines too long for the trainer to hold are broken at a space (`_broken`), and words WordPiece
never splits are left out, so memory and time stay bounded.

    tokenizer = train_tokenizer(["corpus.txt"], vocab_size=8000)
    tokenizer.save("my-tokenizer")
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers, trainers
from tokenizers.models import WordPiece

from bert_kit.checks import Range
from bert_kit.tokenizer import MAX_WORD, WordPieceTokenizer, _bert_pipeline, _template
from bert_kit.tokenizer_files import DEFAULT_MODEL_MAX_LENGTH, DEFAULT_SPECIAL_TOKENS

MAX_VOCAB_SIZE = 1 << 24  # ids past this are no vocabulary: the trainer would only run out of memory
MAX_TRAIN_LINE = 1 << 20  # characters of one line the trainer reads (`_broken`)


def train_tokenizer(
    files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    vocab_size: int = 30522,
    lowercase: bool = True,
    min_frequency: int = 2,
    special_tokens: Sequence[str] = tuple(DEFAULT_SPECIAL_TOKENS.values()),
    *,
    texts: Iterable[str] | Iterator[str] | None = None,
    limit_alphabet: int | None = 1000,
    show_progress: bool = False,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
) -> WordPieceTokenizer:
    """Train a BERT WordPiece vocabulary on UTF-8 text files (one or more) or on `texts=` strings.

    The special tokens take the first ids in the order given (default [PAD]=0, [UNK]=1,
    [CLS]=2, [SEP]=3, [MASK]=4); they must include all five BERT tokens. Special tokens inside
    `texts` (such as the [UNK] that WikiText's <unk> becomes) are not learned from: encoding
    matches them whole. `limit_alphabet` keeps the most frequent characters (ties by code point).

    The same corpus and settings give the same vocabulary, with the same ids, in every process:
    see `_learn_vocab`.
    """
    if (files is None) == (texts is None):
        raise ValueError("pass exactly one of files=... or texts=...")
    if files is not None and not isinstance(files, (str, os.PathLike)):
        files = list(files)
        if not files:
            raise ValueError("files is empty: name at least one text file to learn the vocabulary from")
    missing = [t for t in DEFAULT_SPECIAL_TOKENS.values() if t not in special_tokens]
    if missing:
        raise ValueError(f"special_tokens {list(special_tokens)} lacks {missing}")
    # checked here: the Rust trainer aborts the process on sizes it cannot allocate
    Range(len(special_tokens) + 1, MAX_VOCAB_SIZE, integer=True,
          hint=f"room beyond the {len(special_tokens)} special tokens").check("vocab_size", vocab_size)
    Range(0, 1 << 32, integer=True).check("min_frequency", min_frequency)
    Range(1, MAX_VOCAB_SIZE, integer=True, optional=True).check("limit_alphabet", limit_alphabet)
    Range(1, 1 << 31, integer=True).check("model_max_length", model_max_length)
    with tempfile.TemporaryDirectory(prefix="bert_kit_tokenizer_") as tmp:
        if files is not None:
            paths = [files] if isinstance(files, (str, os.PathLike)) else list(files)
            for p in paths:
                if not Path(p).is_file():
                    raise FileNotFoundError(f"training file not found: {p}")
            # a file with a line too long for the trainer to hold is read through a copy with it broken
            paths = [_write_texts(_file_chunks(p), Path(tmp) / f"{i}.txt", (), newlines=False)
                     if _has_long_line(p) else p for i, p in enumerate(paths)]
        else:  # the Rust trainer reads files fast and in parallel, and every pass needs the texts again
            paths = [_write_texts(texts, Path(tmp) / "texts.txt", special_tokens)]
        vocab = _learn_vocab([str(p) for p in paths], vocab_size, lowercase, min_frequency, list(special_tokens),
                             limit_alphabet, show_progress)
    # canonical ids: specials, then characters, then "##" characters, then longer pieces, each sorted
    trained = [t for t in vocab if t not in special_tokens]
    if not trained:
        where = "the texts" if files is None else ", ".join(map(str, paths))
        raise ValueError(f"no word to learn a vocabulary from in {where}: only blank lines, special tokens or "
                         f"words longer than {MAX_WORD} characters")
    order = sorted(trained, key=lambda t: (len(t.removeprefix("##")) > 1, t.startswith("##"), t))
    ids = {t: i for i, t in enumerate(list(special_tokens) + order)}
    backend = Tokenizer(WordPiece(ids, unk_token=DEFAULT_SPECIAL_TOKENS["unk"], max_input_chars_per_word=MAX_WORD))
    _bert_pipeline(backend, {}, lowercase=lowercase)
    # the specials are added tokens, so raw "[MASK]" is matched whole
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    backend.post_processor = _template(backend, DEFAULT_SPECIAL_TOKENS["cls"], DEFAULT_SPECIAL_TOKENS["sep"])
    return WordPieceTokenizer(backend, model_max_length, source="train_tokenizer()")


def _write_texts(texts: Iterable[str], path: Path, special_tokens: Sequence[str], newlines: bool = True) -> Path:
    """The texts into one UTF-8 file for the trainer, special tokens blanked out, lines longer than
    MAX_TRAIN_LINE broken (`_broken`); newlines=False: the texts are chunks of one text (a file)."""
    def blanked() -> Iterator[str]:
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
            for token in special_tokens:
                text = text.replace(token, " ")
            yield text + "\n" if newlines else text  # a document may span lines: words never do

    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(_broken(blanked()))
    return path


def _broken(chunks: Iterable[str]) -> Iterator[str]:
    """The text of `chunks` with every line longer than MAX_TRAIN_LINE characters broken at its
    last space before that length (at the length itself when there is none: a line of one word,
    which training leaves out anyway). The Rust trainer holds a whole line at about 120 bytes a
    character (an 8 MB line took 1 GB)."""
    pending = ""
    for chunk in chunks:
        text, at = pending + chunk, 0
        while len(text) - at > MAX_TRAIN_LINE:
            last = text.rfind("\n", at, at + MAX_TRAIN_LINE + 1)
            if last >= 0:  # whole lines, short enough
                yield text[at:last + 1]
                at = last + 1
                continue
            space = max(text.rfind(" ", at, at + MAX_TRAIN_LINE), text.rfind("\t", at, at + MAX_TRAIN_LINE))
            cut = space + 1 if space >= at else at + MAX_TRAIN_LINE
            yield text[at:cut] + "\n"
            at = cut
        pending = text[at:]
    if pending:
        yield pending


def _has_long_line(path: str | os.PathLike) -> bool:
    """Whether a file holds a line of more than MAX_TRAIN_LINE bytes (read a chunk at a time)."""
    half = MAX_TRAIN_LINE // 2  # a longer line holds a newline-free stretch of `half` bytes at a multiple of it
    with open(path, "rb") as f:
        while chunk := f.read(1 << 23):
            if any(chunk.find(b"\n", k, k + half) < 0 for k in range(0, len(chunk), half)):
                return True
    return False


def _file_chunks(path: str | os.PathLike) -> Iterator[str]:
    from bert_kit.data import BOM, _decoded  # a file's text a chunk at a time, bad bytes named by line

    for i, (text, _) in enumerate(_decoded(path, "training file", None)):
        yield text.removeprefix(BOM) if i == 0 else text


def _learn_vocab(paths: list[str], vocab_size: int, lowercase: bool, min_frequency: int, special_tokens: list[str],
                 limit_alphabet: int | None, show_progress: bool) -> dict[str, int]:
    """The WordPiece vocabulary of `paths` (token -> trainer id), the same in every process.

    The `tokenizers` trainer numbers the "##x" pieces in the order it meets them in a hash map,
    which differs from process to process, and breaks ties between equally frequent merges by
    those numbers; its limit_alphabet also drops equally rare characters in hash order. So a
    first pass (no merges) finds the alphabet and its "##x" pieces, and the second one gets them
    all as initial tokens in sorted order: every id the merges compare is then fixed.
    """
    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                            lowercase=lowercase)

    def learn(size: int, initial: list[str], limit: int | None, alphabet: list[str]) -> dict[str, int]:
        backend = _bert_pipeline(Tokenizer(WordPiece(unk_token=DEFAULT_SPECIAL_TOKENS["unk"],
                                                     max_input_chars_per_word=MAX_WORD)), {}, lowercase=lowercase)
        # a word past MAX_WORD characters encodes as one [UNK]: the trainer does not see it (its merges
        # cost the square of a word's length: a line of 800,000 letters took 5 minutes), as HF's
        # trainers bound the length of what they merge
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            backend.pre_tokenizer, pre_tokenizers.Split(Regex(f".{{{MAX_WORD + 1},}}"), behavior="removed")])
        trainer = trainers.WordPieceTrainer(vocab_size=size, min_frequency=min_frequency, special_tokens=initial,
                                            initial_alphabet=alphabet, continuing_subword_prefix="##",
                                            show_progress=show_progress,
                                            **({} if limit is None else {"limit_alphabet": limit}))
        try:
            backend.train(paths, trainer)
        except Exception as e:  # the Rust reader raises a bare Exception, e.g. on bytes that are not UTF-8
            raise ValueError(f"cannot train a tokenizer on {paths}: {e} (the files must be UTF-8 text)") from None
        return backend.get_vocab(with_added_tokens=False)

    pieces = [t for t in learn(1, special_tokens, None, []) if t not in special_tokens]
    alphabet = sorted(t for t in pieces if not (len(t) > 1 and t.startswith("##")))
    if limit_alphabet is not None and len(alphabet) > limit_alphabet:
        counts: Counter[str] = Counter()
        for path in paths:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    counts.update(normalizer.normalize_str(line))
        alphabet = sorted(sorted(alphabet, key=lambda c: (-counts[c], c))[:limit_alphabet])
    kept = set(alphabet)
    continuing = sorted(t for t in pieces if len(t) > 1 and t.startswith("##") and t[2:] in kept)
    return learn(vocab_size, special_tokens + alphabet + continuing, len(alphabet), alphabet)
