"""What a JAX run keeps when it is resumed with other settings than its checkpoint's (precision).

Run: .venv/bin/python -m pytest tests/jax/test_engine_resume_settings.py -q -n 0
"""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")

from safetensors.numpy import load_file  # noqa: E402

from bert_kit.jax.engine import STATE_FILE  # noqa: E402
from bert_kit.jax.train import INIT_SCALE  # noqa: E402
from bert_kit.tasks.pretraining import pretrain  # noqa: E402
from bert_kit.training.checkpoint import latest_checkpoint  # noqa: E402
from tests.jax.test_engine import jax_config  # noqa: E402


def test_a_run_resumed_in_fp16_from_an_fp32_checkpoint_starts_with_the_initial_loss_scale(tmp_path):
    """An fp32 (or bf16) run's checkpoint holds a scale of 1 that no step read: a run resumed from it
    in fp16 scales its loss from GradScaler's initial 2**16, as torch's, not by 1 (its small
    gradients would flush to zero)."""
    pretrain(jax_config(tmp_path, "run", max_steps=2, save_every=2, precision="fp32"))
    pretrain(jax_config(tmp_path, "run", max_steps=3, save_every=2, precision="fp16"), resume="latest")
    saved = load_file(latest_checkpoint(tmp_path / "run" / "checkpoints") / STATE_FILE)
    assert float(saved["loss_scale"]) == INIT_SCALE and int(saved["good_steps"]) == 1
