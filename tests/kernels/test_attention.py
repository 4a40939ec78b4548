"""bert_kit.kernels.attention: SDPA's masked kernels chosen per use, the 64 mod 128 padding, and
`CudaAttention` (varlen attention for packed batches) against the reference model's attention.

Run: .venv/bin/python -m pytest tests/kernels/test_attention.py -q
"""

import pytest
import torch
from torch.testing import assert_close

from bert_kit.config import BertConfig
from bert_kit.kernels.attention import CudaAttention, masked_attention, padded_to_128, varlen_attention
from bert_kit.kernels.packing import Packed, packed_attention
from bert_kit.model import MultiHeadAttention


def test_cuda_attention_keeps_the_parameters_and_gives_the_reference_numbers_off_cuda():
    """Swapped onto a CPU module, `CudaAttention` falls back to SDPA (padded) and to the padded
    per-sequence SDPA (packed): the reference's outputs, same state dict."""
    torch.manual_seed(0)
    reference = MultiHeadAttention(BertConfig(hidden_size=32, num_attention_heads=4)).eval()
    fast = MultiHeadAttention(BertConfig(hidden_size=32, num_attention_heads=4)).eval()
    fast.load_state_dict(reference.state_dict())
    fast.__class__ = CudaAttention
    assert list(fast.state_dict()) == list(reference.state_dict())
    x = torch.randn(3, 10, 32)
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, 6:], mask[2, 2:] = False, False
    with torch.no_grad():
        assert_close(fast(x, mask[:, None, None, :]), reference(x, mask[:, None, None, :]), rtol=0, atol=0)
        layout = Packed.from_mask(mask)
        tokens = x.flatten(0, 1)[layout.indices]  # (N, H)
        assert_close(fast(tokens, packed=layout), reference(tokens, packed=layout), rtol=0, atol=0)
        # and the packed result is the padded one at every real token
        assert_close(fast(tokens, packed=layout), reference(x, mask[:, None, None, :])[mask], rtol=1e-6, atol=1e-6)


def test_packed_attention_keeps_each_sequence_to_itself():
    """`packing.packed_attention` (the reference of the varlen kernel) over two sequences equals
    SDPA over each alone; `varlen_attention` off CUDA is the same call."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(9, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))  # (N, nh, hd)
    layout = Packed(torch.tensor([0, 4, 9], dtype=torch.int32), 5)
    out = packed_attention(q, k, v, layout)
    for a, b in ((0, 4), (4, 9)):
        alone = torch.nn.functional.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v)))
        assert_close(out[a:b], alone.transpose(0, 1), rtol=0, atol=1e-12)
    assert_close(varlen_attention(q, k, v, layout), out, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_masked_attention_on_cuda_leaves_cudnn_out(monkeypatch):
    """A padding mask at inference on CUDA: cuDNN's kernel is off for that call (it would set up a
    plan for every new batch shape); unmasked calls keep the default choice, and masked calls that
    need gradients take cuDNN's or the math kernel (the memory-efficient one's backward gave NaN);
    the numbers are attention's."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    seen, sdpa = [], F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((kwargs.get("attn_mask") is not None, torch.backends.cuda.cudnn_sdp_enabled()))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q, k, v = torch.randn(3, 2, 4, 24, 32, device="cuda", dtype=torch.bfloat16)
    mask = torch.ones(2, 1, 1, 24, dtype=torch.bool, device="cuda")
    mask[1, ..., 17:] = False
    out = masked_attention(q, k, v, mask)
    masked_attention(q, k, v, None)
    masked_attention(q.detach().clone().requires_grad_(), k, v, mask)
    default = torch.backends.cuda.cudnn_sdp_enabled()
    assert seen == [(True, False), (False, default), (True, True)]
    with sdpa_kernel(SDPBackend.MATH):
        reference = sdpa(q.float(), k.float(), v.float(), attn_mask=mask)
    assert_close(out.float(), reference, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("mask_rows", [1, 64])
def test_padded_to_128_gives_the_unpadded_attention_and_gradients(mask_rows):
    """The 64 mod 128 lengths that cuDNN's backward gets wrong are padded to 128 in training: the
    extra keys are masked and the extra queries dropped, so output and gradients do not change."""
    import torch.nn.functional as F

    def attention(q, k, v, mask, p):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 32, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 1, mask_rows, 64, dtype=torch.bool)
    mask[1, ..., 40:] = False
    out = attention(q, k, v, mask, 0.0)
    padded = padded_to_128(attention, q, k, v, mask)
    assert padded.shape == out.shape
    assert_close(padded, out, atol=1e-12, rtol=0)
    probe = torch.randn(out.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad((out * probe).sum(), (q, k, v)),
                    torch.autograd.grad((padded * probe).sum(), (q, k, v))):
        assert_close(b, a, atol=1e-12, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("length", [64, 192, 96])
def test_masked_attention_gradients_stay_finite_at_very_negative_logsumexp(length):
    """pytorch/pytorch#196678: cuDNN's backward returned NaN dQ at lengths 64 mod 128 with a mask
    when a query row's logsumexp is below -88.7, as in a bert-small pretrained for 6 minutes on the
    shared corpus (-179; its fine-tuning skipped a third of its steps). Gradients here match
    the math kernel's, with and without attention dropout."""
    import math

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, length, 64, device="cuda", generator=g) * 0.1 for _ in range(3))
    q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(64)  # every logit about -120
    q, k, v = (t.bfloat16().requires_grad_() for t in (q, k, v))
    mask = torch.ones(2, 1, 1, length, dtype=torch.bool, device="cuda")
    mask[1, ..., length - 20:] = False
    probe = torch.randn(2, 4, length, 64, device="cuda", generator=g).bfloat16()
    ours = torch.autograd.grad((masked_attention(q, k, v, mask) * probe).sum(), (q, k, v))
    exact = [t.detach().float().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):  # fp32: bf16 cannot hold logits near -120 to better than 0.5
        reference = torch.autograd.grad(
            (F.scaled_dot_product_attention(*exact, attn_mask=mask) * probe.float()).sum(), exact)
    for a in ours:
        assert torch.isfinite(a).all()
    # dQ's first component is a sum that is exactly 0 times the key's -960: rounding noise, not compared
    for a, b in zip((ours[0][..., 1:], ours[1], ours[2]), (reference[0][..., 1:], reference[1], reference[2])):
        assert (a.float() - b).norm() <= 0.02 * b.norm()
    dropped = torch.autograd.grad((masked_attention(q, k, v, mask, 0.1) * probe).sum(), (q, k, v))
    assert all(torch.isfinite(t).all() for t in dropped)
