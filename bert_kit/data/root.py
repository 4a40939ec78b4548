"""The data root: the one folder where the shipped configs look for the public data sets.

A config names its data through the root, e.g. `train_file: ${BERT_KIT_DATA}/sst2/train.tsv`;
the variable is expanded when the config is read (`bert_kit.training.runconfig`). BERT_KIT_DATA
is an environment variable; unset, the root is `data` in the working directory, so a link
`data -> /where/the/data/sets/are` works as well. docs/data.md lists each data set, its layout
and where to get it; nothing is downloaded at run time.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ROOT_VARIABLE = "BERT_KIT_DATA"
DEFAULT_DATA_ROOT = "data"
# the folders the shipped configs read below the root
DATA_SETS = ("sst2", "stsb", "conll2003", "squad-v1.1", "wikitext-2")


def data_root() -> Path:
    """$BERT_KIT_DATA, else ./data."""
    return Path(os.environ.get(DATA_ROOT_VARIABLE) or DEFAULT_DATA_ROOT).expanduser()


def missing_data_message(path: str | Path, where: str) -> str:
    """The error for a data file below the root that is not there: what, where, and how to get it."""
    root = os.environ.get(DATA_ROOT_VARIABLE)
    setting = (f"{DATA_ROOT_VARIABLE}={root}" if root else
               f"{DATA_ROOT_VARIABLE} is not set, so the data root is ./{DEFAULT_DATA_ROOT}")
    return (f"{where}: {path} not found ({setting}). The shipped configs read public data sets below the data "
            f"root: set {DATA_ROOT_VARIABLE} to the folder holding {', '.join(f'{d}/' for d in DATA_SETS)} "
            "(docs/data.md says where to get each), or point the setting at your own file with key=value.")
