"""The contrastive trainer: turns a :class:`TrainConfig` into a trained Embedder directory.

One training step:

1. take the step's global batch from the :class:`~lmembed.training.rows.MixtureSampler` (a pure
   function of seed and step) and this process's share of it;
2. embed queries (with their instructions), positives and hard negatives through the
   :class:`~lmembed.training.trainable.TrainableEmbedder` — in one forward pass, or chunk by chunk through
   :class:`~lmembed.training.gradcache.GradCache` when ``grad_cache_chunk`` is set (for a layerwise loss such as
   2DMSE, each text's vectors at the layers the loss asks for come side by side from the same pass);
3. apply the loss (under several processes, in-batch candidates are gathered from all of them with
   ``gather_with_grad``), back-propagate, clip, and take an AdamW step with warm-up then linear decay
   (:class:`~lmembed.training.optim.OptimisationStep`, shared with the pre-training stages).

Around it: a rich progress bar, ``metrics.jsonl`` and ``loss_curve.png`` in the output folder
(:mod:`~lmembed.training.metrics_log`), optional nDCG@10 on dev retrieval sets
(:mod:`~lmembed.training.dev_eval`), atomic checkpoints and exact resumption (same data order,
optimizer, scheduler and RNG state, so the loss sequence continues as if never interrupted). The
process group comes from :func:`~lmembed.training.distributed.setup_distributed` and the loss from
:func:`~lmembed.training.losses.factory.build_training_loss`.

With ``reranker`` set (``cross-encoder``, ``llm`` or ``auto``) the same loop trains a reranker
(:class:`~lmembed.training.reranker.TrainableReranker`): step 2 scores each row's query with its positive and its
negatives as pairs, one logit each, and step 3's loss is a reranker loss over each row's group
(``listwise_softmax`` or ``pointwise_bce``); checkpoints, resuming, the schedule, LoRA (decoders) and the metrics
are the same, and ``<output>/model`` is the reranker's folder (``lmembed.rerank.load_reranker``; a cross-encoder
in sentence-transformers' CrossEncoder format).

Several processes train data-parallel: with DDP by default, or with FSDP2 when accelerate's FSDP configuration
launched them (``configs/accelerate/fsdp.yaml``; full fine-tuning only). Under FSDP the model is sharded
before the optimizer is built, and checkpoints and the saved model hold whole tensors gathered on rank 0,
so the model folder is the same as a single process writes. Under accelerate's DeepSpeed configuration
(``configs/accelerate/deepspeed-zero2.yaml``; ZeRO stage 1 or 2, full fine-tuning only) ``deepspeed.initialize``
owns the model and the AdamW (the engine back-propagates, clips and steps; the schedule is lmembed's); ZeRO-2
keeps whole parameters on every process, so rank 0 saves the model as a single process does. Checkpoints and
resuming are refused under DeepSpeed for now.

Output folder layout::

    <output>/train_config.yaml   the run's settings
    <output>/metrics.jsonl       one JSON object per logged step / evaluation
    <output>/loss_curve.png
    <output>/checkpoints/step-0000100/ ...
    <output>/model/              the trained Embedder (Embedder.from_pretrained(<output>/model)), or reranker
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lmembed.atomic import atomic_folder, atomic_write_text, file_lock
from lmembed.config import EmbeddingConfig
from lmembed.embedder import Embedder
from lmembed.errors import ConfigError
from lmembed.model_card import TrainingRecord
from lmembed.rerank import Reranker
from lmembed.training import checkpoint as ckpt
from lmembed.training.dev_eval import evaluate_retrieval, load_eval_tasks
from lmembed.training.distributed import (
    deepspeed_engine,
    full_model_state,
    full_optimizer_state,
    load_full_state,
    setup_distributed,
    shard_model,
)
from lmembed.training.gradcache import GradCache
from lmembed.training.losses import LayerwiseLoss, loss_citations, reads_false_negatives, reads_teacher_scores
from lmembed.training.losses.factory import build_training_loss
from lmembed.training.metrics_log import CURVE_FILE, METRICS_FILE, MetricsLog, progress_bar
from lmembed.training.optim import EngineOptimisationStep, OptimisationStep, build_optimizer, build_scheduler
from lmembed.training.reranker import TrainableReranker, build_trainable_reranker
from lmembed.training.rows import (
    DataSource,
    MixtureSampler,
    RoundRobinSampler,
    TaskHomogeneousSampler,
    TrainBatch,
    TrainDataset,
    check_teacher_scores,
    datasets_digest,
    decontaminate_datasets,
    load_sources,
)
from lmembed.training.seeding import set_seed
from lmembed.training.train_config import TrainConfig, TrainConfigError
from lmembed.training.trainable import TrainableEmbedder, build_trainable

__all__ = ["TrainResult", "Trainer"]

log = logging.getLogger(__name__)
#: the query instructions a trained model's card lists by name (the rest are counted)
SHOWN_INSTRUCTIONS = 5

CONFIG_FILE = "train_config.yaml"
#: held by the run writing to an output folder (an advisory lock: released when the process ends, however it ends)
RUN_LOCK = ".lmembed-train.lock"
MODEL_DIR = "model"
CURVE_INTERVAL_S = 120.0  # at checkpoints, redraw the loss curve at most this often (drawing takes ~1 s)
# Options that decide the data order and the optimisation path; resuming with other values is reported.
RUN_IDENTITY = ("model", "data", "seed", "batch_size", "num_negatives", "mixing", "loss", "lr", "steps", "warmup_steps")


@dataclass
class TrainResult:
    """What a call to :meth:`Trainer.train` did."""

    output: Path
    model_dir: Path | None
    start_step: int
    end_step: int
    losses: list[float] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)


def full_fine_tuning_only(mode: str) -> ConfigError:
    """The error for LoRA under a sharded mode (``FSDP`` or ``DeepSpeed``), which trains the whole model."""
    return ConfigError(
        f"{mode} (accelerate's {mode} configuration) trains the whole model: pass --no-lora (lora: false); "
        f"LoRA adapters are not supported under {mode} yet (use the DDP configuration for LoRA)"
    )


class Trainer:
    """Contrastive training of an Embedder, or training of a Reranker (see the module docstring).

    ``model`` may be given directly (an :class:`Embedder`, e.g. a tiny in-memory model, or a ready
    :class:`TrainableEmbedder`; when ``config.reranker`` is set, a :class:`Reranker` or a
    :class:`TrainableReranker`); otherwise ``config.model`` is loaded. ``datasets`` likewise replaces
    reading ``config.data``. Works in a single process or under ``accelerate launch``/``torchrun``
    (or any initialised ``torch.distributed`` group): each process then embeds
    ``batch_size / world_size`` rows of every global batch.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        model: Embedder | TrainableEmbedder | Reranker | TrainableReranker | None = None,
        datasets: Sequence[TrainDataset] | None = None,
        card: TrainingRecord | None = None,
    ) -> None:
        config.check_ready(model_given=model is not None, data_given=datasets is not None)
        self.config = config
        self.card = card  # what runs this trainer adds to the saved model's card (a recipe: its name and papers)
        self.dist = setup_distributed(config.device)
        if config.batch_size % self.dist.world_size:
            raise TrainConfigError(
                f"batch_size={config.batch_size} must be divisible by the number of processes ({self.dist.world_size})"
            )
        if self.dist.fsdp is not None:
            self._check_fsdp_options(config)
        if self.dist.deepspeed is not None:
            self._check_deepspeed_options(config)
        set_seed(config.seed)
        # the loss and its options are checked before the model is loaded
        self.loss_fn = build_training_loss(config, distributed=self.dist.world_size > 1)
        self.model = self._build_model(config, model)
        self.dist.device = str(self.model.device)  # a model given ready-made stays where it is
        sharded_mode = self._sharded_mode()
        if sharded_mode and self.model.uses_lora:  # a ready-made model may carry adapters the config did not ask for
            raise full_fine_tuning_only(sharded_mode)
        if self.dist.fsdp is not None:
            shard_model(self.model, self.dist.fsdp, self.dist.device)  # before the optimizer sees the parameters
        set_seed(config.seed + self.dist.rank)  # per-process randomness (dropout) from here on
        data = list(datasets) if datasets is not None else load_sources(config.data, skip_invalid=config.skip_invalid)
        if config.decontaminate_against:
            data = self._decontaminate(data, config)
        samplers = {"homogeneous": TaskHomogeneousSampler, "round_robin": RoundRobinSampler}
        sampler_class = samplers.get(config.batching, MixtureSampler)
        self.sampler = sampler_class(
            data,
            batch_size=config.batch_size,
            num_negatives=config.num_negatives,
            seed=config.seed,
            mixing=config.mixing,
        )
        rows = sum(len(d) for d in data)
        if config.reranker is None and config.batch_size > rows:
            raise TrainConfigError(
                f"batch_size={config.batch_size} is more than the {rows} training rows: each batch would repeat rows, "
                "and a repeated row is a false in-batch negative; use a batch of at most the rows"
            )
        self.distils = reads_teacher_scores(self.loss_fn)
        self.masks_copies = reads_false_negatives(self.loss_fn)
        if self.distils:
            check_teacher_scores(data, config.num_negatives, config.loss)
        if isinstance(self.loss_fn, LayerwiseLoss):  # 2DMSE: the model returns each text's vectors at more layers
            self.model.read_layers(self.loss_fn.layers_to_read(self.model.top_layer))
        self.optimizer = build_optimizer(self.model, config, TrainConfigError)
        self.scheduler = build_scheduler(self.optimizer, config)
        self.engine: Any = None  # the DeepSpeed engine, which owns the model and optimizer under DeepSpeed
        if self.dist.deepspeed is not None:
            self.engine = deepspeed_engine(
                self.model,
                self.optimizer,
                self.dist.deepspeed,
                micro_batch_size=config.batch_size // self.dist.world_size,
                max_grad_norm=config.max_grad_norm,
            )
        self.module: nn.Module = self._wrap(self.model)
        self.output = Path(config.output)
        self.metrics = MetricsLog(self.output / METRICS_FILE, enabled=self.dist.is_main)
        step_args = (self.model, self.optimizer, self.scheduler)
        step_options = dict(
            max_grad_norm=config.max_grad_norm,
            metrics=self.metrics,
            log_every=config.log_every,
            total_steps=config.steps,
        )
        self.optimisation_step = (
            EngineOptimisationStep(self.engine, *step_args, **step_options)
            if self.engine is not None
            else OptimisationStep(*step_args, **step_options)
        )
        self.step = 0
        self._eval_tasks: list[Any] | None = None

    def _build_model(self, config: TrainConfig, model: Any) -> Any:
        """The trainable embedder, or with ``config.reranker`` the trainable reranker (a given model of the other
        kind is refused)."""
        wants_reranker = config.reranker is not None
        if model is not None and isinstance(model, Reranker | TrainableReranker) != wants_reranker:
            raise TrainConfigError(
                "the model given is an embedder: leave reranker unset to train it, or give a reranker"
                if wants_reranker
                else "the model given is a reranker: set reranker (cross-encoder, llm or auto) to train it"
            )
        if wants_reranker:
            if self.dist.fsdp is not None or self.dist.deepspeed is not None:
                raise ConfigError("a reranker is trained in one process or with DDP (not FSDP or DeepSpeed)")
            return build_trainable_reranker(config, model, self.dist.device)
        return build_trainable(config, model, self.dist.device)

    def _decontaminate(self, data: list[TrainDataset], config: TrainConfig) -> list[TrainDataset]:
        """Drop rows that repeat the evaluation sets named; the main process writes what went and why to
        ``decontamination.json`` / ``.md`` in the output folder."""
        data, report = decontaminate_datasets(data, config.decontaminate_against)
        log.info(
            "decontamination against %s: %d of %d rows dropped %s",
            ", ".join(config.decontaminate_against),
            len(report.dropped),
            report.rows,
            report.by_reason,
        )
        if self.dist.is_main:
            output = Path(config.output)
            atomic_write_text(output / "decontamination.json", json.dumps(report.to_dict(), indent=2) + "\n")
            atomic_write_text(output / "decontamination.md", report.markdown())
        return data

    @staticmethod
    def _check_fsdp_options(config: TrainConfig) -> None:
        """What FSDP mode cannot do yet is refused before the model is loaded."""
        if config.lora:
            raise full_fine_tuning_only("FSDP")
        if config.eval_data and config.eval_every:
            raise ConfigError(
                "dev evaluation during training (eval_every) is not supported under FSDP yet: "
                "evaluate the saved model afterwards"
            )

    @staticmethod
    def _check_deepspeed_options(config: TrainConfig) -> None:
        """What DeepSpeed mode cannot do yet is refused before the model is loaded."""
        if config.lora:
            raise full_fine_tuning_only("DeepSpeed")
        if config.grad_cache_chunk:
            raise ConfigError("grad_cache_chunk (GradCache) is not supported under DeepSpeed yet: leave it unset")
        if config.save_every or config.resume:
            raise ConfigError(
                "checkpoints (save_every) and resuming are not supported under DeepSpeed yet (ZeRO partitions the "
                "optimizer state): set save_every: 0, or use the DDP or FSDP configuration"
            )

    def _sharded_mode(self) -> str | None:
        """``FSDP`` or ``DeepSpeed`` when the processes shard the training state, else None."""
        if self.dist.fsdp is not None:
            return "FSDP"
        return "DeepSpeed" if self.dist.deepspeed is not None else None

    @property
    def parallelism(self) -> str:
        """How the processes share the work: ``single``, ``ddp``, ``fsdp`` or ``deepspeed``."""
        if self.dist.world_size == 1:
            return "single"
        if self.dist.deepspeed is not None:
            return "deepspeed"
        return "fsdp" if self.dist.fsdp is not None else "ddp"

    def _wrap(self, model: TrainableEmbedder) -> nn.Module:
        if self.engine is not None:  # DeepSpeed: the engine runs the forward pass and reduces the gradients
            return self.engine
        if self.parallelism != "ddp":  # one process, or FSDP (the sharded model is called as it is)
            return model
        device_ids = [torch.device(self.dist.device).index] if self.dist.device.startswith("cuda") else None
        # find_unused_parameters: parts of a backbone may not feed the pooled vector (BERT's pooler, layers
        # above the pooled one).
        return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=True)

    # ------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, Any]:
        """Run the next optimisation step; returns its metrics record (also written to metrics.jsonl)."""

        def forward_backward() -> tuple[torch.Tensor, dict[str, float]]:
            batch = self.sampler.batch(self.step).shard(self.dist.rank, self.dist.world_size)
            if self.config.reranker is not None:
                backward = self._rerank_backward
            else:
                backward = self._grad_cache_backward if self.config.grad_cache_chunk else self._plain_backward
            return backward(batch), {}

        self.module.train()
        record = self.optimisation_step(
            self.step + 1, forward_backward, reduce=self.dist.mean, rows=self.config.batch_size
        )
        self.step += 1
        return record

    def query_instructions(self, batch: TrainBatch) -> list[str | None]:
        """The instruction each query of a batch is embedded with: its row's (or its source's), else the strategy's
        ``query_instruction``, the one ``encode_queries`` gives the saved model's queries (a model whose strategy
        held one was trained on bare queries, then served them wrapped)."""
        return [self._query_instruction(instr) for instr in batch.instructions]

    def _query_instruction(self, own: str | None) -> str | None:
        """A query's instruction in training: its row's own (or its source's), else the strategy's."""
        if own is not None or self._strategy is None:
            return own
        return self._strategy.query_instruction

    def _trained_instructions(self) -> set[str | None]:
        """Every instruction a query of the training data is embedded with (None: bare)."""
        return {self._query_instruction(e.instruction) for dataset in self.sampler.datasets for e in dataset.examples}

    @property
    def _strategy(self) -> EmbeddingConfig | None:
        """The strategy of the embedder being trained (None for a reranker)."""
        return self.model.config if isinstance(self.model, TrainableEmbedder) else None

    def document_instructions(self, batch: TrainBatch) -> tuple[list[str | None], list[str | None]]:
        """Instructions for the positives and for the (flattened) negatives of a batch.

        Documents are embedded as ``encode_corpus`` embeds them (with the strategy's ``document_instruction``, if
        any), except in symmetric rows (STS pairs: the same kind of text on both sides), whose positive and
        negatives get the row's query instruction as well.
        """
        marked = batch.symmetric or [False] * len(batch)
        document = self._strategy.document_instruction if self._strategy is not None else None
        queries = self.query_instructions(batch)
        positives = [instr if same else document for instr, same in zip(queries, marked, strict=True)]
        return positives, [instr for instr in positives for _ in range(batch.num_negatives)]

    def _plain_backward(self, batch: TrainBatch) -> torch.Tensor:
        """Queries, positives and negatives in one forward pass (one backward: DDP-friendly)."""
        rows, negatives = len(batch), batch.num_negatives
        texts = batch.queries + batch.positives + batch.flat_negatives
        positive_instructions, negative_instructions = self.document_instructions(batch)
        instructions = self.query_instructions(batch) + positive_instructions + negative_instructions
        embeddings = self.module(**self.model.tokenize(texts, instructions))
        query, positive = embeddings[:rows], embeddings[rows : 2 * rows]
        negative = embeddings[2 * rows :].reshape(rows, negatives, -1) if negatives else None
        loss = self.loss_fn(query, positive, negative, **self._loss_inputs(batch, query.device))
        if self.engine is not None:
            self.engine.backward(loss)
        else:
            loss.backward()
        return loss.detach()

    def _rerank_backward(self, batch: TrainBatch) -> torch.Tensor:
        """Every row's query with its positive then its negatives, scored as pairs in one forward pass; the
        reranker loss over each row's group of logits (positive first)."""
        width = 1 + batch.num_negatives
        pairs = [
            (query, document)
            for query, positive, negatives in zip(batch.queries, batch.positives, batch.negatives, strict=True)
            for document in (positive, *negatives)
        ]
        logits = self.module(**self.model.tokenize_pairs(pairs))
        loss = self.loss_fn(logits.view(len(batch), width))
        loss.backward()
        return loss.detach()

    def _grad_cache_backward(self, batch: TrainBatch) -> torch.Tensor:
        """Queries, positives and negatives chunk by chunk (:class:`GradCache`); the backward happens inside."""
        no_sync = getattr(self.module, "no_sync", None)
        cache = GradCache(
            embed_fn=lambda features: self.module(**features),
            loss=self.loss_fn,
            chunk_size=self.config.grad_cache_chunk or len(batch),
            no_sync=no_sync,
        )
        positive_instructions, negative_instructions = self.document_instructions(batch)
        queries = self.model.tokenize(batch.queries, self.query_instructions(batch))
        positives = self.model.tokenize(batch.positives, positive_instructions)
        negatives = self.model.tokenize(batch.flat_negatives, negative_instructions) if batch.num_negatives else None
        return cache(queries, positives, negatives, **self._loss_inputs(batch, self.dist.device))

    def _loss_inputs(self, batch: TrainBatch, device: Any) -> dict[str, torch.Tensor]:
        """What the loss reads besides the embeddings: ``teacher_scores`` ``[rows, 1 + negatives]`` for a
        distillation loss; ``false_negatives`` for an in-batch loss when the batch holds copies of a row's positive
        (the sampler marks them on the global batch)."""
        inputs: dict[str, torch.Tensor] = {}
        if self.distils:  # every row has them: check_teacher_scores refused the data otherwise
            inputs["teacher_scores"] = torch.tensor(batch.teacher_scores, dtype=torch.float32, device=device)
        if self.masks_copies and batch.false_negatives is not None:
            inputs["false_negatives"] = torch.from_numpy(batch.false_negatives).to(device)
        return inputs

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
    @functools.cached_property
    def data_digest(self) -> str:
        """The digest of the rows trained on (computed at the first checkpoint saved or resumed from, not before): a
        checkpoint records it, and a resume checks the data is the same."""
        return datasets_digest(self.sampler.datasets)

    def save_checkpoint(self) -> Path:
        """Write a checkpoint of the current step (every process must call this). Not under DeepSpeed."""
        if self.engine is not None:
            raise ConfigError("checkpoints are not supported under DeepSpeed yet")
        info = {
            "world_size": self.dist.world_size,
            "parallelism": self.parallelism,
            "lora": self.model.uses_lora,
            "run": {k: self.config.to_dict()[k] for k in RUN_IDENTITY},
            "data_digest": self.data_digest,
        }
        optimizer_state = None
        if self.dist.fsdp is not None:  # gather whole tensors on rank 0 (collectives: every process)
            full = full_model_state(self.model)
            model_state = {name: full[name] for name, _ in self.model.named_trainable_parameters()} if full else {}
            optimizer_state = full_optimizer_state(self.model, self.optimizer)
        else:
            model_state = self.model.trainable_state_dict() if self.dist.is_main else {}
        path = ckpt.save_checkpoint(
            self.output,
            self.step,
            model_state=model_state,
            optimizer=self.optimizer,
            optimizer_state=optimizer_state,
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
        if self.engine is not None:
            raise ConfigError("resuming is not supported under DeepSpeed yet")
        path = Path(path) if path else ckpt.latest_checkpoint(self.output)
        if path is None:
            log.info("no checkpoint in %s: starting from step 0", self.output)
            return False
        try:
            state = ckpt.load_checkpoint(path, rank=self.dist.rank, map_location=self.dist.device)
            self._check_states(path, state)
        except ckpt.CheckpointError as exc:
            earlier = [p for _, p in ckpt.list_checkpoints(self.output) if p != path]
            if not earlier:
                raise
            raise ckpt.CheckpointError(
                f"{exc}. The output folder holds earlier checkpoints ({', '.join(p.name for p in earlier)}): move "
                f"{path.name} out of {path.parent} to resume from {earlier[-1].name}"
            ) from exc
        saved_fsdp = state.info.get("parallelism") == "fsdp"
        if saved_fsdp != (self.dist.fsdp is not None):
            raise TrainConfigError(
                f"{path} was written {'with' if saved_fsdp else 'without'} FSDP: resume it the same way "
                "(its optimizer state is keyed differently)"
            )
        self._load_states(path, state)
        if state.rng_state is not None:
            ckpt.restore_rng(state.rng_state)
        else:
            log.warning("%s has no RNG state for rank %d (process count changed?)", path, self.dist.rank)
        recorded = state.info.get("data_digest")
        if recorded is None:
            log.warning("%s records no data_digest: the training rows cannot be checked against this run's", path)
        elif recorded != self.data_digest:
            raise TrainConfigError(
                f"{path}: data_digest: the training rows are not the ones this run was trained on up to step "
                f"{state.step} (a data file was changed or regenerated while it was stopped, or other data is "
                f"named): a resumed run would mix the two. Resume with the same data, or start a new run in another "
                "output folder"
            )
        self._warn_if_changed(state.info.get("run", {}), path)
        self.step = state.step
        self.metrics.resume_at(self.step)
        log.info("resumed from %s at step %d", path, self.step)
        return True

    def _check_states(self, path: Path, state: ckpt.Checkpoint) -> None:
        """Check the checkpoint's facts and states against this run's model, optimizer and scheduler before any is
        loaded; one that does not fit is a :class:`~lmembed.training.checkpoint.CheckpointError` naming its file."""
        steps = self.config.steps
        ckpt.check_info(state.info, path / ckpt.STATE_FILE, steps)
        weights, optimizer_file, scheduler_file = (
            path / n for n in (ckpt.WEIGHTS_FILE, ckpt.OPTIMIZER_FILE, ckpt.SCHEDULER_FILE)
        )
        bad = [
            name for name, t in state.model_state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())
        ]
        if bad:
            raise ckpt.CheckpointError(f"{weights}: {bad[0]} holds values that are not finite")
        ckpt.check_scheduler_state(state.scheduler_state, self.scheduler, scheduler_file, steps)
        if self.dist.fsdp is None:
            ckpt.check_optimizer_state(state.optimizer_state, self.optimizer, optimizer_file)

    def _load_states(self, path: Path, state: ckpt.Checkpoint) -> None:
        """Load the checked states; an error torch still finds is a CheckpointError naming the file."""
        weights, optimizer_file, scheduler_file = (
            path / n for n in (ckpt.WEIGHTS_FILE, ckpt.OPTIMIZER_FILE, ckpt.SCHEDULER_FILE)
        )
        if self.dist.fsdp is not None:
            try:
                load_full_state(self.model, self.optimizer, state.model_state, state.optimizer_state)
            except (TypeError, ValueError, RuntimeError, KeyError, IndexError) as exc:
                raise ckpt.CheckpointError(f"{optimizer_file}: does not fit this run's model ({exc})") from exc
            self.model.weights_changed()
        else:
            try:
                self.model.load_trainable_state_dict(state.model_state)
            except ConfigError as exc:
                raise ckpt.CheckpointError(f"{weights}: {exc}") from exc
            try:
                self.optimizer.load_state_dict(state.optimizer_state)
            except (TypeError, ValueError, RuntimeError, KeyError, IndexError) as exc:
                raise ckpt.CheckpointError(f"{optimizer_file}: does not fit this run's optimizer ({exc})") from exc
        try:
            self.scheduler.load_state_dict(state.scheduler_state)
        except (TypeError, ValueError, RuntimeError, KeyError, IndexError) as exc:
            raise ckpt.CheckpointError(f"{scheduler_file}: does not fit this run's scheduler ({exc})") from exc

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
        """Run (or continue, with ``config.resume``) until ``config.steps``; then save the model. One run at a time
        writes to an output folder: a second one started on it while the first runs is refused (its checkpoints,
        metrics and model would interleave with the first's), naming the folder."""
        if not self.dist.is_main:
            return self._train()
        self.output.mkdir(parents=True, exist_ok=True)
        with file_lock(self.output / RUN_LOCK, wait=False) as held:
            if not held:
                raise TrainConfigError(
                    f"{self.output}: another training run is writing to this folder now; wait for it to end, or "
                    "choose another output folder"
                )
            return self._train()

    def _train(self) -> TrainResult:
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
        with progress_bar(cfg.progress and self.dist.is_main, cfg.steps, start) as update:
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

    def trained_strategy(self) -> EmbeddingConfig:
        """The strategy the trained model is saved with: the loaded one, with what training decided over it. The
        one instruction every query was trained with becomes its ``query_instruction`` (``--instruction X`` was
        used in training and lost on saving: the saved model's queries were then read bare); a dot-product
        objective saves the vectors unnormalised and scored by dot product (it saved a normalised cosine model)."""
        strategy = self._strategy
        assert strategy is not None
        changes: dict[str, Any] = {}
        trained = self._trained_instructions()
        if len(trained) == 1 and (only := next(iter(trained))) is not None and only != strategy.query_instruction:
            changes["query_instruction"] = only
        if self.config.similarity == "dot" and (strategy.normalize or strategy.similarity != "dot"):
            changes.update(normalize=False, similarity="dot")
        if changes:
            log.info("the trained model is saved with %s (how it was trained)", changes)
        return strategy.with_options(**changes) if changes else strategy

    def training_record(self) -> TrainingRecord:
        """What the saved model's card says of this run: its settings and the papers of its loss and techniques."""
        config = self.config
        inner = config.loss_kwargs.get("inner")
        cites = [*loss_citations(config.loss, inner if isinstance(inner, str) else None)]
        settings: dict[str, Any] = {
            "loss": config.loss + (f" (inner: {inner})" if isinstance(inner, str) else ""),
            "steps": config.steps,
            "batch size": config.batch_size,
            "learning rate": config.lr,
        }
        if config.temperature is not None:
            settings["temperature"] = config.temperature
        settings["hard negatives per query"] = config.num_negatives
        if config.grad_cache_chunk:
            settings["GradCache chunk"] = config.grad_cache_chunk
            cites.append("gao2021gradcache")
        if self.model.uses_lora:
            settings["LoRA"] = f"rank {config.lora_r}, alpha {config.lora_alpha}" + (
                ", merged" if config.merge_lora else ", kept as an adapter"
            )
            cites.append("hu2021lora")
        sources = [DataSource.parse(d) for d in config.data]
        names = [source.name or Path(source.path).name for source in sources]
        settings["data"] = ", ".join(names) if names else "(none)"
        instructions = sorted(i for i in self._trained_instructions() if i)
        if instructions:  # what the queries were trained with (a row's own, its source's, or the strategy's)
            shown = "; ".join(instructions[:SHOWN_INSTRUCTIONS])
            more = len(instructions) - SHOWN_INSTRUCTIONS
            settings["query instructions"] = shown + (f"; and {more} more" if more > 0 else "")
        if config.similarity != "cosine":
            settings["similarity"] = config.similarity
        settings["seed"] = config.seed
        if self.card is not None:
            settings = {**self.card.settings, **settings}
            cites = [*self.card.cites, *cites]
        return TrainingRecord(settings, tuple(cites))

    def save_model(self, directory: str | Path | None = None) -> Path | None:
        """Write the trained Embedder atomically (main process) to ``<output>/model`` by default.

        LoRA is merged in place unless ``merge_lora`` is off: call this once training is over. Under FSDP every
        process must call it (whole tensors are gathered on rank 0, which writes them). Under DeepSpeed ZeRO-2
        every process holds whole parameters: rank 0 writes them as a single process does.
        """
        target = Path(directory) if directory else self.output / MODEL_DIR
        full = full_model_state(self.model) if self.dist.fsdp is not None else None
        if self.dist.is_main:
            self.model.eval()
            merge = self.config.merge_lora
            # the model before stays under its name until the new one is whole and renamed in (never neither)
            with atomic_folder(target) as scratch:
                embedder = isinstance(self.model, TrainableEmbedder)  # a reranker's folder has no card
                if embedder:
                    self.model.saved_strategy = self.trained_strategy()
                card = {"training": self.training_record(), "name": target.name} if embedder else {}
                self.model.save(scratch, merge_lora=merge, in_place=merge, adapter_base=target, full_state=full, **card)
        self.dist.barrier()
        return target
