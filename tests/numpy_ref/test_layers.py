"""Primitive layers of the NumPy engine: finite-difference gradient checks in float64, the SGD
contract of ``backward(grad, lr)`` and numerical edge cases.

Run: .venv/bin/python -m pytest tests/numpy_ref/test_layers.py -q
"""

import numpy as np
import pytest
import torch

from bert_kit.numpy_ref.gradcheck import check_layer, relative_error
from bert_kit.numpy_ref.layers import GELU, Embedding, LayerNorm, Linear, ReLU, Tanh, make_activation, softmax

F64 = np.float64
TOL = 1e-6  # relative error allowed between analytic and finite-difference gradients


def assert_all_small(errors: dict[str, float], tol: float = TOL) -> None:
    bad = {name: err for name, err in errors.items() if not err < tol}
    assert not bad, f"gradient check failed: {bad}"


def test_linear_gradients_and_torch_layout():
    rng = np.random.default_rng(0)
    layer = Linear(5, 3, dtype=F64, rng=rng)
    layer.params["bias"][:] = rng.standard_normal(3)
    x = rng.standard_normal((2, 4, 5))
    errors = check_layer(layer, x, entries=15)
    assert set(errors) == {"weight", "bias", "input"}
    assert_all_small(errors)
    # Same numbers as torch's Linear with the same (out, in) weight.
    ref = torch.nn.functional.linear(torch.tensor(x), torch.tensor(layer.params["weight"]),
                                     torch.tensor(layer.params["bias"]))
    torch.testing.assert_close(torch.tensor(layer.forward(x)), ref, rtol=0, atol=1e-14)


def test_layernorm_gradients_and_values():
    rng = np.random.default_rng(1)
    layer = LayerNorm(6, eps=1e-12, dtype=F64)
    layer.params["weight"][:] = rng.standard_normal(6)
    layer.params["bias"][:] = rng.standard_normal(6)
    x = rng.standard_normal((3, 4, 6)) * 3 + 1
    assert_all_small(check_layer(layer, x, entries=20))
    ref = torch.nn.functional.layer_norm(torch.tensor(x), (6,), torch.tensor(layer.params["weight"]),
                                         torch.tensor(layer.params["bias"]), eps=1e-12)
    torch.testing.assert_close(torch.tensor(layer.forward(x)), ref, rtol=0, atol=1e-13)


@pytest.mark.parametrize("cls", [GELU, Tanh])
def test_smooth_activation_gradients(cls):
    x = np.random.default_rng(2).standard_normal((4, 7)) * 2
    assert_all_small(check_layer(cls(), x, entries=20))


def test_relu_gradients_away_from_the_kink():
    x = np.random.default_rng(3).standard_normal((4, 7))
    x[np.abs(x) < 0.1] = 0.5  # finite differences are meaningless within eps of 0
    assert_all_small(check_layer(ReLU(), x, entries=20))


def test_gelu_is_exact_erf_form():
    x = np.linspace(-6, 6, 101)
    torch.testing.assert_close(torch.tensor(GELU().forward(x)),
                               torch.nn.functional.gelu(torch.tensor(x), approximate="none"), rtol=0, atol=1e-15)


def test_embedding_gradient_accumulates_repeated_ids():
    rng = np.random.default_rng(4)
    table = Embedding(7, 3, dtype=F64, rng=rng)
    ids = np.array([[1, 2, 1], [6, 1, 0]])
    errors = check_layer(table, ids, input_is_differentiable=False, entries=21)
    assert_all_small(errors)
    table.forward(ids)
    table.backward(np.ones((2, 3, 3)))
    np.testing.assert_array_equal(table.grads["weight"][:, 0], [1, 3, 1, 0, 0, 0, 1])


def test_embedding_padding_row_starts_at_zero_and_gets_no_lookup_gradient():
    table = Embedding(5, 4, padding_idx=0, dtype=F64, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(table.params["weight"][0], 0.0)
    table.forward(np.array([[0, 0, 3]]))
    table.backward(np.ones((1, 3, 4)))
    np.testing.assert_array_equal(table.grads["weight"][0], 0.0)  # as torch's padding_idx
    np.testing.assert_array_equal(table.grads["weight"][3], 1.0)


def test_backward_with_lr_zero_keeps_weights_and_lr_applies_sgd():
    rng = np.random.default_rng(6)
    layer = Linear(4, 3, dtype=F64, rng=rng)
    before = {k: v.copy() for k, v in layer.params.items()}
    x, g = rng.standard_normal((5, 4)), rng.standard_normal((5, 3))
    layer.forward(x)
    grad_in_0 = layer.backward(g, 0.0)
    for name in before:
        np.testing.assert_array_equal(layer.params[name], before[name])
    layer.forward(x)
    grad_in_1 = layer.backward(g, 0.25)
    for name in before:
        np.testing.assert_allclose(layer.params[name], before[name] - 0.25 * layer.grads[name], rtol=0, atol=1e-15)
    # The input gradient uses the weights of the forward pass, not the updated ones.
    np.testing.assert_allclose(grad_in_1, grad_in_0, rtol=0, atol=1e-15)


def test_softmax_is_stable_for_huge_scores():
    scores = np.array([[1000.0, 1000.0, -1000.0], [-1e30, 0.0, 1e30]])
    probs = softmax(scores)
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs, [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], atol=1e-15)


def test_relative_error_flags_a_wrong_gradient():
    # Guard against a checker that always passes.
    assert relative_error(np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-3])) < 1e-3
    assert relative_error(np.array([1.0, 2.0]), np.array([1.0, -2.0])) > 0.5


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match=r"last dim 4.*\(2, 5\)"):
        Linear(4, 3).forward(np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match="last dim 4"):
        LayerNorm(4).forward(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        make_activation("swish")
    with pytest.raises(RuntimeError, match="before forward"):
        Linear(2, 2).backward(np.zeros((1, 2)))
