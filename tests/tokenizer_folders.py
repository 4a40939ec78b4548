"""Tiny tokenizers of the BERT family's other members, built offline with the `tokenizers` library
and saved as HF folders by transformers' own classes (nothing comes from a hub):

- `roberta_folder`: byte-level BPE, <s> a </s></s> b </s> (RobertaProcessing), as RoBERTa's;
- `modernbert_folder`: byte-level BPE under NFC, [CLS] a [SEP] b [SEP] (TemplateProcessing), saved
  as a PreTrainedTokenizerFast with model_input_names [input_ids, attention_mask], as ModernBERT's;
- `xlmr_folder`: Unigram with a Metaspace pre-tokenizer (SentencePiece's), as XLM-RoBERTa's;
- `distilbert_folder`: BERT's WordPiece, saved by DistilBertTokenizerFast (no token_type_ids).

Each pipeline is the one transformers' class for that family builds (transformers 5 rebuilds
the normalizer and pre-tokenizer of RobertaTokenizer and XLMRobertaTokenizer from the class, not
from tokenizer.json), as the hub's files are.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, this is a tiny corpus for a tiny tokenizer!",
    "Numbers like 12345 and 3.14 appear; so do symbols #$% & (brackets).",
    "Ünïcödé wörds, café, naïve, 你好世界, and an emoji 🙂.",
    "Tokenizers split words into pieces: un-believ-able, re-tokenize.",
    "  Leading spaces,\ttabs and\nnew lines matter to byte-level BPE.",
] * 10

SENTENCES = [
    "The quick brown fox.",
    "hello world",
    "An unseen word: zyxwvut and Zebra-crossing!",
    "  two  spaces   and a tab\there ",
    "café naïve 你好 🙂 ∑",
    "a <mask> in the text, and <s> too",
    "x",
    "",
]
PAIRS = [("What jumps?", "The quick brown fox jumps."), ("hello", "world"), ("a <mask> b", "c d e f g h i j")]


def _bpe(specials: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def roberta_folder(folder: Path) -> Path:
    """RoBERTa's tokenizer: byte-level BPE, <s>=0 <pad>=1 </s>=2 <unk>=3, <mask> last (lstrip)."""
    import transformers

    tok = _bpe(["<s>", "<pad>", "</s>", "<unk>"])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    hf = transformers.RobertaTokenizerFast(tokenizer_object=tok, model_max_length=512)
    hf.save_pretrained(folder)
    return folder


def modernbert_folder(folder: Path) -> Path:
    """ModernBERT's tokenizer: NFC, byte-level BPE, [CLS] a [SEP] b [SEP], [MASK] (lstrip)."""
    import transformers

    tok = _bpe(["[UNK]", "[CLS]", "[SEP]", "[PAD]"])
    tok.normalizer = normalizers.NFC()
    tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, special=True, normalized=False)])
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
        mask_token="[MASK]", model_max_length=8192, model_input_names=["input_ids", "attention_mask"])
    hf.save_pretrained(folder)
    return folder


def xlmr_folder(folder: Path) -> Path:
    """XLM-RoBERTa's tokenizer: Unigram (SentencePiece) with Metaspace, <s> a </s></s> b </s>."""
    import transformers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=250, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>", show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    hf = transformers.XLMRobertaTokenizerFast(tokenizer_object=tok, model_max_length=512)
    hf.save_pretrained(folder)
    return folder


def distilbert_folder(folder: Path) -> Path:
    """DistilBERT's tokenizer: BERT's WordPiece (trained here), without token_type_ids."""
    import transformers

    from bert_kit.tokenizer_training import train_tokenizer

    wordpiece = folder.parent / f"{folder.name}-wordpiece"
    train_tokenizer(texts=CORPUS, vocab_size=200, min_frequency=1).save(wordpiece)
    hf = transformers.DistilBertTokenizerFast(vocab_file=str(wordpiece / "vocab.txt"), model_max_length=512)
    hf.save_pretrained(folder)
    return folder


FOLDERS = {"roberta": roberta_folder, "modernbert": modernbert_folder, "xlm-roberta": xlmr_folder}
ALL_FOLDERS = {**FOLDERS, "distilbert": distilbert_folder}
