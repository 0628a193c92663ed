"""The contrastive trainer: turns a :class:`TrainConfig` into a trained Embedder directory.

One training step:

1. take the step's global batch from the :class:`~lmembed.training.data.MixtureSampler` (a pure
   function of seed and step) and this process's share of it;
2. embed queries (with their instructions), positives and hard negatives through the
   :class:`~lmembed.training.model.TrainableEmbedder` — in one forward pass, or chunk by chunk through
   :class:`~lmembed.training.gradcache.GradCache` when ``grad_cache_chunk`` is set;
3. apply the loss (under several processes, in-batch candidates are gathered from all of them with
   ``gather_with_grad``), back-propagate, clip, and take an AdamW step with warm-up then linear decay.

Around it: a rich progress bar, ``metrics.jsonl`` and ``loss_curve.png`` in the output folder,
optional nDCG@10 on dev retrieval sets, atomic checkpoints and exact resumption (same data order,
optimizer, scheduler and RNG state, so the loss sequence continues as if never interrupted).

Output folder layout::

    <output>/train_config.yaml   the run's settings
    <output>/metrics.jsonl       one JSON object per logged step / evaluation
    <output>/loss_curve.png
    <output>/checkpoints/step-0000100/ ...
    <output>/model/              the trained Embedder (Embedder.from_pretrained(<output>/model))
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lmembed.atomic import atomic_savefig, atomic_write_text
from lmembed.embedder import Embedder
from lmembed.training import checkpoint as ckpt
from lmembed.training.data import MixtureSampler, TaskHomogeneousSampler, TrainBatch, TrainDataset, load_sources
from lmembed.training.distributed import gather_with_grad, is_distributed, rank, world_size
from lmembed.training.model import TrainableEmbedder, build_trainable
from lmembed.training.optim import build_optimizer, build_scheduler
from lmembed.training.train_config import TrainConfig, TrainConfigError

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "loss_curve.png"
CONFIG_FILE = "train_config.yaml"
MODEL_DIR = "model"
CURVE_INTERVAL_S = 120.0  # at checkpoints, redraw the loss curve at most this often (drawing takes ~1 s)
# Options that decide the data order and the optimisation path; resuming with other values is reported.
RUN_IDENTITY = ("model", "data", "seed", "batch_size", "num_negatives", "mixing", "loss", "lr", "steps", "warmup_steps")
UNSUPPORTED_LOSSES = {"angle": "AnglE scores labelled text pairs, not (query, positive, negatives) rows"}


# ---------------------------------------------------------------------------------------------- pieces
def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _accepted(factory: Any, options: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(factory).parameters
    return {k: v for k, v in options.items() if k in params}


def build_training_loss(config: TrainConfig, distributed: bool = False) -> nn.Module:
    """The loss named in the config, with the config's temperature/similarity where the loss takes them.

    ``loss_kwargs`` override those defaults. Under several processes, losses that accept a ``gather``
    hook get :func:`gather_with_grad`, so in-batch negatives span the global batch.
    """
    from lmembed.training.losses import build_loss

    name = config.loss.strip().lower().replace("-", "_")
    if name in UNSUPPORTED_LOSSES:
        raise TrainConfigError(f"loss={config.loss!r} is not usable by the trainer: {UNSUPPORTED_LOSSES[name]}")
    defaults: dict[str, Any] = {"similarity": config.similarity, "in_batch_negatives": config.in_batch_negatives}
    if config.temperature is not None:
        defaults["temperature"] = config.temperature
    if distributed:
        defaults["gather"] = gather_with_grad
    kwargs = dict(config.loss_kwargs)
    if name in ("matryoshka", "mrl"):
        inner = kwargs.pop("inner", "infonce")
        inner_class = type(build_loss(inner)) if isinstance(inner, str) else None
        inner_defaults = _accepted(inner_class, defaults) if inner_class else {}
        kwargs["inner_kwargs"] = {**inner_defaults, **kwargs.get("inner_kwargs", {})}
        return build_loss(name, inner=inner, **kwargs)
    probe = build_loss(name)
    loss = build_loss(name, **{**_accepted(type(probe), defaults), **kwargs})
    if distributed and "gather" not in inspect.signature(type(probe)).parameters:
        log.warning("loss %s has no gather hook: in-batch negatives stay within each process", name)
    return loss


@dataclass
class DistContext:
    """This process's place in a (possibly single-process) run."""

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()

    def mean(self, value: torch.Tensor) -> float:
        """Average of a scalar over processes."""
        if self.world_size == 1:
            return float(value)
        total = value.detach().clone().reshape(1).to(_collective_device(self.device))
        torch.distributed.all_reduce(total)
        return float(total) / self.world_size


def _collective_device(device: str) -> torch.device:
    if torch.distributed.is_initialized() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def setup_distributed(device: str = "auto") -> DistContext:
    """Join the process group that ``accelerate launch``/``torchrun`` describe in the environment, if any."""
    if not is_distributed() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        PartialState(cpu=device == "cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    elif device == "cuda":  # an explicit index: torch.cuda.set_device rejects a bare "cuda" on some versions
        device = f"cuda:{local_rank}"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    return DistContext(rank(), world_size(), device)


# ---------------------------------------------------------------------------------------------- evaluation
def _relevant_first(qrels: dict[str, dict[str, int]], query_ids: Sequence[str], known: set[str]) -> list[str]:
    """Relevant documents of the queries, best-judged first, taken round-robin so every query gets some."""
    ranked = [
        [d for d, score in sorted(qrels.get(q, {}).items(), key=lambda kv: -kv[1]) if score > 0 and d in known]
        for q in query_ids
    ]
    order: dict[str, None] = {}
    for depth in range(max((len(r) for r in ranked), default=0)):
        for docs in ranked:
            if depth < len(docs):
                order.setdefault(docs[depth], None)
    return list(order)


def subsample_retrieval(data: Any, max_queries: int | None = None, max_docs: int | None = None, seed: int = 0) -> Any:
    """A smaller, self-consistent copy of a retrieval split, for quick evaluation on a slow machine.

    Keeps up to ``max_queries`` answerable queries (chosen at random) and a corpus of at most ``max_docs``
    documents: first documents judged relevant to the kept queries (best judgments first, spread over
    the queries), then random others. Judgments of documents left out are dropped, and so are queries
    left without a relevant document. Scores compare models evaluated on the same subsample; they are
    not the full-corpus numbers.
    """
    from dataclasses import replace

    rng = np.random.default_rng(seed)
    corpus_ids, corpus_texts = list(data.corpus_ids), list(data.corpus_texts)
    known = set(corpus_ids)
    usable = [
        i
        for i, q in enumerate(data.query_ids)
        if any(score > 0 and d in known for d, score in data.qrels.get(q, {}).items())
    ]
    if max_queries and max_queries < len(usable):
        usable = sorted(rng.choice(usable, size=max_queries, replace=False).tolist())
    query_ids, query_texts = [data.query_ids[i] for i in usable], [data.query_texts[i] for i in usable]
    if max_docs and max_docs < len(corpus_ids):
        wanted = _relevant_first(data.qrels, query_ids, known)[:max_docs]
        position = {d: i for i, d in enumerate(corpus_ids)}
        chosen = {position[d] for d in wanted}
        others = np.array([i for i in range(len(corpus_ids)) if i not in chosen], dtype=np.int64)
        extra = min(max_docs - len(chosen), len(others))
        chosen |= set(rng.choice(others, size=extra, replace=False).tolist()) if extra > 0 else set()
        order = sorted(chosen)
        corpus_ids, corpus_texts = [corpus_ids[i] for i in order], [corpus_texts[i] for i in order]
    kept_docs = set(corpus_ids)
    qrels = {q: {d: s for d, s in data.qrels.get(q, {}).items() if d in kept_docs} for q in query_ids}
    answerable = [i for i, q in enumerate(query_ids) if any(s > 0 for s in qrels[q].values())]
    return replace(
        data,
        query_ids=[query_ids[i] for i in answerable],
        query_texts=[query_texts[i] for i in answerable],
        qrels={query_ids[i]: qrels[query_ids[i]] for i in answerable},
        corpus_ids=corpus_ids,
        corpus_texts=corpus_texts,
        missing_docs=[],
        missing_queries=[],
    )


def load_eval_tasks(
    paths: Sequence[str],
    split: str = "test",
    *,
    max_queries: int | None = None,
    max_docs: int | None = None,
    seed: int = 0,
) -> list[Any]:
    """Retrieval tasks for dev evaluation; empty (with a warning) when the evaluation module is missing."""
    if not paths:
        return []
    try:
        from lmembed.evaluation.retrieval import RetrievalTask
    except ImportError as exc:
        log.warning("dev evaluation is off: lmembed.evaluation.retrieval is not available (%s)", exc)
        return []
    from lmembed.datasets import resolve_dataset

    tasks = []
    for path in paths:
        folder = resolve_dataset(path, download=False)
        try:
            task = RetrievalTask.from_name(folder.name, path=folder, split=split)
        except KeyError:
            task = RetrievalTask.from_folder(folder, name=folder.name, split=split)
        if max_queries or max_docs:
            task.data = subsample_retrieval(task.data, max_queries, max_docs, seed)
        tasks.append(task)
    return tasks


def evaluate_retrieval(embedder: Embedder, tasks: Sequence[Any], batch_size: int = 32) -> dict[str, float]:
    """nDCG@10 of ``embedder`` on each task, keyed by task name."""
    scores = {}
    for task in tasks:
        result = task.evaluate(embedder, batch_size=batch_size)
        scores[task.name] = float(result.scores["ndcg_at_10"])
    return scores


# ---------------------------------------------------------------------------------------------- logging
class MetricsLog:
    """Appends JSON records to ``metrics.jsonl`` (main process only) and keeps them for the loss curve."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        self.records: list[dict[str, Any]] = []
        self._plotted_at = -math.inf

    def resume_at(self, step: int) -> None:
        """Keep the records up to ``step``; later ones came from a run that was killed after its checkpoint."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by the kill
            if record.get("step", 0) <= step:
                kept.append(record)
        self.records = kept
        if self.enabled:
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()

    def plot(self, path: Path, *, every_s: float = 0.0) -> None:
        """Redraw the loss curve; with ``every_s`` only if the last drawing is older than that."""
        now = time.monotonic()
        if not self.enabled or (every_s and now - self._plotted_at < every_s):
            return
        plot_loss_curve(self.records, path)
        self._plotted_at = now


def plot_loss_curve(records: Sequence[dict[str, Any]], path: Path) -> None:
    """Training loss per step (raw and smoothed) and, if any, dev nDCG@10 on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records if "loss" in r]
    losses = [r["loss"] for r in records if "loss" in r]
    if not steps:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, losses, color="tab:blue", alpha=0.35, linewidth=1, label="loss")
    ax.plot(steps, _smooth(losses), color="tab:blue", linewidth=2, label="loss (smoothed)")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    evals = [r for r in records if "eval" in r]
    if evals:
        right = ax.twinx()
        for name in evals[-1]["eval"]:
            points = [(r["step"], r["eval"][name]) for r in evals if name in r["eval"]]
            right.plot(*zip(*points, strict=True), marker="o", label=f"{name} nDCG@10")
        right.set_ylabel("dev nDCG@10")
        right.legend(loc="upper right", fontsize="small")
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)


def _smooth(values: Sequence[float], weight: float = 0.9) -> list[float]:
    out, running = [], None
    for v in values:
        running = v if running is None else weight * running + (1 - weight) * v
        out.append(running)
    return out


@contextmanager
def _progress_bar(enabled: bool, total: int, start: int) -> Iterator[Any]:
    """A rich progress bar showing loss, learning rate and rows/s; yields ``update(**fields)``."""
    if not enabled:
        yield lambda **_: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [
        TextColumn("training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]} lr {task.fields[lr]} {task.fields[rps]} rows/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    with Progress(*columns) as progress:
        task = progress.add_task("train", total=total, completed=start, loss="-", lr="-", rps="-")
        yield lambda **fields: progress.update(task, **fields)


# ---------------------------------------------------------------------------------------------- trainer
@dataclass
class TrainResult:
    """What a call to :meth:`Trainer.train` did."""

    output: Path
    model_dir: Path | None
    start_step: int
    end_step: int
    losses: list[float] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)


class Trainer:
    """Contrastive training of an Embedder (see the module docstring).

    ``model`` may be given directly (an :class:`Embedder`, e.g. a tiny in-memory model, or a ready
    :class:`TrainableEmbedder`); otherwise ``config.model`` is loaded. ``datasets`` likewise replaces
    reading ``config.data``. Works in a single process or under ``accelerate launch``/``torchrun``
    (or any initialised ``torch.distributed`` group): each process then embeds
    ``batch_size / world_size`` rows of every global batch.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        model: Embedder | TrainableEmbedder | None = None,
        datasets: Sequence[TrainDataset] | None = None,
    ) -> None:
        if model is None:
            config.check_ready()
        elif datasets is None and not config.data:
            raise TrainConfigError("no training data given")
        self.config = config
        self.dist = setup_distributed(config.device)
        if config.batch_size % self.dist.world_size:
            raise TrainConfigError(
                f"batch_size={config.batch_size} must be divisible by the number of processes ({self.dist.world_size})"
            )
        set_seed(config.seed)
        self.model = build_trainable(config, model, self.dist.device)
        self.dist.device = str(self.model.device)  # a model given ready-made stays where it is
        set_seed(config.seed + self.dist.rank)  # per-process randomness (dropout) from here on
        data = list(datasets) if datasets is not None else load_sources(config.data, skip_invalid=config.skip_invalid)
        sampler_class = TaskHomogeneousSampler if config.batching == "homogeneous" else MixtureSampler
        self.sampler = sampler_class(
            data,
            batch_size=config.batch_size,
            num_negatives=config.num_negatives,
            seed=config.seed,
            mixing=config.mixing,
        )
        self.loss_fn = build_training_loss(config, distributed=self.dist.world_size > 1)
        self.optimizer = build_optimizer(self.model, config, TrainConfigError)
        self.scheduler = build_scheduler(self.optimizer, config)
        self.module: nn.Module = self._wrap(self.model)
        self.output = Path(config.output)
        self.metrics = MetricsLog(self.output / METRICS_FILE, enabled=self.dist.is_main)
        self.step = 0
        self._eval_tasks: list[Any] | None = None

    def _wrap(self, model: TrainableEmbedder) -> nn.Module:
        if self.dist.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [torch.device(self.dist.device).index] if self.dist.device.startswith("cuda") else None
        # find_unused_parameters: parts of a backbone may not feed the pooled vector (BERT's pooler, layers
        # above the pooled one).
        return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=True)

    # ------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, Any]:
        """Run the next optimisation step; returns its metrics record (also written to metrics.jsonl)."""
        started = time.perf_counter()
        batch = self.sampler.batch(self.step).shard(self.dist.rank, self.dist.world_size)
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        backward = self._grad_cache_backward if self.config.grad_cache_chunk else self._plain_backward
        loss = backward(batch)
        grad_norm = self._clip_gradients()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.model.weights_changed()
        self.step += 1
        seconds = time.perf_counter() - started
        record = {
            "step": self.step,
            "loss": self.dist.mean(loss),
            "lr": lr,
            "grad_norm": grad_norm,
            "rows_per_s": self.config.batch_size / seconds,
            "seconds": seconds,
        }
        if self.step % self.config.log_every == 0 or self.step == self.config.steps:
            self.metrics.write(record)
        return record

    def document_instructions(self, batch: TrainBatch) -> tuple[list[str | None], list[str | None]]:
        """Instructions for the positives and for the (flattened) negatives of a batch.

        Documents are embedded as they are, except in symmetric rows (STS pairs: the same kind of
        text on both sides), whose positive and negatives get the row's instruction as well.
        """
        marked = batch.symmetric or [False] * len(batch)
        positives = [instr if same else None for instr, same in zip(batch.instructions, marked, strict=True)]
        return positives, [instr for instr in positives for _ in range(batch.num_negatives)]

    def _plain_backward(self, batch: TrainBatch) -> torch.Tensor:
        """Queries, positives and negatives in one forward pass (one backward: DDP-friendly)."""
        rows, negatives = len(batch), batch.num_negatives
        texts = batch.queries + batch.positives + batch.flat_negatives
        positive_instructions, negative_instructions = self.document_instructions(batch)
        instructions = batch.instructions + positive_instructions + negative_instructions
        embeddings = self.module(**self.model.tokenize(texts, instructions))
        query, positive = embeddings[:rows], embeddings[rows : 2 * rows]
        negative = embeddings[2 * rows :].reshape(rows, negatives, -1) if negatives else None
        loss = self.loss_fn(query, positive, negative)
        loss.backward()
        return loss.detach()

    def _grad_cache_backward(self, batch: TrainBatch) -> torch.Tensor:
        from lmembed.training.gradcache import GradCache

        no_sync = getattr(self.module, "no_sync", None)
        cache = GradCache(
            embed_fn=lambda features: self.module(**features),
            loss=self.loss_fn,
            chunk_size=self.config.grad_cache_chunk or len(batch),
            no_sync=no_sync,
        )
        positive_instructions, negative_instructions = self.document_instructions(batch)
        queries = self.model.tokenize(batch.queries, batch.instructions)
        positives = self.model.tokenize(batch.positives, positive_instructions)
        negatives = self.model.tokenize(batch.flat_negatives, negative_instructions) if batch.num_negatives else None
        return cache(queries, positives, negatives)

    def _clip_gradients(self) -> float:
        params = [p for _, p in self.model.named_trainable_parameters() if p.grad is not None]
        if not params:
            return 0.0
        limit = self.config.max_grad_norm if self.config.max_grad_norm else math.inf
        return float(torch.nn.utils.clip_grad_norm_(params, limit))

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, float]:
        """nDCG@10 on the configured dev sets (main process; others wait). Empty when none are set."""
        scores: dict[str, float] = {}
        if self.dist.is_main:
            if self._eval_tasks is None:
                cfg = self.config
                self._eval_tasks = load_eval_tasks(
                    cfg.eval_data,
                    cfg.eval_split,
                    max_queries=cfg.eval_max_queries,
                    max_docs=cfg.eval_max_docs,
                    seed=cfg.seed,
                )
            if self._eval_tasks:
                self.model.eval()
                scores = evaluate_retrieval(self.model.embedder, self._eval_tasks, self.config.eval_batch_size)
                self.model.train()
                self.metrics.write({"step": self.step, "eval": scores})
        self.dist.barrier()
        return scores

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Write a checkpoint of the current step (every process must call this)."""
        info = {
            "world_size": self.dist.world_size,
            "lora": self.model.uses_lora,
            "run": {k: self.config.to_dict()[k] for k in RUN_IDENTITY},
        }
        path = ckpt.save_checkpoint(
            self.output,
            self.step,
            model_state=self.model.trainable_state_dict() if self.dist.is_main else {},
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            info=info,
            rank=self.dist.rank,
            barrier=self.dist.barrier,
            keep=self.config.keep_checkpoints,
        )
        self.metrics.plot(self.output / CURVE_FILE, every_s=CURVE_INTERVAL_S)
        return path

    def resume(self, path: str | Path | None = None) -> bool:
        """Continue from ``path`` or the newest checkpoint in the output folder; False when there is none."""
        path = Path(path) if path else ckpt.latest_checkpoint(self.output)
        if path is None:
            log.info("no checkpoint in %s: starting from step 0", self.output)
            return False
        state = ckpt.load_checkpoint(path, rank=self.dist.rank, map_location=self.dist.device)
        self.model.load_trainable_state_dict(state.model_state)
        self.optimizer.load_state_dict(state.optimizer_state)
        self.scheduler.load_state_dict(state.scheduler_state)
        if state.rng_state is not None:
            ckpt.restore_rng(state.rng_state)
        else:
            log.warning("%s has no RNG state for rank %d (process count changed?)", path, self.dist.rank)
        self._warn_if_changed(state.info.get("run", {}), path)
        self.step = state.step
        self.metrics.resume_at(self.step)
        log.info("resumed from %s at step %d", path, self.step)
        return True

    def _warn_if_changed(self, saved: dict[str, Any], path: Path) -> None:
        current = self.config.to_dict()
        changed = [k for k in RUN_IDENTITY if k in saved and saved[k] != current[k]]
        if changed:
            log.warning(
                "%s was written with other %s: the resumed run will not match an uninterrupted one",
                path,
                ", ".join(changed),
            )

    # ------------------------------------------------------------------ the loop
    def train(self) -> TrainResult:
        """Run (or continue, with ``config.resume``) until ``config.steps``; then save the model."""
        cfg = self.config
        if cfg.resume:
            self.resume()
        elif ckpt.list_checkpoints(self.output):
            raise TrainConfigError(
                f"{self.output} already holds checkpoints of a run; pass resume (--resume) to continue it, "
                "or choose another output folder"
            )
        if self.step == 0:
            self.metrics.resume_at(0)  # a fresh run starts a fresh metrics file
        start = self.step
        if self.dist.is_main:
            self.output.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.output / CONFIG_FILE, cfg.to_yaml())
            log.info("training data: %s", self.sampler.describe())
        result = TrainResult(self.output, None, start, start)
        with _progress_bar(cfg.progress and self.dist.is_main, cfg.steps, start) as update:
            while self.step < cfg.steps:
                record = self.train_step()
                result.losses.append(record["loss"])
                update(
                    advance=1,
                    loss=f"{record['loss']:.4f}",
                    lr=f"{record['lr']:.2e}",
                    rps=f"{record['rows_per_s']:.1f}",
                )
                self._after_step(result)
        if cfg.save_every and self._last_saved() < self.step:
            self.save_checkpoint()
        result.end_step = self.step
        result.model_dir = self.save_model()
        self.metrics.plot(self.output / CURVE_FILE)
        return result

    def _after_step(self, result: TrainResult) -> None:
        cfg = self.config
        if cfg.eval_every and self.step % cfg.eval_every == 0 and cfg.eval_data:
            scores = self.evaluate()
            if scores:
                result.evaluations.append({"step": self.step, **scores})
        if cfg.save_every and self.step % cfg.save_every == 0:
            self.save_checkpoint()

    def _last_saved(self) -> int:
        found = ckpt.list_checkpoints(self.output)
        return found[-1][0] if found else -1

    def save_model(self, directory: str | Path | None = None) -> Path | None:
        """Write the trained Embedder atomically (main process) to ``<output>/model`` by default.

        LoRA is merged in place unless ``merge_lora`` is off: call this once training is over.
        """
        target = Path(directory) if directory else self.output / MODEL_DIR
        if self.dist.is_main:
            scratch = target.with_name(f".tmp-{target.name}")
            shutil.rmtree(scratch, ignore_errors=True)
            self.model.eval()
            merge = self.config.merge_lora
            self.model.save(scratch, merge_lora=merge, in_place=merge, adapter_base=target)
            if target.exists():
                ckpt.discard_dir(target)
            os.replace(scratch, target)
        self.dist.barrier()
        return target
