"""GradCache: a loss of embeddings over a batch far larger than the device can embed at once,
with the gradients the whole batch would give (Gao et al., 2021; sentence-transformers'
`CachedMultipleNegativesRankingLoss`).

A contrastive loss couples every row of the batch to every other, so the batch cannot simply be
split into accumulated micro-batches. But the loss reads the model only through the vectors
E (N, H), so dL/dtheta = sum_i (dL/dE_i) dE_i/dtheta, and the two factors can be computed apart:

    1. embed the batch mini-batch by mini-batch without autograd: only E (N x H floats) is kept,
       with each mini-batch's RNG state;
    2. L = loss(E) and G = dL/dE (and dL/d scale, for a learned scale), on the vectors alone;
    3. when the trainer calls backward: embed each mini-batch again with autograd, its RNG state
       replayed (the same dropout masks), and backpropagate <E_mb, G_mb> through it.

Only one mini-batch's activations are alive at a time: a batch of 4,096 pairs trains in the memory
of the mini-batch (`mini_batch_size` rows), for a second forward pass. Step 3 runs from a hook on
the loss that `cached_loss` returns, so the training loop's own `loss.backward()` (with its loss
scale and gradient-accumulation factor, which reach the hook as its incoming gradient) drives it:
the loss is a drop-in replacement. Under DDP the weight gradients are all-reduced once, after the
last mini-batch (the others run in `no_sync`).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
import torch.nn as nn

from bert_kit.training.distributed import no_sync


class RandomState:
    """The CPU generator's state and `device`'s (a GPU's) now; `replay()` runs a block from them
    again (dropout draws the same masks), then puts the generators back where they were."""

    def __init__(self, device: torch.device) -> None:
        self.cpu = torch.get_rng_state()
        self.devices = [device] if device.type == "cuda" else []
        self.states = [torch.cuda.get_rng_state(d) for d in self.devices]

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu)
            for device, state in zip(self.devices, self.states):
                torch.cuda.set_rng_state(state, device)
            yield


def cached_loss(embed: Callable[[int], torch.Tensor], chunks: int,
                loss: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor], device: torch.device,
                scale: nn.Parameter | None = None, model: nn.Module | None = None) -> torch.Tensor:
    """The 0-d loss of a batch embedded in `chunks` mini-batches (see the module docstring).

    embed(i): the vectors (n_i, H) of mini-batch i, computed by the model (called twice each, the
        second time with autograd, from the backward pass);
    loss(vectors, scale): the 0-d loss of the whole batch's vectors (N, H) in mini-batch order;
        scale: the learned `scale` parameter it reads, or None;
    device: where the model runs (its random generator is replayed);
    model: the model as the trainer holds it: a DDP wrapper all-reduces the gradients once, after
        the last mini-batch.
    With autograd off (an evaluation) this is loss(vectors) of the mini-batches, nothing cached."""
    states, parts = [], []
    with torch.no_grad():
        for i in range(chunks):
            states.append(RandomState(torch.device(device)))
            parts.append(embed(i))
    vectors = torch.cat(parts)
    if not torch.is_grad_enabled():
        return loss(vectors, scale)
    kind = vectors.device.type
    autocast = torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)  # the replay's, as here
    # step 2: the loss and its gradient with respect to the vectors (and the scale) alone
    leaves = [vectors.detach().float().requires_grad_()]
    if scale is not None:
        leaves.append(scale.detach().requires_grad_())
    with torch.enable_grad():
        value = loss(leaves[0], leaves[1] if scale is not None else None)
        grads = torch.autograd.grad(value, leaves)
    cached = grads[0].split([len(p) for p in parts])
    out = value.detach().requires_grad_()

    def replay(grad_output: torch.Tensor) -> None:
        """Step 3, from the trainer's backward: grad_output is d(its loss)/d(this loss), loss scale
        and 1/grad_accum included."""
        for i, (state, grad) in enumerate(zip(states, cached)):
            last = i == chunks - 1
            with no_sync(model, skip=model is not None and not last), torch.enable_grad(), state.replay(), \
                    torch.autocast(kind, autocast[1], enabled=autocast[0]):
                part = embed(i)
                surrogate = (part.float() * grad).sum()
                if last and scale is not None:  # the scale's gradient joins the last backward (DDP reduces it then)
                    surrogate = surrogate + (scale * grads[1]).sum()
                (surrogate * grad_output).backward()

    out.register_hook(replay)
    return out
