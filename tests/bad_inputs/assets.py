"""Tiny, valid inputs that the bad-input tests break one way at a time.

Everything is built in seconds on a CPU: a 30-document corpus, a 120-token WordPiece
vocabulary, 2-layer 32-wide models (MLM and classification folders), run configs for
`pretrain` and `finetune`, and one finished pretraining run with checkpoints at steps 2, 4, 6.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.tasks.test_pretraining import write_corpus

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


@dataclass
class Assets:
    root: Path
    corpus: Path  # text corpus (also one sentence per line for `embed`)
    tokenizer: Path  # tokenizer folder
    mlm: Path  # BERTForMaskedLM folder with tokenizer files
    encoder: Path  # BERTModel folder (no heads) with tokenizer files
    classifier: Path  # fine-tuned classification folder (task metadata, label names)
    train_tsv: Path  # sentence<TAB>label, 24 rows
    pretrain_yaml: Path  # a valid pretraining run config (6 steps, checkpoints every 2)
    finetune_yaml: Path  # a valid fine-tuning run config (4 steps)
    run: Path  # a finished pretraining run of pretrain_yaml: checkpoints/step-000000{2,4,6}, final/

    def copy(self, name: str, dest: Path) -> Path:
        """A fresh copy of asset folder `name` ("mlm", "run", ...) at `dest`."""
        shutil.copytree(getattr(self, name), dest)
        return dest


def build_assets(root: Path) -> Assets:
    import torch

    from bert_kit.config import BertConfig
    from bert_kit.heads import BERTForMaskedLM, BERTForSequenceClassification
    from bert_kit.model import BERTModel
    from bert_kit.model_folder import write_model_metadata
    from bert_kit.tasks.pretraining import PretrainConfig, pretrain
    from bert_kit.tokenizer_training import train_tokenizer
    from bert_kit.training.runconfig import load_config

    root.mkdir(parents=True, exist_ok=True)
    corpus = write_corpus(root / "corpus.txt")
    tok = train_tokenizer([str(corpus)], vocab_size=120, min_frequency=1)
    tok.save(root / "tok")
    config = BertConfig(vocab_size=tok.vocab_size, **TINY)
    torch.manual_seed(0)
    folders = {}
    for name, model in (("mlm", BERTForMaskedLM(config)), ("encoder", BERTModel(config)),
                        ("classifier", BERTForSequenceClassification(config, num_labels=2))):
        if name == "classifier":
            model.id2label = {"0": "neg", "1": "pos"}
        model.save_pretrained(root / name)
        tok.save(root / name)
        folders[name] = root / name
    write_model_metadata(root / "classifier", {"task": "classification", "max_length": 32})

    rows = ["sentence\tlabel"] + [f"the {w} cat sees the dog\t{i % 2}" for i, w in
                                  enumerate("red big small old new happy sad quick".split() * 3)]
    train_tsv = root / "train.tsv"
    train_tsv.write_text("\n".join(rows) + "\n")
    model_yaml = "{preset: bert-tiny, " + ", ".join(f"{k}: {v}" for k, v in TINY.items()) + "}"
    pretrain_yaml = root / "pretrain.yaml"
    pretrain_yaml.write_text(
        f"model: {model_yaml}\ntokenizer: {root / 'tok'}\ntrain_files: [{corpus}]\nmax_length: 32\n"
        "batch_size: 4\nmax_steps: 6\nlr: 1.0e-3\neval_every: 3\neval_batches: 2\nsave_every: 2\nkeep_last: 3\n"
        f"log_every: 1\neval_fraction: 0.1\ndevice: cpu\noutput_dir: {root / 'run'}\n")
    finetune_yaml = root / "finetune.yaml"
    finetune_yaml.write_text(
        f"task: classification\nmodel: {root / 'mlm'}\ntrain_file: {train_tsv}\nvalidation_file: {train_tsv}\n"
        "max_length: 32\nbatch_size: 8\nmax_steps: 4\nlr: 1.0e-3\nlog_every: 1\nsave_every: 2\ndevice: cpu\n"
        f"output_dir: {root / 'ft'}\n")
    pretrain(load_config(PretrainConfig, pretrain_yaml))
    return Assets(root, corpus, root / "tok", folders["mlm"], folders["encoder"], folders["classifier"], train_tsv,
                  pretrain_yaml, finetune_yaml, root / "run")
