"""`python -m bert_kit ...` (and `torchrun -m bert_kit ...`) runs the command line."""

import sys

from bert_kit.cli import main

sys.exit(main())
