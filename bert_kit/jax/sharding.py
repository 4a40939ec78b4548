"""How the JAX engine lays its training state over the devices of its mesh (one "data" axis).

`parallel: ddp` (the default) replicates the trained weights and the optimizer state on every
device; each step's gradients are all-reduced. `parallel: fsdp` shards them, as PyTorch's FSDP2
does: each array split along its largest dimension that the number of devices divides (an array
none divides, a LayerNorm's (H,) on 3 devices, stays replicated), so a device holds about 1/N of
the float32 weights and of AdamW's two moments. The step gathers the weights at their use, in the
compute dtype (`Programs.model_at` constrains them to replicated: that leaves the batch split as
under ddp, so the model and its kernels see the same activations), and GSPMD reduce-scatters the
gradients into the shards that the optimizer updates. Frozen weights (an unused pooler) stay
replicated: they have no optimizer state, and the forward reads them.

    shardings = fsdp_shardings(abstract_params, mesh)   # NamedSharding per leaf
    params = jax.device_put(params, shardings)
    to_host(params)                                     # NumPy arrays, whole, on every process
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXIS = "data"


def fsdp_spec(shape: tuple[int, ...], devices: int) -> P:
    """The partition of an array of `shape` over `devices`: its largest dimension that `devices`
    divides (the first of equal ones) split over the data axis; replicated where none is (scalars too)."""
    divisible = [(size, -axis) for axis, size in enumerate(shape) if size >= devices and size % devices == 0]
    if devices == 1 or not divisible:
        return P()
    axis = -max(divisible)[1]
    return P(*(AXIS if i == axis else None for i in range(len(shape))))


def fsdp_shardings(tree: Any, mesh: Mesh) -> Any:
    """A NamedSharding per leaf of `tree` (arrays or ShapeDtypeStructs), by `fsdp_spec`."""
    return jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(tuple(x.shape), mesh.devices.size)), tree)


def replicated_shardings(tree: Any, mesh: Mesh) -> Any:
    """The same replicated NamedSharding for every leaf of `tree`."""
    return jax.tree.map(lambda _: NamedSharding(mesh, P()), tree)


def bytes_per_device(tree: Any, shardings: Any) -> tuple[int, int]:
    """(bytes one device holds, bytes of the whole arrays) of `tree` laid out by `shardings`."""
    leaves, layouts = jax.tree.leaves(tree), jax.tree.leaves(shardings)
    whole = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in leaves)
    held = sum(int(np.prod(s.shard_shape(tuple(x.shape)))) * x.dtype.itemsize for x, s in zip(leaves, layouts))
    return held, whole


def describe_fsdp(params: Any, opt_state: Any, shardings: tuple[Any, Any], devices: int) -> str:
    """The run's start line under fsdp: how much of the weights and optimizer state a device holds."""
    held, whole = bytes_per_device((params, opt_state), shardings)
    arrays = [(x, s) for x, s in zip(jax.tree.leaves((params, opt_state)), jax.tree.leaves(shardings)) if x.ndim]
    split, total = sum(s.spec != P() for _, s in arrays), len(arrays)  # (scalars: AdamW's step count)
    return (f"parallel: fsdp: weights and optimizer state sharded over {devices} device(s) ({split} of {total} "
            f"arrays split): {held / 2**20:.1f} MiB a device of {whole / 2**20:.1f} MiB")


def to_host(tree: Any) -> Any:
    """NumPy copies of a pytree of global arrays, whole (sharded ones gathered), on every process.
    Several processes: a collective, which every process must call."""
    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, jax.device_get(tree))
    return multihost_utils.process_allgather(tree, tiled=True)  # (tiled: global arrays come back whole)
