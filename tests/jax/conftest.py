"""The JAX engine's tests run on the CPU; they skip where jax, flax or optax is not installed.

XLA's CPU compiler spends most of these tests' time optimising machine code for models that run
for milliseconds: its backend optimisation level 0 halves the compile time (the numbers are the
same; XLA does no fast-math on the CPU). Set before jax starts its CPU backend.
"""

import os

if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
