"""The JAX model's kernels, put on a model by one explicit call (`fast_path.apply`).

`bert_kit/jax/model.py` is the reference: attention spelled out in XLA. `fast_path.plan` decides
(a pure function of the backend, dtype, head size and job) and `fast_path.apply` puts the fused
attention on every attention layer: cuDNN's flash attention where there is no dropout (evaluation,
or no attention dropout), and `flash_attention.py`'s Pallas kernel, attention fused with its
dropout, where there is. Both compute the reference's function; the run prints what it applied.
"""
