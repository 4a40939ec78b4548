"""The fast path: what runs instead of `bert_kit/model.py`'s plain PyTorch where a device and a job allow.

- `fast_path.py`: `apply(model, device, training=..., ...)`, the one call that puts the rest on a
  model and says which parts it put on (read it first);
- `packing.py`: packed ("unpadded") batches: `Packed`, `unpad`, `pad`;
- `attention.py`: attention on CUDA (SDPA's masked kernels chosen per use, flash varlen attention);
- `window_attention.py`: ModernBERT's attention on packed batches with its sliding window (flash
  varlen, FlexAttention), and its encoder running padded calls packed;
- `rotary_attention.py`: ModernBERT's rotations in Triton, and at T <= 128 its attention with them
  (kernels in `rotary_attention_triton.py`, imported only for a CUDA run);
- `geglu.py`: ModernBERT's gated activation in one Triton kernel each way (`geglu_triton.py`, likewise);
- `short_attention.py`, `fused_backward.py`, `dropout.py`: Triton kernels for compiled training on
  CUDA, each beside its `*_triton.py` (imported only for such a run);
- `residual.py`, `padded_decoder.py`: a 16-bit residual stream, the MLM decoder on a padded vocabulary.

Importing the package imports none of them.
"""
