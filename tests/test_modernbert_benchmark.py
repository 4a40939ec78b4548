"""benchmarks/modernbert_throughput.py runs end to end in its --tiny mode (on a CPU too): every
variant of both cases (inference on rows of mixed lengths) gives a row of the table, beside
transformers'.

Run: .venv/bin/python -m pytest tests/test_modernbert_benchmark.py -q
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("transformers")


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [[], ["--parallel", "2"]])  # in this process; in child processes, in waves
def test_tiny_mode_prints_a_row_for_every_variant_beside_transformers(parallel):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "modernbert_throughput.py"), "--tiny", "--steps",
                          "2", "--warmup", "1", "--mixed", *parallel], capture_output=True, text=True, timeout=300,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    row = (r"^\| (training|inference) seq \d+(?: mixed)? batch \d+ \| ([\w-]+) \| ([\d.]+)k \| [\d.]+ \| "
           r"[\d.]+% \| - \| ([\d.]+)x \|$")  # case, variant, tokens/s, ms, MFU, memory (none on a CPU), ratio
    rows = re.findall(row, out.stdout, flags=re.M)
    assert [(kind, variant) for kind, variant, *_ in rows] == [
        ("training", "bertkit-eager"), ("training", "hf-eager"), ("inference", "bertkit-unpadded"),
        ("inference", "hf-eager")]
    assert all(float(tps) > 0 for *_, tps, _ in rows)
    assert [float(ratio) for *_, ratio in rows][1::2] == [1.0, 1.0]  # transformers against itself
    assert re.search(r"^target inference seq 128 mixed batch 2: bertkit-unpadded [\d.]+k \(MFU [\d.]+%\) / hf-eager "
                     r"[\d.]+k = [\d.]+x \(target 2.0x: (met|short)\)$", out.stdout, flags=re.M), out.stdout
