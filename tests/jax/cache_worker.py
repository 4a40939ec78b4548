"""A process of tests/jax/test_compilation.py: the bert-kit compilation cache in the folder argv[1],
one jitted program compiled (or loaded), one JSON line out: the result, cache hits, warnings."""

import json
import logging
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from bert_kit.jax.compilation import use_compilation_cache

use_compilation_cache(sys.argv[1], env={})
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # cache even this small program
jax.config.update("jax_log_compiles", True)
hits = []


class Hits(logging.Handler):
    def emit(self, record):
        if "Persistent compilation cache hit" in record.getMessage():
            hits.append(record.getMessage())


logging.getLogger("jax").addHandler(Hits())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")

    @jax.jit
    def program(x):
        for i in range(40):  # a program of some size: its entry takes a while to write
            x = jnp.sin(x) * (i + 1) + jnp.cos(x @ x.T)[:, :1]
        return x.sum()

    value = float(program(np.linspace(0.0, 1.0, 64 * 8, dtype=np.float32).reshape(64, 8)))
print(json.dumps({"value": value, "hits": len(hits), "warnings": [str(w.message) for w in caught]}))
