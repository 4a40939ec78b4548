"""Building blocks of the NumPy BERT: each layer's backward pass sits right beside its forward.

Every layer follows one small contract:

* ``params``: dict name -> array, the trainable tensors the layer owns;
* ``forward(x)`` computes the output and keeps in ``self._cache`` only what backward needs;
* ``backward(grad_out, lr=0.0)`` takes dLoss/dOutput, fills ``grads`` (same names and shapes as
  ``params``), returns dLoss/dInput, and only then applies one SGD step ``p -= lr * g``
  (``lr=0`` computes gradients and leaves the weights untouched).

Layers that contain other layers (attention, encoder, ...) find them through their attributes, so
``named_parameters()`` yields dotted names such as ``attention.query.weight``.

Conventions shared with torch: a Linear weight is ``(out_features, in_features)`` and computes
``x @ W.T + b``; GELU is the exact erf form; LayerNorm uses the biased variance and ``eps`` inside
the square root; an Embedding built with ``padding_idx`` gives that row no gradient from lookups.
There is no dropout anywhere: the engine is deterministic, which is what a reference needs.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

try:  # numpy has no erf; scipy's is vectorised and exact to float64 rounding
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover - scipy is a dependency of the dev environment
    _erf = np.vectorize(math.erf, otypes=[np.float64])

# Token ids reserved for special tokens in the synthetic data and the model.
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3

INIT_STD = 0.02  # BERT's initializer_range: N(0, 0.02) for every weight matrix


def _normal(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    return (rng.standard_normal(shape) * INIT_STD).astype(dtype)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax: subtracting the max leaves the result unchanged, avoids overflow."""
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


class Module:
    """Base class: parameter bookkeeping and the SGD update, no maths."""

    def __init__(self) -> None:
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self._cache: tuple | None = None

    def children(self) -> Iterator[tuple[str, "Module"]]:
        """Sub-layers held as attributes (or lists of them); names starting with '_' are skipped."""
        for name, value in vars(self).items():
            if name.startswith("_"):
                continue
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield f"{name}.{i}", item

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        for name, value in self.params.items():
            yield prefix + name, value
        for child_name, child in self.children():
            yield from child.named_parameters(f"{prefix}{child_name}.")

    def named_grads(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        """Gradients in the same order and with the same names as ``named_parameters``."""
        for name in self.params:
            yield prefix + name, self.grads[name]
        for child_name, child in self.children():
            yield from child.named_grads(f"{prefix}{child_name}.")

    def zero_grad(self) -> None:
        """Zero gradients for this layer and every sub-layer (for parts a backward did not reach)."""
        self.grads = {name: np.zeros_like(param) for name, param in self.params.items()}
        for _, child in self.children():
            child.zero_grad()

    def update(self, lr: float) -> None:
        """SGD step on this layer's own parameters, in place (tied references stay valid)."""
        if lr:
            for name, param in self.params.items():
                param -= lr * self.grads[name]

    def sgd_step(self, lr: float) -> None:
        """SGD step on this layer and every sub-layer."""
        self.update(lr)
        for _, child in self.children():
            child.sgd_step(lr)

    def num_parameters(self) -> int:
        return sum(p.size for _, p in self.named_parameters())

    def _require_cache(self) -> tuple:
        if self._cache is None:
            raise RuntimeError(f"{type(self).__name__}.backward called before forward")
        return self._cache

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class Linear(Module):
    """y = x @ W.T + b with W of shape (out_features, in_features), as in torch."""

    def __init__(self, in_features: int, out_features: int, *, dtype=np.float32,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        self.in_features, self.out_features = in_features, out_features
        self.params["weight"] = _normal(rng, (out_features, in_features), dtype)
        self.params["bias"] = np.zeros(out_features, dtype=dtype)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: (..., in_features) -> (..., out_features)."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Linear expects last dim {self.in_features}, got input shape {x.shape}")
        self._cache = (x,)
        return x @ self.params["weight"].T + self.params["bias"]

    def backward(self, grad_out: np.ndarray, lr: float = 0.0) -> np.ndarray:
        (x,) = self._require_cache()
        # Flatten the leading dims: every row of x is an independent sample of the same map.
        g2 = grad_out.reshape(-1, self.out_features)                 # (N, out)
        self.grads["weight"] = g2.T @ x.reshape(-1, self.in_features)  # (out, in)
        self.grads["bias"] = g2.sum(axis=0)                           # (out,)
        grad_in = grad_out @ self.params["weight"]                    # (..., in), before the update
        self.update(lr)
        return grad_in


class Embedding(Module):
    """Lookup table: ids (...,) -> rows of ``weight`` (num_embeddings, dim)."""

    def __init__(self, num_embeddings: int, dim: int, *, padding_idx: int | None = None,
                 dtype=np.float32, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        self.num_embeddings, self.dim, self.padding_idx = num_embeddings, dim, padding_idx
        self.params["weight"] = _normal(rng, (num_embeddings, dim), dtype)
        if padding_idx is not None:
            self.params["weight"][padding_idx] = 0.0  # BERT starts the [PAD] vector at zero

    def forward(self, ids: np.ndarray) -> np.ndarray:
        self._cache = (ids,)
        return self.params["weight"][ids]

    def backward(self, grad_out: np.ndarray, lr: float = 0.0) -> None:
        """grad_out: (..., dim). A row's gradient is the sum over every place its id was looked up."""
        (ids,) = self._require_cache()
        grad = np.zeros_like(self.params["weight"])
        np.add.at(grad, ids.reshape(-1), grad_out.reshape(-1, self.dim))  # repeated ids accumulate
        if self.padding_idx is not None:
            grad[self.padding_idx] = 0.0  # torch's padding_idx: [PAD] is never trained by lookups
        self.grads["weight"] = grad
        self.update(lr)


class LayerNorm(Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension.

    ``weight`` and ``bias`` are the gamma and beta of the paper (torch/HF names).
    """

    def __init__(self, dim: int, eps: float = 1e-12, *, dtype=np.float32) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.params["weight"] = np.ones(dim, dtype=dtype)
        self.params["bias"] = np.zeros(dim, dtype=dtype)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: (..., dim) -> same shape."""
        if x.shape[-1] != self.dim:
            raise ValueError(f"LayerNorm expects last dim {self.dim}, got input shape {x.shape}")
        mean = x.mean(axis=-1, keepdims=True)
        centred = x - mean
        var = (centred * centred).mean(axis=-1, keepdims=True)  # biased, as torch
        inv_std = 1.0 / np.sqrt(var + self.eps)
        x_hat = centred * inv_std
        self._cache = (x_hat, inv_std)
        return x_hat * self.params["weight"] + self.params["bias"]

    def backward(self, grad_out: np.ndarray, lr: float = 0.0) -> np.ndarray:
        x_hat, inv_std = self._require_cache()
        self.grads["weight"] = (grad_out * x_hat).reshape(-1, self.dim).sum(axis=0)
        self.grads["bias"] = grad_out.reshape(-1, self.dim).sum(axis=0)
        g_hat = grad_out * self.params["weight"]
        # d x_hat / d x removes the components along 1 (mean) and along x_hat (variance):
        # dx = inv_std * (g_hat - mean(g_hat) - x_hat * mean(g_hat * x_hat))
        grad_in = inv_std * (g_hat - g_hat.mean(axis=-1, keepdims=True)
                             - x_hat * (g_hat * x_hat).mean(axis=-1, keepdims=True))
        self.update(lr)
        return grad_in


class GELU(Module):
    """Exact GELU: x * Phi(x) with Phi the standard normal CDF (torch's default, HF "gelu")."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        cdf = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
        self._cache = (x, cdf)
        return x * cdf

    def backward(self, grad_out: np.ndarray, lr: float = 0.0) -> np.ndarray:
        x, cdf = self._require_cache()
        pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return grad_out * (cdf + x * pdf)  # product rule: d/dx [x Phi(x)] = Phi(x) + x phi(x)


class ReLU(Module):
    """max(0, x); the derivative at exactly 0 is taken as 0, as torch does."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._cache = (x > 0,)
        return np.where(x > 0, x, 0).astype(x.dtype, copy=False)

    def backward(self, grad_out: np.ndarray, lr: float = 0.0) -> np.ndarray:
        (positive,) = self._require_cache()
        return grad_out * positive


class Tanh(Module):
    """tanh(x); its derivative 1 - tanh^2 reuses the output, so only the output is cached."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        y = np.tanh(x)
        self._cache = (y,)
        return y

    def backward(self, grad_out: np.ndarray, lr: float = 0.0) -> np.ndarray:
        (y,) = self._require_cache()
        return grad_out * (1.0 - y * y)


ACTIVATIONS = {"gelu": GELU, "relu": ReLU}


def make_activation(name: str) -> Module:
    """Activation by its HF ``hidden_act`` name."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; valid: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()
