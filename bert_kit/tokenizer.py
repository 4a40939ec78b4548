"""Tokenizers: a small, HF-compatible wrapper around a `tokenizers.Tokenizer`.

`FastTokenizer` runs any HF fast tokenizer from its `tokenizer.json`: WordPiece (BERT,
DistilBERT), byte-level BPE (RoBERTa, ModernBERT) or Unigram/SentencePiece (XLM-RoBERTa), with
the ids `transformers.AutoTokenizer` gives, special tokens and pairs included ([CLS] a [SEP] b
[SEP]; RoBERTa's <s> a </s></s> b </s>), as the file's post-processor writes them. Families
that take no segment ids (`model_input_names` without token_type_ids: RoBERTa, XLM-R,
DistilBERT, ModernBERT) get token_type_ids of zeros. A folder's `vocab.txt` and
`tokenizer_config.json` (the special tokens' roles, model_max_length, segment ids) are read and
written by `bert_kit.tokenizer_files`. `WordPieceTokenizer` adds BERT's own pipeline around a
`vocab.txt` (`bert_kit.tokenizer_training.train_tokenizer` learns one). Its pipeline is the one
BERT uses, and the one `transformers.BertTokenizerFast` builds:

    BertNormalizer (clean control chars, space around CJK, lowercase, strip accents)
    -> BertPreTokenizer (split on whitespace and punctuation)
    -> WordPiece (greedy longest-match-first, "##" continuation, [UNK] for a word it cannot cover)
    -> TemplateProcessing ([CLS] A [SEP] with type ids 0, then B [SEP] with type ids 1)

`WordPieceTokenizer.__call__` encodes batches the way `BertTokenizerFast.__call__` does (same
ids, type ids, masks, offsets, word ids, overflow windows), so SQuAD feature building and NER
label alignment written against HF work unchanged. Truncation is set on the Rust backend only
for the duration of one call, under a lock (so `tokenizer.backend` is stateless between calls
and threads may share a tokenizer; DataLoader workers each get a copy). With truncation, a
long text is squeezed (runs of spaces, of dropped characters, words past WordPiece's 100
characters) and cut to a prefix before it reaches the Rust tokenizer (`bert_kit.long_texts`):
the tokens kept are the same, and the time and memory are bounded by max_length, not by the
text, with or without spaces. A text that is not valid Unicode (a lone surrogate such as
"\ud800") is a ValueError naming its index.

    tok = get_tokenizer("/path/to/model-folder")         # tokenizer.json or vocab.txt
    batch = tok(["a sentence", "another"], max_length=128)  # dict of (B, T) torch.long tensors
"""

from __future__ import annotations

import operator
import os
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Encoding, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from bert_kit.checks import writing
from bert_kit.long_texts import Cutter, original_offsets
from bert_kit.tokenizer_files import (DEFAULT_MODEL_MAX_LENGTH, DEFAULT_SPECIAL_TOKENS, max_length_from_config,
                                      read_tokenizer_config, read_vocab, special_tokens_from_config,
                                      uses_token_types, write_tokenizer_config, write_vocab)

_TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")
_SURROGATE = re.compile("[\ud800-\udfff]")  # only a pair of them is a character, and Python holds it as one
MAX_WORD = 100  # WordPiece's max_input_chars_per_word, as BERT's: a longer word is one [UNK]


def _bert_pipeline(
    backend: Tokenizer,
    special_tokens: dict[str, str],
    lowercase: bool = True,
    strip_accents: bool | None = None,
    handle_chinese_chars: bool = True,
) -> Tokenizer:
    """Attach BERT's normalizer, pre-tokenizer and decoder to a backend holding a WordPiece model."""
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=handle_chinese_chars, strip_accents=strip_accents, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    # normalized=False: "[MASK]" in raw text is matched before lowercasing, as in HF
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens.values()])
    return backend


def _template(backend: Tokenizer, cls: str, sep: str) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, backend.token_to_id(cls)), (sep, backend.token_to_id(sep))],
    )


class FastTokenizer:
    """Any HF fast tokenizer around `self.backend` (a `tokenizers.Tokenizer`): WordPiece, BPE or
    Unigram, with the special tokens and the pair layout its post-processor writes.

    Attributes: vocab_size, pad/unk/cls/sep/mask_token_id, special_token_ids, model_max_length
    (default cap when max_length is None), token_types (whether its family takes segment ids;
    without them token_type_ids are all 0), hf_config (tokenizer_config.json as read, written
    back by `save`).
    """

    def __init__(
        self,
        backend: Tokenizer,
        model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
        special_tokens: dict[str, str] | None = None,
        source: str = "<in-memory tokenizer>",
        token_types: bool = True,
        hf_config: dict[str, Any] | None = None,
    ) -> None:
        self.backend = backend
        self.model_max_length = int(model_max_length)
        self.special_tokens = dict(special_tokens or DEFAULT_SPECIAL_TOKENS)
        self.source = source
        self.token_types = token_types
        self.hf_config = dict(hf_config or {})
        self._lock = threading.Lock()  # truncation is backend state, set for one call at a time
        self._cutter = Cutter(backend)
        backend.no_truncation()
        backend.no_padding()
        vocab = backend.get_vocab(with_added_tokens=True)
        for role, token in self.special_tokens.items():
            if token not in vocab:
                raise ValueError(
                    f"vocabulary of {source} has no {token!r} token ({role}); "
                    f"bert-kit needs the five roles {', '.join(self.special_tokens.values())}"
                )
            setattr(self, f"{role}_token_id", vocab[token])
        self.pad_token = self.special_tokens["pad"]
        self.unk_token = self.special_tokens["unk"]
        self.special_token_ids = frozenset(vocab[t] for t in self.special_tokens.values())
        if backend.post_processor is None:  # a bare tokenizer.json: add BERT's [CLS]/[SEP] template
            backend.post_processor = _template(backend, self.special_tokens["cls"], self.special_tokens["sep"])
        # special tokens each row gets: 2 and 3 for BERT ([CLS] a [SEP] b [SEP]), 2 and 4 for RoBERTa
        self.num_special = {False: backend.post_processor.num_special_tokens_to_add(False),
                            True: backend.post_processor.num_special_tokens_to_add(True)}

    # ----------------------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> FastTokenizer:
        """Load from a folder holding tokenizer.json (preferred) or vocab.txt (+ tokenizer_config.json):
        a `WordPieceTokenizer` for a WordPiece model, a `FastTokenizer` for BPE or Unigram."""
        folder = Path(folder).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"tokenizer folder not found: {folder}")
        config = read_tokenizer_config(folder)
        max_len = max_length_from_config(config)
        tokenizer_json, vocab_txt = folder / "tokenizer.json", folder / "vocab.txt"
        if tokenizer_json.is_file():
            try:
                backend = Tokenizer.from_file(str(tokenizer_json))
            except Exception as err:  # the Rust loader raises a bare Exception
                raise ValueError(f"cannot read {tokenizer_json}: {err}") from err
            kind = type(backend.model).__name__
            if kind not in ("WordPiece", "BPE", "Unigram"):
                raise ValueError(f"{tokenizer_json} holds a {kind} model; bert-kit reads WordPiece, BPE and Unigram")
            if cls is WordPieceTokenizer and kind != "WordPiece":
                raise ValueError(f"{tokenizer_json} holds a {kind} model, expected WordPiece")
            specials = special_tokens_from_config(config, backend.get_vocab(with_added_tokens=True))
            made = WordPieceTokenizer if kind == "WordPiece" else FastTokenizer
            return made(backend, max_len, specials, source=str(tokenizer_json), token_types=uses_token_types(config),
                        hf_config=config)
        if vocab_txt.is_file():
            return WordPieceTokenizer.from_vocab_file(
                vocab_txt,
                lowercase=bool(config.get("do_lower_case", True)),
                strip_accents=config.get("strip_accents"),
                tokenize_chinese_chars=bool(config.get("tokenize_chinese_chars", True)),
                model_max_length=max_len,
                special_tokens=special_tokens_from_config(config),
            )
        raise FileNotFoundError(f"no tokenizer.json or vocab.txt in tokenizer folder {folder}")

    def save(self, folder: str | os.PathLike) -> None:
        """Write tokenizer.json and tokenizer_config.json (the one it was read with, when there was
        one): `transformers.AutoTokenizer` loads the folder with the same ids."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with writing(folder / "tokenizer.json"):  # the Rust writer reports a full disk without the file
            self.backend.save(str(folder / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **self.hf_config,
                  "model_max_length": self.model_max_length,
                  **{f"{role}_token": token for role, token in self.special_tokens.items()}}
        write_tokenizer_config(folder, config, self.token_types)

    # pickling goes through the JSON form so DataLoader workers get an independent backend
    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("backend", "_lock", "_cutter")}
        state["backend_json"] = self.backend.to_str()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.backend = Tokenizer.from_str(state.pop("backend_json"))
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._cutter = Cutter(self.backend)

    # ----------------------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, source={self.source!r})"

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def tokenize(self, text: str) -> list[str]:
        """Tokens of `text`, without [CLS]/[SEP]."""
        _check_str(text, "text")
        with self._lock:
            return self.backend.encode(text, add_special_tokens=False).tokens

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        """Token(s) -> id(s); a token outside the vocabulary maps to [UNK]."""
        if isinstance(tokens, str):
            tid = self.backend.token_to_id(tokens)
            return self.unk_token_id if tid is None else tid
        if not isinstance(tokens, (list, tuple)):
            raise TypeError(f"tokens must be a str or a list of str, got {type(tokens).__name__}")
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        if isinstance(ids, int) or (hasattr(ids, "item") and getattr(ids, "ndim", 1) == 0):
            token = self.backend.id_to_token(int(ids))
            if token is None:
                raise ValueError(f"token id {int(ids)} is outside the vocabulary (size {self.vocab_size})")
            return token
        return [self.convert_ids_to_tokens(int(i)) for i in _as_list(ids)]

    # ----------------------------------------------------------------------------- encode / decode
    def encode(
        self, text: str, text_pair: str | None = None, max_length: int | None = None, truncation: bool = True
    ) -> list[int]:
        """Ids of one text (or pair) with its special tokens; truncated longest-first to max_length."""
        _check_str(text, "text")
        if text_pair is not None:
            _check_str(text_pair, "text_pair")
        text_pair = text_pair or None  # an empty second text is no pair, as in BertTokenizerFast
        n_special = self.num_special[text_pair is not None]
        settings = self._configured(max_length, truncation, "longest_first", 0, n_special)
        with self._lock:
            if settings.max_length is not None:
                [text], pairs, _ = self._cutter.cut([text], None if text_pair is None else [text_pair],
                                                    settings.max_length - n_special, "longest_first", False)
                text_pair = pairs and pairs[0]
            with settings:
                return self.backend.encode(text, text_pair).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of a 1-D id sequence: "##" pieces glued to the previous token, spaces before
        punctuation removed, as BERT's tokenizer does. Accepts lists, numpy arrays and tensors."""
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"ids must be a sequence of token ids, got a {type(ids).__name__}; encode text first")
        ids = _as_list(ids)
        if ids and isinstance(ids[0], list):
            raise ValueError("decode takes one sequence of ids; use batch_decode for a batch")
        try:
            ids = [operator.index(i) for i in ids]  # ints only: 1.5 is not an id
        except TypeError:
            raise TypeError(f"ids must be integers, got {ids[:5]!r}") from None
        size = self.vocab_size
        bad = [i for i in ids if not 0 <= i < size]
        if bad:  # the backend would drop these silently (or overflow on -100 labels)
            raise ValueError(
                f"ids {bad[:5]} are outside the vocabulary (size {size}); drop -100 label positions first"
            )
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in _as_list(batch)]

    def __call__(
        self,
        texts: str | Sequence[str] | Sequence[Sequence[str]],
        text_pairs: str | Sequence[str] | Sequence[Sequence[str]] | None = None,
        max_length: int | None = None,
        padding: bool | str = True,
        truncation: bool | str = True,
        return_tensors: str | None = "pt",
        return_offsets_mapping: bool = False,
        return_word_ids: bool = False,
        is_split_into_words: bool = False,
        stride: int = 0,
        return_overflowing_tokens: bool = False,
        return_token_type_ids: bool = True,
        return_attention_mask: bool = True,
    ) -> dict[str, Any]:
        """Encode a batch like `BertTokenizerFast.__call__`.

        texts: a str, a list of str, or (is_split_into_words) a list of words / list of word lists.
        padding: True or "longest" (to the longest row), "max_length", or False.
        truncation: True (longest-first; only the second sequence when returning overflowing
            tokens for pairs, like HF's "only_second"), False, or an HF strategy name.
        max_length: truncation / padding length; None means `model_max_length`.
        return_token_type_ids, return_attention_mask: False leaves that column out.
        Returns a dict with input_ids, token_type_ids, attention_mask: (B, T) torch.long ("pt"),
        numpy int64 ("np") or lists (None); offset_mapping (B, T, 2) when asked; word_ids (B lists
        of None/int); with return_overflowing_tokens, B counts every window, plus
        overflow_to_sample_mapping (list of B ints) and sequence_ids (B lists of None/0/1).
        """
        batch_a, single = _as_batch(texts, is_split_into_words, "texts")
        batch_b = None
        if single and text_pairs is not None and len(text_pairs) == 0:
            text_pairs = None  # BertTokenizerFast: one example with an empty second text is no pair
        if text_pairs is not None:
            batch_b, single_b = _as_batch(text_pairs, is_split_into_words, "text_pairs")
            if single_b != single:
                raise ValueError("texts and text_pairs must both be single examples or both be lists")
            if len(batch_b) != len(batch_a):
                raise ValueError(f"texts has {len(batch_a)} items but text_pairs has {len(batch_b)}")
        if padding not in (True, False, "longest", "max_length", "do_not_pad"):
            raise ValueError(f"padding must be True, False, 'longest' or 'max_length', got {padding!r}")
        if return_tensors not in ("pt", "np", None):
            raise ValueError(f"return_tensors must be 'pt', 'np' or None, got {return_tensors!r}")
        n_special = self.num_special[batch_b is not None]
        if isinstance(truncation, str):
            strategy = truncation
        elif return_overflowing_tokens and batch_b is not None:
            strategy = "only_second"  # keep the question whole, window over the context
        else:
            strategy = "longest_first"

        inputs = batch_a if batch_b is None else list(zip(batch_a, batch_b))
        settings = self._configured(max_length, bool(truncation), strategy, stride, n_special)
        limit = settings.max_length  # None without truncation
        if return_overflowing_tokens and limit is not None and stride >= limit - n_special:
            raise ValueError(f"stride {stride} must be smaller than max_length minus {n_special} special tokens")
        squeezed = None  # per row, where a squeezed text's characters were (`long_texts.original_offsets`)
        # without offsets or word ids the backend may skip tracking offsets (~15% of its time)
        encode = self._encode_batch_ids if not (return_offsets_mapping or return_word_ids) else \
            self.backend.encode_batch
        with self._lock:
            if limit is not None and not return_overflowing_tokens:  # the windows need the whole text
                batch_a, batch_b, squeezed = self._cutter.cut(batch_a, batch_b, limit - n_special, strategy,
                                                              is_split_into_words)
                inputs = batch_a if batch_b is None else list(zip(batch_a, batch_b))
            with settings:
                encodings = encode(inputs, is_pretokenized=is_split_into_words)

        rows: list[Encoding] = encodings
        sample_of_row: list[int] = []  # with overflow windows: the text of each row
        if return_overflowing_tokens:
            rows = []
            for i, enc in enumerate(encodings):
                windows = [enc] + enc.overflowing
                rows.extend(windows)
                sample_of_row.extend([i] * len(windows))
        # a guarantee, whatever the backend does (len(e) counts the ids without building their list)
        if limit is not None and rows and max(map(len, rows)) > limit:
            raise ValueError(f"the tokenizer returned more than max_length={limit} tokens (truncation {strategy!r})")

        if padding in (True, "longest", "max_length"):
            target = max(map(len, rows))
            if padding == "max_length":
                target = max_length or self.model_max_length
            for enc in rows:
                if len(enc) < target:  # pad() also pads word ids, offsets, sequence ids
                    enc.pad(target, pad_id=self.pad_token_id, pad_type_id=0, pad_token=self.pad_token)

        out: dict[str, Any] = {"input_ids": [e.ids for e in rows]}  # each `.ids` builds a new list: once a row
        if return_token_type_ids:  # as HF's flags: a caller that needs the ids alone saves two lists a row
            out["token_type_ids"] = [e.type_ids for e in rows] if self.token_types else \
                [[0] * len(ids) for ids in out["input_ids"]]
        if return_attention_mask:
            out["attention_mask"] = [e.attention_mask for e in rows]
        if return_offsets_mapping:
            out["offset_mapping"] = [e.offsets if squeezed is None or squeezed[i] == (None, None) else
                                     original_offsets(e.offsets, e.sequence_ids, e.word_ids, squeezed[i])
                                     for i, e in enumerate(rows)]
        if return_tensors is not None:
            lengths = {len(r) for r in out["input_ids"]}
            if len(lengths) > 1:
                raise ValueError(
                    f"rows have lengths {sorted(lengths)}; "
                    "use padding=True, or return_tensors=None for ragged output"
                )
            out = {k: _to_tensor(v, return_tensors) for k, v in out.items()}
        if return_word_ids:
            out["word_ids"] = [e.word_ids for e in rows]
        if return_overflowing_tokens:
            out["overflow_to_sample_mapping"] = sample_of_row
            out["sequence_ids"] = [e.sequence_ids for e in rows]
        return out

    # ----------------------------------------------------------------------------- helpers
    def _encode_batch_ids(self, inputs: list, is_pretokenized: bool = False) -> list[Encoding]:
        """`backend.encode_batch` for callers that need no offsets: the same ids, type ids and
        masks, offsets left at zero (`encode_batch_fast`, tokenizers >= 0.20)."""
        fast = getattr(self.backend, "encode_batch_fast", None)
        return (fast or self.backend.encode_batch)(inputs, is_pretokenized=is_pretokenized)

    def _configured(self, max_length: int | None, truncation: bool, strategy: str, stride: int,
                    n_special: int) -> _BackendSettings:
        """Truncation settings for one call; n_special: the special tokens each row gets (BERT: 2, or
        3 for pairs), which max_length must hold (the Rust backend would silently not truncate)."""
        if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool)
                                       or max_length < 1):
            raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
        if truncation and max_length is not None and max_length < n_special:
            pair = n_special == self.num_special[True] and n_special != self.num_special[False]
            what = " ".join(self.backend.encode("a", "b" if pair else None, add_special_tokens=True).tokens)
            raise ValueError(f"max_length={max_length} cannot hold the {n_special} special tokens of {what}; "
                             f"use max_length >= {n_special + 1}")
        if strategy not in _TRUNCATION_STRATEGIES:
            raise ValueError(f"truncation strategy must be one of {_TRUNCATION_STRATEGIES}, got {strategy!r}")
        if stride < 0:
            raise ValueError(f"stride must be >= 0, got {stride}")
        limit = max_length or self.model_max_length
        return _BackendSettings(self.backend, limit if truncation else None, strategy, stride)


class WordPieceTokenizer(FastTokenizer):
    """BERT's WordPiece tokenizer: a `FastTokenizer` that can also be built around a vocab.txt, and
    saves one beside tokenizer.json. Attributes besides FastTokenizer's: do_lower_case,
    strip_accents, tokenize_chinese_chars (its BertNormalizer's settings)."""

    def __init__(
        self,
        backend: Tokenizer,
        model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
        special_tokens: dict[str, str] | None = None,
        source: str = "<in-memory tokenizer>",
        token_types: bool = True,
        hf_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(backend, model_max_length, special_tokens, source, token_types, hf_config)
        if backend.decoder is None:
            backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        norm = backend.normalizer
        self.do_lower_case = bool(getattr(norm, "lowercase", True))
        self.strip_accents = getattr(norm, "strip_accents", None)
        self.tokenize_chinese_chars = bool(getattr(norm, "handle_chinese_chars", True))

    @classmethod
    def from_vocab_file(
        cls,
        path: str | os.PathLike,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
        special_tokens: dict[str, str] | None = None,
    ) -> WordPieceTokenizer:
        """Build the full BERT pipeline around a vocab.txt (what BertTokenizerFast does)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"vocab file not found: {path}")
        specials = dict(special_tokens or DEFAULT_SPECIAL_TOKENS)
        vocab = read_vocab(path)
        for role, token in specials.items():  # check here so the error names the file
            if token not in vocab:
                raise ValueError(f"vocab file {path} has no {token!r} token ({role})")
        backend = Tokenizer(WordPiece(vocab, unk_token=specials["unk"], max_input_chars_per_word=MAX_WORD))
        _bert_pipeline(backend, specials, lowercase, strip_accents, tokenize_chinese_chars)
        backend.post_processor = _template(backend, specials["cls"], specials["sep"])
        return cls(backend, model_max_length, specials, source=str(path))

    def save(self, folder: str | os.PathLike) -> None:
        """Write tokenizer.json, vocab.txt and tokenizer_config.json (loadable by HF too)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with writing(folder / "tokenizer.json"):  # the Rust writer reports a full disk without the file
            self.backend.save(str(folder / "tokenizer.json"))
        write_vocab(folder, self.get_vocab(), self.source)
        config = {
            **self.hf_config,
            "tokenizer_class": self.hf_config.get("tokenizer_class", "BertTokenizer"),
            "do_lower_case": self.do_lower_case,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "model_max_length": self.model_max_length,
            **{f"{role}_token": token for role, token in self.special_tokens.items()},
        }
        write_tokenizer_config(folder, config, self.token_types)


class _BackendSettings:
    """Context manager: truncation on the Rust backend for one call; errors become ValueError."""

    def __init__(self, backend: Tokenizer, max_length: int | None, strategy: str, stride: int) -> None:
        self.backend, self.max_length, self.strategy, self.stride = backend, max_length, strategy, stride

    def __enter__(self) -> None:
        if self.max_length is not None:
            self.backend.enable_truncation(self.max_length, stride=self.stride, strategy=self.strategy)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.backend.no_truncation()
        # Rust errors arrive as a bare Exception, Rust panics (e.g. stride too large) as PanicException
        if exc is not None and (type(exc) is Exception or type(exc).__name__ == "PanicException"):
            raise ValueError(
                f"tokenization failed (max_length={self.max_length}, stride={self.stride}, "
                f"truncation={self.strategy!r}): {exc}"
            ) from exc
        return False


def _check_str(text: Any, name: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    if not text.isascii() and (found := _SURROGATE.search(text)):
        raise ValueError(f"{name} holds a lone surrogate {found.group()!r} at character {found.start()}, which is not "
                         "Unicode text (a broken escape or a decoding with errors='surrogateescape'); fix or drop it")
    return text


def _as_batch(texts: Any, split: bool, name: str) -> tuple[list, bool]:
    """Normalise a str / list input to a list of examples; also say whether it was a single one."""
    if isinstance(texts, str):
        if split:
            raise TypeError(f"{name} with is_split_into_words=True must be a list of words, got a str")
        return [_check_str(texts, name)], True
    if not isinstance(texts, Iterable) or isinstance(texts, (bytes, dict)):
        raise TypeError(f"{name} must be a str or a list of str, got {type(texts).__name__}")
    texts = list(texts)
    if split and (not texts or isinstance(texts[0], str)):
        texts, single = [texts], True  # one pre-split example
    else:
        single = False
    if not texts:
        raise ValueError(f"{name} is empty")
    for i, item in enumerate(texts):
        if split:
            ok = isinstance(item, (list, tuple)) and all(isinstance(w, str) for w in item)
        else:
            ok = isinstance(item, str)
        if not ok:
            want = "a list of str words" if split else "a str"
            raise TypeError(f"{name}[{i}] must be {want}, got {type(item).__name__}: {item!r:.80}")
        where = name if single else f"{name}[{i}]"
        if split:
            texts[i] = list(item)
            for j, word in enumerate(item):
                _check_str(word, f"{where}[{j}]")
        else:
            _check_str(item, where)
    return texts, single


def _as_list(ids: Any) -> list:
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


def _to_tensor(rows: list, kind: str) -> Any:
    if kind == "pt":
        import torch  # lazy: the tokenizer works without torch

        return torch.tensor(rows, dtype=torch.long)
    import numpy as np

    return np.asarray(rows, dtype=np.int64)


# --------------------------------------------------------------------------------- factories
def get_tokenizer(name_or_path: str | os.PathLike) -> FastTokenizer:
    """A tokenizer from a folder (tokenizer.json or vocab.txt), a tokenizer.json / vocab.txt
    file, or a hub name ("bert-base-uncased") with a local copy (see `bert_kit.model_folder`):
    a `WordPieceTokenizer` for WordPiece vocabularies, a `FastTokenizer` for BPE and Unigram ones."""
    from bert_kit.model_folder import TOKENIZER_FILES, find_local_model, is_hub_name, missing_model_message

    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return FastTokenizer.from_pretrained(path)
    if path.is_file():
        if path.suffix == ".json":
            backend = Tokenizer.from_file(str(path))
            made = WordPieceTokenizer if type(backend.model).__name__ == "WordPiece" else FastTokenizer
            return made(backend, special_tokens=special_tokens_from_config({}, backend.get_vocab()), source=str(path))
        return WordPieceTokenizer.from_vocab_file(path)
    name = str(name_or_path)
    if not is_hub_name(name):
        raise FileNotFoundError(f"tokenizer folder not found: {path}")
    found = find_local_model(name, TOKENIZER_FILES)
    if found is not None:
        return FastTokenizer.from_pretrained(found)
    raise FileNotFoundError(missing_model_message(name, "tokenizer"))
