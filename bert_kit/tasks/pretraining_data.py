"""Pretraining data setup: the tokenizer, the corpus, and resumable loaders for each phase.

Three ways from text files to masked batches, chosen by `PretrainConfig`:

* `nsp: true`: documents are split into sentences and tokenised once into an on-disk sentence
  cache (reused by later runs), then paired as BERT did (`NSPDataset`); held-out documents
  come from `eval_files` or the corpus tail (`eval_fraction`).
* `nsp: false`: the corpus is tokenised once into an on-disk `TokenCache` (reused by later runs)
  and packed into full-length blocks (`packing: true`) or truncated per document.
* `streaming: true` (MLM only): nothing is read up front. `StreamingTextDataset` reads the
  training files lazily, shuffles documents through a seeded buffer of `shuffle_buffer`,
  shards them by rank and DataLoader worker and tokenises on the fly (truncated, or packed);
  `StreamingDataLoader` masks the batches. Memory holds the buffer, not the corpus. Each epoch
  restarts the stream with a new shuffle order. Evaluation streams `eval_files` in file order;
  every rank evaluates the same sequences, which keeps sharded (FSDP2) ranks in step.

Resuming. Map-style loaders continue at the saved (epoch, batch index), rescaled when the
number of ranks changed. A stream's position is the number of examples each rank consumed in
the epoch (per DataLoader worker): the resumed stream skips exactly those. The shuffle buffer's
order depends only on (seed, epoch, shard), so with the same seed, ranks and workers the resumed
run sees the same examples, in the same order and with the same masks, as an uninterrupted one.
With other ranks or workers the shards differ; each new shard then skips an equal share of what
was consumed, which resumes at the same point of the epoch but not with the same examples.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Subset

from bert_kit.training.checkpoint import resume_position
from bert_kit.training.distributed import all_gather_object, barrier, is_main, rank, world_size

if TYPE_CHECKING:
    from bert_kit.tasks.pretraining_config import Phase, PretrainConfig

# corpus_format -> mode of bert_kit.data.corpus.read_documents
CORPUS_MODES = {"text": "blank_line", "lines": "line", "jsonl": "jsonl", "wikitext": "wikitext"}


def prepare_tokenizer(cfg: PretrainConfig, out: Path, checkpoint: Path | None) -> Any:
    """The run's tokenizer: from the checkpoint being resumed, a folder, or trained on the corpus."""
    from bert_kit.data.corpus import iter_documents
    from bert_kit.tokenizer import get_tokenizer
    from bert_kit.tokenizer_training import train_tokenizer

    if checkpoint is not None and (checkpoint / "tokenizer.json").is_file():
        return get_tokenizer(checkpoint)
    if cfg.tokenizer:
        return get_tokenizer(cfg.tokenizer)
    if cfg.train_tokenizer is not None:
        folder = out / "tokenizer"
        if is_main():
            opts = {"min_frequency": 2, **cfg.train_tokenizer}
            print(f"training a WordPiece tokenizer on {cfg.train_files} ({opts})", flush=True)
            texts = iter_documents(cfg.train_files, CORPUS_MODES[cfg.corpus_format], cfg.text_field, cfg.encoding)
            train_tokenizer(texts=texts, **opts).save(folder)
        barrier()
        return get_tokenizer(folder)
    if isinstance(cfg.model, str):
        from bert_kit.model_folder import locate_model

        kind, where = locate_model(cfg.model, presets_first=True)  # a hub name: its local copy
        if kind == "folder":
            return get_tokenizer(where)
    raise ValueError("no tokenizer: set `tokenizer: FOLDER` or `train_tokenizer: {vocab_size: N}`")


def load_corpus(cfg: PretrainConfig, tokenizer: Any, out: Path) -> dict[str, Any]:
    """Tokenise the corpus once into on-disk caches that later runs reuse. NSP: sentence caches,
    returned as lists of tokenised sentences per document (train and eval split by document);
    MLM only: TokenCaches (the eval split happens later);
    streaming: only the resolved file lists (the loaders read them lazily)."""
    from bert_kit.data.corpus import resolve_files
    from bert_kit.data.token_cache import tokenize_to_cache

    if not cfg.train_files:
        raise ValueError("train_files is empty: name the training text files")
    if cfg.streaming:
        return {"streaming": True, "train": resolve_files(cfg.train_files), "eval": resolve_files(cfg.eval_files)}
    cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else out / "token_cache"
    mode = CORPUS_MODES[cfg.corpus_format]

    def cache(files: list[str], sentences: bool = False) -> Any:
        try:
            if is_main():  # one process tokenises; the others then load the finished cache
                tokenize_to_cache(files, tokenizer, cache_dir, mode, cfg.text_field, sentences=sentences,
                                  encoding=cfg.encoding)
            barrier()
            result = tokenize_to_cache(files, tokenizer, cache_dir, mode, cfg.text_field, progress=False,
                                       sentences=sentences, encoding=cfg.encoding)
        except UnicodeDecodeError as e:
            raise ValueError(f"{files}: not UTF-8 text (byte {e.start}: {e.reason})") from None
        if result.num_tokens == 0:
            raise ValueError(f"no text in {files} (corpus_format={cfg.corpus_format})")
        return result

    if cfg.nsp:
        # sentence caches: documents -> sentences -> ids, tokenised once and reused by later runs
        train = cache(cfg.train_files, sentences=True).sentence_documents()
        evals = cache(cfg.eval_files, sentences=True).sentence_documents() if cfg.eval_files else None
        if evals is None and cfg.eval_fraction > 0:
            k = max(2, math.ceil(cfg.eval_fraction * len(train)))  # NSP pairs need two documents
            if len(train) - k < 2:
                raise ValueError(f"{cfg.train_files}: {len(train)} documents are too few to hold out "
                                 f"{k} for evaluation with NSP; set eval_files, eval_fraction=0 or nsp=false")
            train, evals = train[:-k], train[-k:]
        return {"train": train, "eval": evals}
    return {"train": cache(cfg.train_files), "eval": cache(cfg.eval_files) if cfg.eval_files else None}


def make_datasets(cfg: PretrainConfig, corpus: dict, tokenizer: Any, max_length: int) -> tuple[Any, Any]:
    """(train, eval or None) datasets for one sequence length."""
    from bert_kit.data.corpus import StreamingTextDataset
    from bert_kit.data.pretraining import MLMDataset, NSPDataset, PackedDataset

    if corpus.get("streaming"):
        def stream(files: list[Path], train: bool) -> StreamingTextDataset:
            # eval: file order, and the whole stream on every rank
            return StreamingTextDataset(files, tokenizer, max_length, CORPUS_MODES[cfg.corpus_format],
                                        cfg.text_field, cfg.shuffle_buffer, shuffle=train, seed=cfg.seed,
                                        rank=rank() if train else 0, world_size=world_size() if train else 1,
                                        packing=cfg.packing, encoding=cfg.encoding)

        return stream(corpus["train"], True), stream(corpus["eval"], False)

    def build(source: Any) -> Any:
        if cfg.nsp:
            return NSPDataset(source, tokenizer, max_length, seed=cfg.seed, short_seq_prob=cfg.short_seq_prob)
        if cfg.packing:
            return PackedDataset(source, max_length, tokenizer=tokenizer)
        return MLMDataset([source.document(i) for i in range(source.num_documents)], tokenizer, max_length)

    train = build(corpus["train"])
    evals = build(corpus["eval"]) if corpus["eval"] is not None else None
    if evals is None and not cfg.nsp and cfg.eval_fraction > 0 and len(train) >= 2:
        k = max(1, math.ceil(cfg.eval_fraction * len(train)))  # the tail of the corpus
        train, evals = Subset(train, range(len(train) - k)), Subset(train, range(len(train) - k, len(train)))
    return train, evals


def prediction_slots(cfg: PretrainConfig) -> float | None:
    """Share of a batch's tokens given fixed MLM prediction slots, or None: a model compiled whole
    (heads and loss) takes static shapes. A few more slots than the masking rate fills, so in
    practice never exceeded, never a new shape."""
    sharded = cfg.parallel == "fsdp" and world_size() > 1
    return cfg.mask_probability + 0.05 if cfg.compile and not sharded and cfg.engine == "torch" else None


def row_slots(cfg: PretrainConfig, max_length: int) -> int:
    """MLM prediction slots per row for the JAX engine, whose head predicts at (B, P) fixed slots:
    the masking rate's mean plus 3 standard deviations of a row's count, in multiples of 8 (at 15%
    of 128 tokens: 32, where a row holds 19 on average; rows over it, about 1 in 1,000, are cut
    to it by the masking, as Google's max_predictions_per_seq did)."""
    p = cfg.mask_probability
    mean, spread = p * max_length, 3 * math.sqrt(max_length * p * (1 - p))
    return min(max_length, -(-math.ceil(mean + spread) // 8) * 8)


def make_loader(cfg: PretrainConfig, dataset: Any, tokenizer: Any, batch_size: int, train: bool,
                device: torch.device, max_length: int | None = None) -> Any:
    """A resumable loader: shuffled order and masks are functions of (seed, epoch, batch index).
    A `StreamingTextDataset` gets a `StreamingDataLoader`, anything else a `ResumableDataLoader`."""
    from bert_kit.data.corpus import StreamingTextDataset
    from bert_kit.data.masking import DataCollatorForMLM, row_prediction_slots
    from bert_kit.data.pretraining import DistributedResumableSampler, ResumableDataLoader, StreamingDataLoader
    from bert_kit.heads import with_prediction_slots

    seed = cfg.seed if train else cfg.seed + 1
    streamed = isinstance(dataset, StreamingTextDataset)
    # masks: a stream per rank (rank 0's is the single-process one), but one for a streamed eval,
    # which every rank runs whole; multiples of 8 suit tensor cores
    mask_seed = seed if streamed and not train else seed + 1_000_003 * rank()
    # a compiled model (and the JAX engine's step) takes one static shape: every batch padded to max_length
    max_length = max_length or cfg.max_length
    pad_to = max_length if cfg.compile or cfg.engine == "jax" else 8
    # training batches get their prediction slots in the loader's workers: gathering them took
    # ~7 ms a step of the training process, about a small model's whole GPU step
    slots = prediction_slots(cfg) if train else None
    postprocess = functools.partial(with_prediction_slots, share=slots) if slots else None
    cap = None
    if cfg.engine == "jax":  # per-row slots, the training and the evaluation batches alike
        cap = row_slots(cfg, max_length)
        postprocess = functools.partial(row_prediction_slots, slots=cap)
    collator = DataCollatorForMLM(tokenizer, cfg.mask_probability, cfg.whole_word_masking,
                                  pad_to_multiple_of=pad_to, seed=mask_seed, segment_pairs=cfg.segment_pairs,
                                  postprocess=postprocess, max_predictions=cap)
    if streamed:
        return StreamingDataLoader(dataset, collator, batch_size, cfg.num_workers, device.type == "cuda", seed)
    # one shuffled order shared by all ranks, each taking every world_size-th example of it
    sampler = DistributedResumableSampler(len(dataset), shuffle=train, seed=seed, rank=rank(),
                                          world_size=world_size(), drop_last=train)
    if len(sampler) == 0:
        kind = "training" if train else "evaluation"
        raise ValueError(f"no {kind} sequences for {world_size()} process(es); add text")
    # a tiny corpus (fewer sequences than a batch) still trains: every step then sees all of it
    drop_last = train and len(sampler) >= batch_size
    # an own generator: creating an iterator then never draws from the global RNG (dropout),
    # which keeps a resumed run on the exact random stream of an uninterrupted one
    return ResumableDataLoader(dataset, sampler, batch_size=batch_size, collate_fn=collator,
                               num_workers=cfg.num_workers, drop_last=drop_last, pin_memory=device.type == "cuda",
                               generator=torch.Generator().manual_seed(seed), start_next_epoch_early=train)


def forever(loader: Any):
    """Batches across epochs; the loader moves to the next epoch by itself."""
    while True:
        yield from loader


def phase_loaders(cfg: PretrainConfig, corpus: dict, tokenizer: Any, phase: Phase, device: torch.device,
                  data: dict | None = None) -> tuple[Any, Any, str]:
    """(train loader, eval loader or None, a line describing them) for one phase.

    data: the data state of the checkpoint being resumed (`loader_state`); when it belongs to
    this phase, the train loader continues where that run stopped.
    """
    train_ds, eval_ds = make_datasets(cfg, corpus, tokenizer, phase.max_length)
    loader = make_loader(cfg, train_ds, tokenizer, phase.batch_size, True, device, phase.max_length)
    eval_loader = (make_loader(cfg, eval_ds, tokenizer, phase.batch_size, False, device, phase.max_length)
                   if eval_ds is not None else None)
    if corpus.get("streaming"):
        about = f"streamed train (shuffle buffer {cfg.shuffle_buffer}) / streamed eval sequences"
    else:
        about = f"{len(train_ds)} train / {len(eval_ds) if eval_ds else 0} eval sequences"
    if data and data["phase"] == phase.index:
        about += restore_position(loader, data, phase.batch_size, cfg.num_workers)
    return loader, eval_loader, about


def restore_position(loader: Any, data: dict, batch_size: int, num_workers: int) -> str:
    """Put `loader` at the data position of a checkpoint; return a note when it is approximate."""
    from bert_kit.data.pretraining import StreamingDataLoader

    streamed = isinstance(loader, StreamingDataLoader)
    if streamed != ("stream" in data):
        raise ValueError(f"the checkpoint was written with streaming: {str(not streamed).lower()}; "
                         f"resume it with that setting")
    if not streamed:
        position = resume_position(data, batch_size * world_size())
        # a checkpoint taken right after an epoch's last batch continues with the next epoch
        at_end = position["batch_index"] >= len(loader)
        loader.load_state_dict({"epoch": position["epoch"] + 1, "batch_index": 0} if at_end else position)
        return ""
    states, workers = data["stream"], max(1, num_workers)
    if len(states) == world_size() and all(len(s["positions"]) == workers for s in states):
        loader.load_state_dict(states[rank()])  # the same shards: exactly where this rank stopped
        return ""
    # other shards: each skips an equal share of what all ranks consumed in the current epoch
    epoch = states[0]["epoch"]
    share = sum(s["examples"] for s in states if s["epoch"] == epoch) // (world_size() * workers)
    loader.load_state_dict({"epoch": epoch, "batch_index": share * workers // batch_size,
                            "examples": share * workers, "positions": [share] * workers, "next_worker": 0})
    return (f"; the stream was saved by {len(states)} rank(s) x {len(states[0]['positions'])} worker(s): "
            f"each shard skips {share} examples of epoch {epoch} (the same point, other examples)")


def loader_state(loader: Any, phase: Phase) -> dict[str, Any]:
    """The data position saved in a checkpoint. Call on every rank: a stream's position differs
    from rank to rank (their shards hold different documents), so all are gathered."""
    from bert_kit.data.pretraining import StreamingDataLoader

    if isinstance(loader, StreamingDataLoader):
        return {"phase": phase.index, "world_size": world_size(), "stream": all_gather_object(loader.state_dict())}
    return {"phase": phase.index, "loader": loader.state_dict(), "world_size": world_size(),
            "global_micro_batch": phase.batch_size * world_size()}
