"""bert_kit.kernels.dropout: F.dropout on the CPU; on CUDA under torch.compile a Triton mask of 16-bit draws.

Run: .venv/bin/python -m pytest tests/kernels/test_dropout.py -q (the mask needs CUDA and Triton)
"""

import pytest
import torch

from bert_kit.kernels import dropout as bk_dropout
from bert_kit.kernels.dropout import MaskDropout as Dropout

cuda = pytest.mark.skipif(not torch.cuda.is_available() or bk_dropout.dropout_mask is None,
                          reason="needs CUDA and Triton")


def test_dropout_on_cpu_is_torch_dropout():
    x = torch.randn(64, 96)
    torch.manual_seed(3)
    ours = Dropout(0.25)(x)
    torch.manual_seed(3)
    ref = torch.nn.functional.dropout(x, 0.25, training=True)
    assert torch.equal(ours, ref)
    d = Dropout(0.25).eval()
    assert d(x) is x
    assert torch.equal(Dropout(1.0)(x), torch.zeros_like(x))


def test_dropout_rejects_bad_probability():
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.5)


@cuda
@pytest.mark.parametrize("n", [1, 8191, 8192, 1_000_003])
def test_triton_mask_keeps_the_right_share_and_covers_every_element(n):
    p = 0.1
    seed = torch.tensor([12345], device="cuda")
    mask = bk_dropout.dropout_mask(seed, [n], p)
    assert mask.dtype == torch.bool and mask.shape == (n,)
    assert torch.equal(mask, bk_dropout.dropout_mask(seed, [n], p))  # same seed, same mask
    if n >= 8192:
        keep = mask.float().mean().item()
        sd = (0.9 * 0.1 / n) ** 0.5
        assert abs(keep - (1 - round(p * 65536) / 65536)) < 5 * sd
        other = bk_dropout.dropout_mask(seed + 1, [n], p)
        assert (mask != other).float().mean().item() > 0.1  # another seed, another mask
    if n > 100_000:  # no structure between neighbours or the 8 draws of one Philox call (10 sd)
        m = mask.float()
        assert abs(torch.corrcoef(torch.stack([m[:-1], m[1:]]))[0, 1].item()) < 0.01


@cuda
def test_compiled_dropout_uses_the_mask_and_scales_gradients():
    d = Dropout(0.2).cuda()
    x = torch.randn(256, 768, device="cuda", requires_grad=True)
    y = torch.compile(d)(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.8) < 0.01
    torch.testing.assert_close(y[kept], x[kept] / 0.8)
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / 0.8)
