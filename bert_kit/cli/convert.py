"""`bert-kit convert`: turn an HF folder of BERT, RoBERTa, XLM-RoBERTa, DistilBERT or ModernBERT
(safetensors or pytorch_model.bin, one file or shards with their index) into a clean bert-kit / HF
folder with one `model.safetensors`, choosing which heads to keep. Weights of integers (a quantized
checkpoint) are refused, naming the tensor.

    bert-kit convert --input ~/models/bert-base-uncased --output models/bert-base --head mlm

--head pretraining keeps MLM + NSP heads (BertForPreTraining: BERT only), mlm the MLM head only,
base the encoder (and BERT's pooler) only; the default picks the richest head the checkpoint has. Heads the
checkpoint lacks are initialised fresh and named in the output. Tokenizer files are copied.
The written folder loads in `transformers` with the same outputs (weights are only renamed).
--output must be a new or empty folder, or one that bert-kit wrote (its record lists every file
in it): a folder holding anything else is refused, naming those files.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from bert_kit.checks import ConfigError
from bert_kit.outputs import OutputFolder

HEADS = {"pretraining": "ForPreTraining", "mlm": "ForMaskedLM", "base": "Model"}  # --head -> role
# the fast tokenizer, its settings, and the files of the slow ones (WordPiece, BPE, SentencePiece)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "sentencepiece.bpe.model")


def detect_head(state: dict, model_type: str = "bert") -> str:
    """The richest head present in an HF state dict of the family `model_type`: pretraining, mlm or base."""
    from bert_kit.hf_names import holds_mlm_head

    if any(k.startswith("cls.seq_relationship.") for k in state):
        return "pretraining"
    if holds_mlm_head(list(state), model_type):
        return "mlm"
    return "base"


def convert(input_folder: str | Path, output_folder: str | Path, head: str | None = None) -> tuple[str, list[str]]:
    """Load `input_folder` into the `head` class and save it; return (head, new head weights)."""
    from bert_kit.config import load_hf_config
    from bert_kit.hf import load_into
    from bert_kit.weight_files import read_state_dict
    from bert_kit.model_folder import resolve_model

    src, dst = resolve_model(input_folder), Path(output_folder)  # a folder, or a hub name's local copy
    if src.resolve() == dst.resolve():
        raise ConfigError(f"--output must differ from --input ({src})")
    out = OutputFolder(dst, "--output", "bert-kit convert")  # before any work
    config = load_hf_config(src)
    state = read_state_dict(src)
    head = head or detect_head(state, config.model_type)
    from bert_kit.families import CLASSES

    heads = sorted(h for h, part in HEADS.items() if part in CLASSES[type(config)])
    if head not in heads:
        raise ValueError(f"--head {head} is not a head of {config.model_type}: expected one of {heads}")
    model = CLASSES[type(config)][HEADS[head]](config)
    new_heads = load_into(model, state, source=str(src))
    out.prepare()
    model.save_pretrained(dst)
    copied = [name for name in TOKENIZER_FILES if (src / name).is_file()]
    for name in copied:
        shutil.copyfile(src / name, dst / name)
    out.commit(["config.json", "model.safetensors", *copied])
    return head, new_heads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="HF or bert-kit model folder, or a hub name with a local copy")
    parser.add_argument("--output", required=True, help="folder to write")
    parser.add_argument("--head", choices=HEADS, default=None,
                        help="heads to keep (default: all the checkpoint has)")



def run(args: argparse.Namespace) -> int:
    from bert_kit.cli.errors import check_output_dir

    check_output_dir(args.output, "--output")
    head, new_heads = convert(args.input, args.output, args.head)
    print(f"wrote {args.output} ({head} model, model.safetensors)")
    if new_heads:
        print(f"newly initialised (absent from {args.input}): {', '.join(new_heads)}")
    return 0
