"""The JAX model's kernels, put on a model by one explicit call (`fast_path.apply`).

`bert_kit/jax/model.py` is the reference: attention and each block's add & norm spelled out in
XLA. `fast_path.plan` decides (a pure function of the backend, dtype, head size and job) and
`fast_path.apply` puts the fused kernels on the model: on every attention layer cuDNN's flash
attention where there is no dropout (evaluation, or no attention dropout) and
`flash_attention.py`'s Pallas kernel, attention fused with its dropout, where there is; on every
block, in training, `residual_norm.py`'s Pallas kernel, the residual, its dropout and LayerNorm in
one pass. Each computes the reference's function; the run prints what it applied.
"""
