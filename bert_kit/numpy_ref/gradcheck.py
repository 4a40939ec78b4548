"""Finite-difference gradient checks: the test every hand-written backward pass must pass.

For a scalar loss L and one parameter entry w, the central difference

    (L(w + eps) - L(w - eps)) / (2 eps)

approximates dL/dw with error O(eps^2) (truncation) + O(machine_eps * |L| / eps) (rounding).
In float64 with eps = 1e-6 both are around 1e-10, so a correct backward agrees to ~1e-8 relative
and a wrong one (a missing term, a transposed matrix) is off by order 1.

Checking every entry costs two forward passes each, so a random subset of entries per tensor is
compared; the error of a tensor is ``|a - n| / max(|a| + |n|, floor)`` over its sampled entries. The
floor (1e-2) keeps a tensor whose true gradient is zero, like the attention key bias, from dividing
rounding noise by rounding noise: below it the test is absolute, |a - n| < 1e-2 * tolerance.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .layers import Module


def relative_error(analytic: np.ndarray, numeric: np.ndarray, floor: float = 1e-2) -> float:
    """Norm of the difference over the sum of norms (at least ``floor``)."""
    diff = np.linalg.norm(np.ravel(analytic) - np.ravel(numeric))
    return float(diff / max(np.linalg.norm(analytic) + np.linalg.norm(numeric), floor))


def numeric_gradient(loss_fn: Callable[[], float], array: np.ndarray, index: tuple, eps: float = 1e-6) -> float:
    """Central difference of ``loss_fn`` w.r.t. ``array[index]`` (perturbed in place, then restored)."""
    original = array[index].copy()
    array[index] = original + eps
    loss_plus = loss_fn()
    array[index] = original - eps
    loss_minus = loss_fn()
    array[index] = original
    return (loss_plus - loss_minus) / (2.0 * eps)


def compare_gradients(loss_fn: Callable[[], float], arrays: dict[str, np.ndarray],
                      analytic: dict[str, np.ndarray], *, entries: int = 6, eps: float = 1e-6,
                      seed: int = 0) -> dict[str, float]:
    """Relative error per tensor name between ``analytic`` and finite differences of ``loss_fn``.

    ``arrays`` are perturbed in place, so they must be the very arrays the loss reads (the model's
    parameters or the input).
    """
    rng = np.random.default_rng(seed)
    errors = {}
    for name, array in arrays.items():
        if array.shape != analytic[name].shape:
            raise ValueError(f"gradient of {name} has shape {analytic[name].shape}, tensor has {array.shape}")
        flat = rng.choice(array.size, size=min(entries, array.size), replace=False)
        indices = [np.unravel_index(i, array.shape) for i in flat]
        numeric = np.array([numeric_gradient(loss_fn, array, idx, eps) for idx in indices])
        errors[name] = relative_error(np.array([analytic[name][idx] for idx in indices]), numeric)
    return errors


def check_layer(layer: Module, x: np.ndarray, *args, input_is_differentiable: bool = True,
                entries: int = 6, eps: float = 1e-6, seed: int = 0) -> dict[str, float]:
    """Gradient check of one layer for the loss L = sum(R * layer(x, *args)), R fixed random.

    Returns the relative error of every parameter tensor and (if differentiable) of the input,
    under the name "input". Use float64 layers: float32 rounding swamps the differences.
    """
    rng = np.random.default_rng(seed)
    if input_is_differentiable:
        x = np.array(x, dtype=np.float64)  # own copy: it is perturbed in place
    projection = rng.standard_normal(np.shape(layer.forward(x, *args)))

    def loss() -> float:
        return float((layer.forward(x, *args) * projection).sum())

    loss()  # fresh cache for backward
    # dL/dy = R, so backward(R) gives dL/dx and every dL/dparam.
    grad_x = layer.backward(projection, 0.0)
    analytic = {name: grad.copy() for name, grad in layer.named_grads()}
    arrays = dict(layer.named_parameters())
    if input_is_differentiable:
        analytic["input"], arrays["input"] = grad_x, x
    return compare_gradients(loss, arrays, analytic, entries=entries, eps=eps, seed=seed)
