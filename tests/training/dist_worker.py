"""Worker processes for tests/test_distributed.py (a helper script, not a test module).

    torchrun --standalone --nproc_per_node=2 tests/training/dist_worker.py steps OUT_DIR [REF_CHECKPOINT]
    RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=... MASTER_PORT=... \
        python tests/training/dist_worker.py fault die|stall STEP pretrain --config run.yaml ...

`steps` trains the tiny model of `train_fixed` on fixed batches with DDP and with FSDP2 (each
rank takes its half of every global micro-batch), straight and resumed from REF_CHECKPOINT,
and with the bare model whose trainer all-reduces the gradients itself (each rank takes one of
the step's micro-batches); it records one epoch of the pretraining loader and of a streaming
dataset on each rank.
`fault` runs the `bert-kit` command line (pretrain or finetune) with rank 1 exiting (die) or
hanging (stall) at STEP; `skewed-clock OUT_DIR pretrain ...` runs it with rank 1's clock ahead.
The single-process side of each comparison calls the same functions inside pytest.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bert_kit.training.trainer import AMPTrainer, NonFiniteLossError  # noqa: E402
from bert_kit.training.checkpoint import collect_state, load_checkpoint, save_checkpoint, save_model  # noqa: E402
from bert_kit.config import BertConfig  # noqa: E402
from bert_kit.training.distributed import (all_gather_object, all_reduce_mean, barrier,  # noqa: E402
                                           broadcast_weights, init_distributed, is_main, rank, world_size,
                                           wrap_model)
from bert_kit.heads import BERTForPreTraining  # noqa: E402
from bert_kit.training.optim import create_optimizer, create_scheduler  # noqa: E402
from bert_kit.training.precision import resolve_precision  # noqa: E402

torch.set_num_threads(1)
VOCAB, LENGTH, GLOBAL_MICRO_BATCH, GRAD_ACCUM, STEPS, SAVE_AT = 40, 12, 8, 2, 20, 10
MASK_ID = 4


def tiny_model() -> BERTForPreTraining:
    """2 layers, hidden 16, dropout off: the same weights on every rank (seeded)."""
    torch.manual_seed(0)
    return BERTForPreTraining(BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=16,
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def global_batch(step: int, micro: int) -> dict[str, torch.Tensor]:
    """Micro-batch `micro` of optimizer step `step`: (8, 12) tensors. Every row has 3 masked
    tokens, so each rank's mean MLM loss over its rows averages to the mean over the whole batch."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    ids = torch.randint(5, VOCAB, (GLOBAL_MICRO_BATCH, LENGTH), generator=g)
    cols = torch.randperm(LENGTH - 2, generator=g)[:3] + 1  # not [CLS] (0) nor the last position
    labels = torch.full_like(ids, -100)
    labels[:, cols] = ids[:, cols]
    masked = ids.clone()
    masked[:, cols] = MASK_ID
    return {"input_ids": masked, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
            "labels": labels, "next_sentence_label": torch.randint(0, 2, (GLOBAL_MICRO_BATCH,), generator=g)}


def train_fixed(out: Path, parallel: str = "ddp", resume: Path | None = None) -> None:
    """Train STEPS optimizer steps of GRAD_ACCUM micro-batches on `global_batch`, this rank taking
    rows [rank * n, (rank + 1) * n) with n = 8 / world_size. parallel="own": the bare model on
    GRAD_ACCUM ranks, rank r taking micro-batch r whole (the trainer averages the gradients; rank 1
    starts from other weights, which rank 0's replace). Writes a checkpoint at SAVE_AT, out/final
    (the model) and out/result.json (loss per step, all-reduced; DDP all-reduce calls)."""
    model = tiny_model()
    own = parallel == "own"
    if own:
        assert world_size() == GRAD_ACCUM
        if rank() == 1:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
        broadcast_weights(model)
    wrapped = model if own else wrap_model(model, torch.device("cpu"), parallel)
    optimizer = create_optimizer(model, "adamw", lr=3e-3, weight_decay=0.01)
    scheduler = create_scheduler(optimizer, 2, STEPS)
    trainer = AMPTrainer(wrapped, optimizer, scheduler, resolve_precision("fp32", "cpu", verbose=False),
                         grad_accum=1 if own else GRAD_ACCUM, clip_grad=1.0)
    calls = [0]
    if parallel == "ddp" and world_size() > 1:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counting_hook(state, bucket):  # DDP's own all-reduce, counted
            calls[0] += 1
            return allreduce_hook(state, bucket)

        wrapped.register_comm_hook(None, counting_hook)
    start = 0
    if resume is not None:
        start = trainer.step = int(load_checkpoint(resume, model, optimizer=optimizer, scheduler=scheduler)["step"])
    n = GLOBAL_MICRO_BATCH // world_size()
    rows = slice(rank() * n, (rank() + 1) * n)
    losses = {}
    for step in range(start, STEPS):
        loss = 0.0
        if own:  # the loss is already the mean over the ranks
            loss = trainer.mlm_step(global_batch(step, rank()))
        for micro in range(0 if own else GRAD_ACCUM):
            trainer.mlm_step({k: v[rows] for k, v in global_batch(step, micro).items()})
            loss += trainer.last["loss"] / GRAD_ACCUM
        losses[step + 1] = all_reduce_mean(loss)
        if step + 1 == SAVE_AT:
            collected = collect_state(model, optimizer)  # every rank
            if is_main():
                save_checkpoint(out / "checkpoints", SAVE_AT, model, optimizer=optimizer, scheduler=scheduler,
                                collected=collected)
            barrier()
    collected = collect_state(model)
    if is_main():
        save_model(model, out / "final", collected.get("model"))
        (out / "result.json").write_text(json.dumps({"losses": losses, "allreduce_calls": calls[0],
                                                     "world_size": world_size()}))
    barrier()


def nonfinite_together(out: Path) -> None:
    """The bare model with its own reduction: rank 1 alone gets a NaN loss at step 3; every rank
    stops at that step with the same error (a rank that went on would wait for the others forever)."""
    model = tiny_model()
    optimizer = create_optimizer(model, "adamw", lr=3e-3)
    trainer = AMPTrainer(model, optimizer, None, resolve_precision("fp32", "cpu", verbose=False))
    stopped = None
    for step in range(5):
        batch = global_batch(step, rank())
        if step == 2 and rank() == 1:
            with torch.no_grad():
                model.bert.embeddings.word_embeddings.weight[batch["input_ids"][0, 0]] = float("nan")
        try:
            trainer.mlm_step(batch)
        except NonFiniteLossError as error:
            stopped = {"step": error.step, "message": str(error)}
            break
    results = all_gather_object(stopped)
    if is_main():
        (out / "nonfinite.json").write_text(json.dumps(results))


def loader_epoch(corpus: Path, batch_size: int) -> dict[str, list]:
    """One epoch of this rank's data: pretrain's training loader over 48 numbered examples
    (example i is [CLS] 100+i [SEP]; the list gives i per batch), and a streaming dataset."""
    from bert_kit.data.corpus import StreamingTextDataset
    from bert_kit.tasks.pretraining import PretrainConfig, make_loader

    tokenizer = SimpleNamespace(pad_token_id=0, mask_token_id=MASK_ID, vocab_size=1000,
                                special_token_ids=frozenset(range(5)))
    examples = [{"input_ids": torch.tensor([2, 100 + i, 3])} for i in range(48)]
    loader = make_loader(PretrainConfig(seed=3), examples, tokenizer, batch_size, True, torch.device("cpu"))
    batches = []
    for batch in loader:
        original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])  # undo the masking
        batches.append((original[:, 1] - 100).tolist())
    stream = StreamingTextDataset(corpus, mode="line", buffer_size=4, seed=1)  # rank from the process group
    return {"map": batches, "stream": list(stream)}


def steps(out: Path, reference: Path) -> None:
    init_distributed(timeout_s=60)
    for parallel in ("ddp", "fsdp"):
        train_fixed(out / parallel, parallel)
        train_fixed(out / f"{parallel}-resumed", parallel, resume=reference)
    train_fixed(out / "own", "own")
    nonfinite_together(out)
    epochs = all_gather_object(loader_epoch(out / "lines.txt", batch_size=3))
    if is_main():
        (out / "epochs.json").write_text(json.dumps(epochs))


def fault(kind: str, at_step: int, argv: list[str]) -> int:
    """The `bert-kit` command line; rank 1 exits at once (die) or hangs (stall) at `at_step`."""
    import bert_kit.training.loop
    from bert_kit.cli import main
    from bert_kit.training.progress import ProgressLogger

    class Faulty(ProgressLogger):
        def update(self, step: int, **postfix) -> None:
            super().update(step, **postfix)
            if step == at_step and rank() == 1:
                print(f"rank 1: {kind} at step {step}", file=sys.stderr, flush=True)
                if kind == "die":
                    os._exit(3)  # no cleanup, no goodbye: as a crash or an OOM kill
                time.sleep(600)

    bert_kit.training.loop.ProgressLogger = Faulty
    return main(argv)


def skewed_clock(out: Path, argv: list[str]) -> int:
    """The `bert-kit` command line with rank 1's run clock started 3 s before rank 0's; each rank
    writes the learning rates it applied to OUT/lrs-rank{N}.json. The loop runs on a fake clock
    that a step advances by 0.25 s, so the run is the same on a fast machine and a busy one."""
    import bert_kit.cli as cli
    import bert_kit.training.clock as run_clock
    import bert_kit.training.loop as loop
    from tests.fake_clock import FakeClock
    from bert_kit.training.optim import Schedule

    start_run, apply, lrs = loop.start_run, Schedule.apply, []
    clock = FakeClock()
    cli.time = run_clock.time = SimpleNamespace(time=clock.time)  # the command's start, and the loop's clock

    def skewed(*args, **kwargs):
        run = start_run(*args, **kwargs)
        if rank() == 1:
            run.started -= 3.0
        return run

    def recorded(self, *args, **kwargs):
        clock.sleep(0.25)  # the step this lr is for
        lrs.append(apply(self, *args, **kwargs))
        return lrs[-1]

    loop.start_run, Schedule.apply = skewed, recorded
    code = cli.main(argv)
    (out / f"lrs-rank{os.environ['RANK']}.json").write_text(json.dumps(lrs))  # the group is gone by now
    return code


if __name__ == "__main__":
    if sys.argv[1] == "steps":
        steps(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1] == "fault":
        sys.exit(fault(sys.argv[2], int(sys.argv[3]), sys.argv[4:]))
    elif sys.argv[1] == "skewed-clock":
        sys.exit(skewed_clock(Path(sys.argv[2]), sys.argv[3:]))
    else:
        raise SystemExit(f"unknown scenario {sys.argv[1]!r}; expected steps, fault or skewed-clock")
