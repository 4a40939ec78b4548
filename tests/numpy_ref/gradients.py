"""Helpers for the finite-difference gradient checks of the NumPy engine's layers."""

import numpy as np

TOL = 1e-6  # relative error allowed between analytic and finite-difference gradients


def randomise(module, seed: int, scale: float = 0.3) -> None:
    """Move every parameter off its init (biases 0, LayerNorm 1) so no gradient term hides."""
    rng = np.random.default_rng(seed)
    for _, param in module.named_parameters():
        param += rng.standard_normal(param.shape) * scale


def assert_all_small(errors: dict[str, float], expected: set[str]) -> None:
    """Every expected tensor was checked and each relative error is below TOL."""
    assert set(errors) == expected, f"checked {sorted(errors)}, expected {sorted(expected)}"
    bad = {name: err for name, err in errors.items() if not err < TOL}
    assert not bad, f"gradient check failed: {bad}"
