"""The run of ``lmembed adapt`` (see :mod:`lmembed.training.adapt` for the method and the output folder): make the
rows, score the held-back pseudo-queries, train with checkpoints, keep the best step, save and report."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import AllowInfNan, Strict, StrictInt, field_validator, model_validator
from safetensors import safe_open
from safetensors.torch import load_file, save

from lmembed.atomic import atomic_folder, atomic_write
from lmembed.embedder import Embedder
from lmembed.errors import LmembedError
from lmembed.io import check_recorded_files, is_plain_file_name, sha256_file
from lmembed.mining import read_rows
from lmembed.model_card import TrainingRecord
from lmembed.paths import inside
from lmembed.schema import RecordModel, read_checked_json
from lmembed.training import checkpoint as ckpt
from lmembed.training.adapt import (
    BEST_STATE_FILE,
    HELDOUT_FILE,
    LOG_FILE,
    ROWS_FILE,
    SELECTION_FILE,
    START_STATE_FILE,
    SUMMARY_FILE,
    AdaptError,
    Document,
    HeldOut,
    HybridTeacher,
    PseudoQuery,
    corpus_digest,
    crop_queries,
    filter_queries,
    generated_queries,
    hold_back,
    label_rows,
    mine_rows,
    peak_memory_mb,
    read_adapt_corpus,
    split_check,
    title_queries,
    unmined_rows,
    write_json,
    write_rows,
)
from lmembed.training.adapt_recipe import AdaptRecipe, load_adapt_recipe
from lmembed.training.losses.factory import reads_temperature
from lmembed.training.rows import TrainDataset, parse_row
from lmembed.training.train_config import TrainConfig
from lmembed.training.trainer import MODEL_DIR, Trainer

log = logging.getLogger(__name__)

PLAN_FILE = "adapt_plan.json"


@dataclass
class AdaptResult:
    """What :func:`run_adapt` made: the model folder and the summary it wrote."""

    output: Path
    model_dir: Path
    summary: dict[str, Any] = field(default_factory=dict)


class _SelectingTrainer(Trainer):
    """The trainer, plus: every ``every`` steps (and at the last) the held-back pseudo-queries are scored, the best
    step's trainable weights are kept in ``best_state.safetensors``, and that step's weights are the ones saved.

    ``selection.json`` records the sha256 of ``best_state`` and ``start_state`` (``states``), and each is checked
    before it is read back. A state is rewritten in two steps, the new digest recorded beside the old one before
    the file is replaced and alone after it, so a run killed in between still finds its file recorded."""

    def __init__(
        self,
        config: TrainConfig,
        held: HeldOut,
        every: int,
        merge: float = 1.0,
        metric: str = "ndcg_at_10",
        **kwargs: Any,
    ) -> None:
        super().__init__(config, **kwargs)
        self.held, self.every, self.merge, self.metric = held, every, merge, metric
        self.selection_path = self.output / SELECTION_FILE
        self.history: list[dict[str, Any]] = []
        self.states: dict[str, list[str]] = {}  # file name -> the sha256 digests its content may have

    def start_selection(self, before: dict[str, float]) -> None:
        """Step 0 (the starting model) is the first candidate: adapting never keeps weights worse than it on the
        held-back queries."""
        self.history = [{"step": 0, **before}]
        self._keep_best(0)
        self._write_selection()

    def resume(self, path: str | Path | None = None) -> bool:
        resumed = super().resume(path)
        if resumed:
            data = read_checked_json(self.selection_path, _Selection, AdaptError, "an adapt run's selection")
            if any(self.metric not in h for h in data["history"]):
                raise AdaptError(f"{self.selection_path}: history: an entry without {self.metric}, the run's metric")
            for name in data["states"]:
                inside(self.output, name, file=self.selection_path, field=f"states.{name}", error=AdaptError)
            self.history = [h for h in data["history"] if h["step"] <= self.step]
            self.states = data["states"]
        return resumed

    def best(self) -> dict[str, Any]:
        """The history's best step by the selection metric (the earliest of equals)."""
        return max(self.history, key=lambda h: (h[self.metric], -h["step"]))

    def _keep_best(self, step: int) -> None:
        if self.best()["step"] == step:
            self._write_state(BEST_STATE_FILE, {"step": str(step)})

    def _write_selection(self) -> None:
        best = self.best()["step"] if self.history else None
        write_json(
            self.selection_path,
            {"history": self.history, "metric": self.metric, "best_step": best, "states": self.states},
        )

    def _after_step(self, result: Any) -> None:
        if self.step % self.every == 0 or self.step == self.config.steps:
            self.model.eval()
            with torch.no_grad():
                scores = self.held.score(self.model.embedder)
            self.model.train()
            self.history = [h for h in self.history if h["step"] != self.step] + [{"step": self.step, **scores}]
            log.info("step %d: held-back pseudo-queries %s", self.step, _scores_text(scores))
            self._keep_best(self.step)
            self._write_selection()
        super()._after_step(result)

    def save_model(self, directory: str | Path | None = None) -> Path | None:
        best_file = self._verified(BEST_STATE_FILE)
        with safe_open(str(best_file), framework="pt", device=str(self.model.device)) as f:
            best_step = int((f.metadata() or {}).get("step", -1))
            state = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
        if best_step != self.step:
            log.info("keeping step %d (best on the held-back pseudo-queries), not %d", best_step, self.step)
        if self.merge < 1.0 and best_step > 0:
            start = load_file(str(self._verified(START_STATE_FILE)), device=str(self.model.device))
            state = merge_states(start, state, self.merge, lora=self.model.uses_lora)
            log.info("merged: start + %.2f × (step %d − start)", self.merge, best_step)
        self.model.load_trainable_state_dict(state)  # which calls weights_changed
        return super().save_model(directory)

    def keep_start(self) -> None:
        """The starting trainable weights, kept for the merge (a resumed run reads them back). A run that starts from
        step 0 writes them again, its selection being new: one killed before its first checkpoint left a file whose
        digest the new ``selection.json`` would not hold."""
        if not self.config.resume or not (self.output / START_STATE_FILE).exists():
            self._write_state(START_STATE_FILE)

    def _write_state(self, name: str, metadata: dict[str, str] | None = None) -> None:
        """The trainable weights as ``OUT/name``, safetensors (tensors only: read back without unpickling),
        written atomically, its sha256 recorded in ``selection.json`` (see the class doc)."""
        state = {k: v.contiguous() for k, v in self.model.trainable_state_dict().items()}  # CPU copies already
        payload = save(state, metadata=metadata)
        digest = hashlib.sha256(payload).hexdigest()
        self.states[name] = [digest, *self.states.get(name, [])[:1]]  # the old content stays valid until replaced
        self._write_selection()
        atomic_write(self.output / name, lambda handle: handle.write(payload))
        self.states[name] = [digest]
        self._write_selection()

    def _verified(self, name: str) -> Path:
        """``OUT/name``, once its content hashes to a digest ``selection.json`` records for it (a state it records
        no digest for is refused: nothing says it is the one this run wrote)."""
        check_recorded_files(self.output, self.selection_path, self.states, [name], key="states", error=AdaptError)
        return inside(self.output, name, file=self.selection_path, field=f"states.{name}", error=AdaptError)


_Finite = Annotated[float, Strict(), AllowInfNan(False)]


def _plain_names(names: dict[str, Any]) -> dict[str, Any]:
    """``names`` when each key is a plain file name (a file of the run folder itself, not a path)."""
    for name in names:
        if not is_plain_file_name(name):
            raise ValueError(f"{name!r} is not the name of a file of the run folder")
    return names


class _Selection(RecordModel):
    """What a resumed run reads of ``selection.json``."""

    history: list[dict[str, _Finite]]  # each entry: its step and its scores
    metric: str
    best_step: StrictInt | None = None
    states: dict[str, list[str]]  # file name -> the sha256 digests its content may have

    @field_validator("states")
    @classmethod
    def _state_names(cls, states: dict[str, list[str]]) -> dict[str, list[str]]:
        return _plain_names(states)

    @model_validator(mode="after")
    def _steps(self) -> _Selection:
        if not all("step" in h and float(h["step"]).is_integer() and h["step"] >= 0 for h in self.history):
            raise ValueError("each history entry needs a whole step")
        return self


class _Plan(RecordModel):
    """What a resumed run reads of ``adapt_plan.json`` (besides the options it compares with its own)."""

    report: dict[str, Any]
    files: dict[str, str]  # rows and held-back queries -> sha256

    @field_validator("files")
    @classmethod
    def _file_names(cls, files: dict[str, str]) -> dict[str, str]:
        return _plain_names(files)


def _scores_text(scores: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.4f}" for name, value in scores.items())


def merge_states(
    start: dict[str, torch.Tensor], adapted: dict[str, torch.Tensor], weight: float, *, lora: bool
) -> dict[str, torch.Tensor]:
    """``start + weight × (adapted − start)`` per tensor (weight-space ensembling). With LoRA the update is
    ``B·A`` and ``B`` starts at zero: scaling ``B`` (and any other tensor that starts at zero) by ``weight`` scales
    the update exactly, where interpolating ``A`` too would scale it by ``weight²``."""
    if set(start) != set(adapted):
        raise AdaptError(f"{START_STATE_FILE}: its tensors are not the trained ones; start the run again")
    merged = {}
    for name, new in adapted.items():
        if start[name].shape != new.shape:
            raise AdaptError(
                f"{START_STATE_FILE}: {name} has shape {tuple(start[name].shape)}, the trained one "
                f"{tuple(new.shape)}; start the run again"
            )
        old = start[name].to(device=new.device, dtype=new.dtype)
        if lora and "lora_A" in name:
            merged[name] = new
        else:
            merged[name] = old + weight * (new - old)
    return merged


def _load_teacher(
    teacher: str | Any | None, embedder: Embedder, device: str, docs: Sequence[Document], recipe: AdaptRecipe
) -> Any:
    if teacher is None or not isinstance(teacher, str):
        return teacher
    if teacher == "self":
        return embedder
    if teacher == "hybrid":  # on the starting model, which mined the rows it labels
        weight, batch = recipe.training.hybrid_weight, recipe.mining.batch_size
        return HybridTeacher(embedder, docs, weight, batch, mined_by_embedder=True)
    if teacher.startswith("reranker:"):
        from lmembed.rerank import load_reranker

        return load_reranker(teacher.removeprefix("reranker:"))
    return Embedder.from_pretrained(teacher, device=device, show_progress=False)


def _ranks_corpus(teacher: str | Any | None) -> bool:
    """Whether ``teacher`` can rank a whole corpus (``hybrid``, ``self``, an embedder; not a reranker)."""
    if teacher is None:
        return False
    if isinstance(teacher, str):
        return not teacher.startswith("reranker:")
    return isinstance(teacher, HybridTeacher) or hasattr(teacher, "encode_corpus")


def _check_ranking_teacher(recipe: AdaptRecipe, teacher: str | Any | None) -> None:
    """Refuse, before anything is written, a recipe key that needs a teacher ranking the corpus without one."""
    wants = [
        ("mining.candidates", recipe.mining.candidates, "model"),
        ("selection.metric", recipe.selection.metric, "own"),
    ]
    for key, value, other in wants:
        if value == "teacher" and not _ranks_corpus(teacher):
            what = "no --teacher" if teacher is None else f"the teacher {teacher!r} (a reranker)"
            raise AdaptError(
                f"{key} is 'teacher' but {what} can rank the whole corpus: give --teacher hybrid, self or an "
                f"embedder, or set {key} to '{other}'"
            )


def _candidate_teacher(
    teacher: str | Any | None, embedder: Embedder, device: str, docs: Sequence[Document], recipe: AdaptRecipe
) -> HybridTeacher:
    """The teacher that ranks the whole corpus (``mining.candidates: teacher`` draws each query's candidates with
    it, ``selection.metric: teacher`` follows its ranking): ``hybrid``, or an embedder (``self``, a name, or an
    Embedder) ranking the corpus by cosine (checked beforehand by :func:`_check_ranking_teacher`)."""
    loaded = _load_teacher(teacher, embedder, device, docs, recipe)
    if isinstance(loaded, HybridTeacher):
        return loaded
    return HybridTeacher(loaded, docs, weight=0.0, batch_size=recipe.mining.batch_size)


def make_queries(
    docs: list[Document], recipe: AdaptRecipe, embedder: Any, output: Path, generator: Any | None
) -> tuple[list[PseudoQuery], dict[str, Any]]:
    """Every enabled source's pseudo-queries, and what each made."""
    made: list[PseudoQuery] = []
    report: dict[str, Any] = {}
    src = recipe.sources
    titled: set[int] = set()
    if src.titles.enabled:
        titles = title_queries(docs, src.titles.min_words, src.titles.unique)
        report["titles"] = {"made": len(titles)}
        made += titles
        titled = {q.doc for q in titles}
    if src.crops.enabled:
        c = src.crops
        crops = crop_queries(
            docs,
            per_document=c.per_document,
            min_words=c.min_words,
            max_words=c.max_words,
            min_rest_words=c.min_rest_words,
            seed=recipe.seed,
            skip=titled if c.only_untitled else (),
        )
        report["crops"] = {"made": len(crops)}
        made += crops
    if generator is not None:
        from lmembed.synthesis.retrieval import embedder_encode

        g = src.generator
        generated, stats = generated_queries(
            docs,
            generator,
            embedder_encode(embedder),
            output / "generated.jsonl",
            recipe=g.recipe,
            limit=g.limit,
            shard_size=g.shard_size,
            seed=recipe.seed,
        )
        report["generator"] = {"made": len(generated), "synthesize": stats}
        made += generated
    return made, report


def attach_terms(
    model_dir: Path,
    docs: Sequence[Document],
    recipe: AdaptRecipe,
    device: str = "cpu",
    kept: Mapping[str, Any] | None = None,
) -> Embedder:
    """Fit the recipe's term channel on the corpus to the model saved in ``model_dir`` and save the model again
    with it, in place and atomically (the folder no longer carries sentence-transformers' files: that library
    would read the model without its channel). Returns the model with its channel, loaded on ``device`` (where
    the run trained: the held-back queries are scored with it there)."""
    embedder = Embedder.from_pretrained(str(model_dir), device=device, cache=False, show_progress=False)
    return _save_with_terms(embedder, docs, recipe, model_dir, kept)


def _save_with_terms(
    embedder: Embedder,
    docs: Sequence[Document],
    recipe: AdaptRecipe,
    model_dir: Path,
    kept: Mapping[str, Any] | None = None,
) -> Embedder:
    """``embedder`` with the recipe's term channel fitted on the corpus, saved to ``model_dir`` atomically."""
    fitted = embedder.fit_terms([d.full for d in docs], dims=recipe.terms.dims, weight=recipe.terms.weight)
    record = TrainingRecord(
        {
            "adapted with": "lmembed adapt: training rows made from the corpus alone",
            "query sources": ", ".join(recipe.source_names),
            "corpus documents": len(docs),
            **(kept or {"training": "none: the model as it was, with the term channel"}),
            "term channel": f"{recipe.terms.dims} buckets, weight {recipe.terms.weight}",
            "seed": recipe.seed,
        },
        ("wang2022gpl", *(("lee2019ict",) if "crops" in recipe.source_names else ())),  # crops: inverse cloze
    )
    with atomic_folder(model_dir) as tmp:
        fitted.save(tmp, training=record, name=model_dir.name)
    return fitted


def _starting_model(model: str | Embedder, device: str) -> tuple[Embedder, str]:
    """The model to adapt and the name the summary gives it (``device`` auto: a GPU when there is one)."""
    if isinstance(model, Embedder):
        return model, "(given)"
    where = "cpu" if device == "auto" and not torch.cuda.is_available() else device
    where = "cuda" if where == "auto" else where
    return Embedder.from_pretrained(model, device=where, cache=False, show_progress=False), str(model)


def read_held_back(path: Path, docs: Sequence[Document]) -> list[PseudoQuery]:
    """The held-back pseudo-queries a run wrote to ``path`` (``heldout.jsonl``), against ``docs``: each with the
    positive it would have trained on (a run written before positives were recorded: its whole document)."""
    index = {d.id: i for i, d in enumerate(docs)}
    rows = read_rows(path)
    held = []
    for r in rows:
        doc = index[r["doc_id"]]
        positive = r.get("positive", docs[doc].full)
        if not isinstance(positive, str) or not positive:
            raise AdaptError(f"{path}: a held-back query's positive must be a non-empty string")
        held.append(PseudoQuery(r["query"], positive, doc, r["source"]))
    return held


#: history[0]'s keys for the check half's scores of the starting model
CHECK_PREFIX = "check_"


def _held_rows(held: Sequence[PseudoQuery], docs: Sequence[Document]) -> list[dict[str, Any]]:
    return [{"query": q.query, "doc_id": docs[q.doc].id, "source": q.source, "positive": q.positive} for q in held]


def _prefixed(scores: dict[str, float], prefix: str) -> dict[str, float]:
    return {f"{prefix}{name}": value for name, value in scores.items()}


def run_terms_only(
    model: str | Embedder, corpus: str | Path, output: str | Path, *, recipe: AdaptRecipe, device: str = "auto"
) -> AdaptResult:
    """The model as it is, with the recipe's term channel fitted on ``corpus`` (no pseudo-queries, no training):
    ``OUTPUT/model`` and a summary of the channel, the time and the peak memory."""
    started = time.perf_counter()
    output = Path(output)
    docs = read_adapt_corpus(corpus)  # bad input is refused before anything is written
    _check_output(output, resume=False)
    embedder, model_name = _starting_model(model, device)
    model_dir = output / MODEL_DIR
    fitted = _save_with_terms(embedder, docs, recipe, model_dir)
    assert fitted.config.terms is not None
    summary = {
        "model": model_name,
        "corpus": str(corpus),
        "corpus_digest": corpus_digest(docs),
        "documents": len(docs),
        "terms_only": True,
        "terms": asdict(fitted.config.terms),
        "seconds": round(time.perf_counter() - started, 2),
        "peak_memory_mb": peak_memory_mb(),
        "model_dir": str(model_dir),
    }
    write_json(output / SUMMARY_FILE, summary)
    return AdaptResult(output, model_dir, summary)


def _check_output(output: Path, resume: bool) -> None:
    if resume:
        return
    if (output / SUMMARY_FILE).exists() or ckpt.list_checkpoints(output) or (output / PLAN_FILE).exists():
        raise AdaptError(
            f"{output} already holds an adapt run; pass --resume to continue it, or choose another output folder"
        )


def run_adapt(
    model: str | Embedder,
    corpus: str | Path,
    output: str | Path,
    *,
    recipe: AdaptRecipe | str | Path | None = None,
    generator: Any | None = None,
    teacher: str | Any | None = None,
    resume: bool = False,
    steps: int | None = None,
    batch_size: int | None = None,
    device: str = "auto",
    lora: bool | None = None,
    progress: bool = True,
) -> AdaptResult:
    """Adapt ``model`` to ``corpus`` into ``output`` (see :mod:`lmembed.training.adapt`). ``model`` is a name,
    a folder, or an Embedder; ``teacher`` an embedder's name, ``self``, ``reranker:NAME`` or a ready object."""
    started = time.perf_counter()
    recipe = recipe if isinstance(recipe, AdaptRecipe) else load_adapt_recipe(recipe)
    output = Path(output)
    docs = read_adapt_corpus(corpus)  # bad input is refused before anything is written
    _check_output(output, resume)
    _check_ranking_teacher(recipe, teacher)
    training = recipe.training
    steps = steps or training.steps
    batch_size = batch_size or training.batch_size
    embedder, model_name = _starting_model(model, device)
    created = not output.exists()
    output.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(output / LOG_FILE)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    root = logging.getLogger("lmembed")
    level = root.level
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)
    try:
        return _run(
            docs,
            recipe,
            embedder,
            model_name,
            corpus,
            output,
            generator,
            teacher,
            resume,
            steps,
            batch_size,
            device,
            lora,
            progress,
            started,
        )
    except LmembedError:
        kept = [output / PLAN_FILE, output / "generated.jsonl.parts"]  # rows made, or a generator's resumable shards
        if created and not any(p.exists() for p in kept):  # refused before anything worth keeping: leave nothing
            root.removeHandler(handler)
            handler.close()
            shutil.rmtree(output, ignore_errors=True)
        raise
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()


def _run(
    docs: list[Document],
    recipe: AdaptRecipe,
    embedder: Embedder,
    model_name: str,
    corpus: str | Path,
    output: Path,
    generator: Any | None,
    teacher: str | Any | None,
    resume: bool,
    steps: int,
    batch_size: int,
    device: str,
    lora: bool | None,
    progress: bool,
    started: float,
) -> AdaptResult:
    training = recipe.training
    teacher_name = teacher if isinstance(teacher, str) or teacher is None else type(teacher).__name__
    plan = {
        "model": model_name,
        "corpus": str(corpus),
        "corpus_digest": corpus_digest(docs),
        "documents": len(docs),
        "recipe": recipe.model_dump(),
        "generator": None if generator is None else getattr(generator, "name", type(generator).__name__),
        "teacher": teacher_name,
    }
    timings: dict[str, float] = {}
    plan_path = output / PLAN_FILE
    drawn: HybridTeacher | None = None  # a teacher that ranks the corpus, once built
    if resume and plan_path.exists():
        saved = read_checked_json(plan_path, _Plan, AdaptError, "an adapt run's plan")
        changed = [k for k in plan if saved.get(k) != plan[k]]
        if changed:
            raise AdaptError(
                f"{plan_path}: the run in {output} was made with another {', '.join(changed)}; resume it with the "
                "same options, or choose another output folder"
            )
        # the rows and held-back queries are read back as they were made (_Plan requires their digests)
        made = [ROWS_FILE, HELDOUT_FILE]
        check_recorded_files(output, plan_path, saved["files"], made, key="files", error=AdaptError)
        rows = read_rows(output / ROWS_FILE)
        held = read_held_back(output / HELDOUT_FILE, docs)
        report = saved["report"]
    else:
        t0 = time.perf_counter()
        made, sources = make_queries(docs, recipe, embedder, output, generator)
        kept, dropped = filter_queries(
            made, max_copied=recipe.filters.max_copied, min_words=recipe.filters.min_query_words
        )
        train_q, held = hold_back(kept, recipe.selection.fraction, recipe.selection.max_queries, recipe.seed)
        timings["queries_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        if recipe.mining.candidates == "teacher":  # the teacher draws and scores each query's candidates
            drawn = _candidate_teacher(teacher, embedder, device, docs, recipe)
            rows = drawn.candidate_rows(train_q, recipe.mining.k)
            mining = {"candidates": "teacher", "k": recipe.mining.k, "rows": len(rows)}
        elif training.num_negatives == 0 and teacher is None:  # in-batch negatives only: nothing to mine
            rows, mining = unmined_rows(train_q, docs), {"skipped": "training.num_negatives is 0"}
        else:
            options = recipe.mining.model_dump(exclude={"candidates", "sources"})  # the rest: mine_rows' options
            # without a teacher only mining.sources' rows are mined; a teacher's scores label every row's negatives
            mined = None if teacher is not None else recipe.mining.sources
            rows, stats = mine_rows(embedder, train_q, docs, **options, sources=mined)
            mining = {**stats.to_dict(), "unmined": len(rows) - stats.queries}
        timings["mining_s"] = round(time.perf_counter() - t0, 2)
        if teacher is not None and recipe.mining.candidates == "model":
            t0 = time.perf_counter()
            labeller = _load_teacher(teacher, embedder, device, docs, recipe)
            drawn = labeller if isinstance(labeller, HybridTeacher) else None
            rows = label_rows(rows, labeller, max(1, training.num_negatives), reranker_scale=training.reranker_scale)
            timings["labels_s"] = round(time.perf_counter() - t0, 2)
            if not rows:
                raise AdaptError("no row kept a mined negative to label with the teacher: mining.k is too strict")
        report = {
            "sources": sources,
            "dropped": dict(dropped),
            "kept": len(kept),
            "train_rows": len(rows),
            "held_back": len(held),
            "by_source": dict(Counter(r["provenance"]["source"] for r in rows)),
            "mining": mining,
        }
        scales = {r["provenance"]["teacher_scale"] for r in rows if "teacher_scale" in r["provenance"]}
        if scales:  # a reranker's logits put on the student's scale (label_rows)
            report["teacher_scale"] = scales.pop()
        write_rows(rows, output / ROWS_FILE)
        write_rows(_held_rows(held, docs), output / HELDOUT_FILE)
        files = {name: sha256_file(output / name) for name in (ROWS_FILE, HELDOUT_FILE)}
        write_json(plan_path, {**plan, "report": report, "files": files})
    log.info("adapt: %s", json.dumps(report))
    selecting, checking = split_check(held, recipe.seed)
    held_out = HeldOut.build(selecting, docs, recipe.selection.max_documents, recipe.seed)
    check = HeldOut.build(checking, docs, recipe.selection.max_documents, recipe.seed) if checking else None
    metric = "ndcg_at_10"
    if recipe.selection.metric == "teacher":  # agreement with the teacher's ranking picks the step
        held_out.follow(drawn or _candidate_teacher(teacher, embedder, device, docs, recipe), training.temperature)
        metric = "teacher_ndcg_at_10"
    examples = [parse_row({k: v for k, v in r.items() if k != "provenance"}) for r in rows]
    dataset = TrainDataset("adapt", examples, sorted({d.full for d in docs}))
    loss = training.teacher_loss if teacher is not None else training.loss
    config = TrainConfig(
        model=model_name,
        output=str(output),
        steps=steps,
        batch_size=batch_size,
        lr=training.lr,
        warmup_steps=min(training.warmup_steps, steps - 1) if steps > 1 else 0,
        temperature=training.temperature if reads_temperature(loss) else None,  # margin_mse has none
        num_negatives=max(1, training.num_negatives) if teacher is not None else training.num_negatives,
        loss=loss,
        save_every=min(recipe.selection.every, steps),
        seed=recipe.seed,
        device=device,
        lora=lora,
        resume=resume and bool(ckpt.list_checkpoints(output)),
        progress=progress,
    )
    trainer = _SelectingTrainer(
        config,
        held_out,
        min(recipe.selection.every, steps),
        training.merge,
        metric,
        model=embedder,
        datasets=[dataset],
    )
    trainer.model.train_max_length = training.max_length
    uses_lora = trainer.model.uses_lora  # before the saved model merges the adapters in (then it has none)
    trainer.keep_start()
    if not config.resume:  # a resumed run reads its selection history back (_SelectingTrainer.resume)
        t0 = time.perf_counter()
        trainer.model.eval()
        with torch.no_grad():
            before = held_out.score(trainer.model.embedder)
            if check is not None:  # kept in history[0], so a resumed run still has the start's check scores
                before |= _prefixed(check.score(trainer.model.embedder), CHECK_PREFIX)
        trainer.model.train()
        timings["score_before_s"] = round(time.perf_counter() - t0, 2)
        trainer.start_selection(before)
    t0 = time.perf_counter()
    result = trainer.train()
    timings["train_s"] = round(time.perf_counter() - t0, 2)
    history = trainer.history
    best = trainer.best()
    merged = best
    if training.merge < 1.0 and best["step"] > 0:  # the saved (merged) weights, scored like every step
        trainer.model.eval()
        with torch.no_grad():
            merged = {"step": best["step"], "merge": training.merge, **held_out.score(trainer.model.embedder)}
    assert result.model_dir is not None
    checked = None
    start = {k.removeprefix(CHECK_PREFIX): v for k, v in history[0].items() if k.startswith(CHECK_PREFIX)}
    # a run resumed from one begun before check halves existed has no start scores for it: no check half then
    if check is not None and start:  # the saved weights (trainer.model holds them now) on queries that picked nothing
        trainer.model.eval()
        with torch.no_grad():
            saved = check.score(trainer.model.embedder)
        checked = {
            "queries": len(checking),
            "documents": len({q.doc for q in checking}),
            "before": start,
            "saved": saved,
        }
    terms = None
    if recipe.terms.enabled:
        t0 = time.perf_counter()
        kept = {
            "steps trained": steps,
            "kept step": best["step"]
            if best["step"]
            else "0: the starting weights (no step retrieved the held-back pseudo-queries better)",
            "merged with the start": training.merge,
        }
        with_terms = attach_terms(Path(result.model_dir), docs, recipe, device=str(trainer.model.device), kept=kept)
        terms = {
            **asdict(with_terms.config.terms),  # type: ignore[arg-type]
            "saved_scores": held_out.score(with_terms),
        }
        if checked is not None:
            checked["saved_with_terms"] = check.score(with_terms)  # type: ignore[union-attr]
        timings["terms_s"] = round(time.perf_counter() - t0, 2)
        log.info("adapt: term channel fitted (%s)", _scores_text(terms["saved_scores"]))
    summary = {
        **plan,
        "report": report,
        "terms": terms,
        "selection": {
            "history": history,
            "before": history[0],
            "after": best,
            "saved": merged,
            "best_step": best["step"],
            "last_step": result.end_step,
            "queries": len(selecting),
            # the held-back queries that picked nothing: their before -> saved is the unbiased measure
            "check": checked,
        },
        "steps": steps,
        "batch_size": batch_size,
        "lora": uses_lora,
        "seconds": round(time.perf_counter() - started, 2),
        "timings": timings,
        "peak_memory_mb": peak_memory_mb(),
        "model_dir": str(result.model_dir),
    }
    write_json(output / SUMMARY_FILE, summary)
    return AdaptResult(output, result.model_dir, summary)
