"""The JAX engine's tests run on the CPU; they skip where jax, flax or optax is not installed.

XLA's CPU compiler spends most of these tests' time optimising machine code for models that run
for milliseconds: its backend optimisation level 0 halves the compile time (the numbers are the
same; XLA does no fast-math on the CPU). Set before jax starts its CPU backend, as is the number of
CPU devices: two, so the engine's runs are data parallel as on the GPUs of a machine. The training runs
of test_engine*.py compile the same programs again (a resumed run, the run beside it, a command in
a process of its own): JAX's persistent compilation cache, in a folder of this session, compiles
each once.
"""

import atexit
import os
import shutil
import tempfile

if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
# two CPU devices: the engine's runs (device=auto: every device) split each batch over both, as over
# the GPUs of a machine; the tests of single-device steps pick one device themselves
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=2"

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="bert-kit-jax-tests-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache  # read when jax is imported, and by subprocesses
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
