"""Save and load :class:`TaskResult` files in MTEB's results layout.

Files go to ``OUT/<model name, "/" → "__">/<strategy folder>/<TaskName>.json``: the layout of
MTEB's results repository, with the strategy's folder (:func:`strategy_dir_name`: its label and a digest of the
whole strategy, plus the chunking and instruction table where a plain run has none, and the backend and precision
where they are not the reference's, torch at float32) where MTEB puts the model revision. Each file is
a valid MTEB 2.x task result (``dataset_revision``, ``task_name``, ``mteb_version``,
``evaluation_time``, ``scores: {split: [{"hf_subset", "languages", "main_score", ...}]}``), so
``mteb.results.TaskResult.from_disk`` reads it. ``mteb_version`` is ``null`` because MTEB did
not produce the file; lmembed's own record (version, model, strategy, task type, timings) sits
under the extra top-level key ``"lmembed"``, which MTEB ignores.

Files written by MTEB itself can be read back too (:func:`read_result`); what they lack (task
type, strategy) is inferred from the path and the task registry (:mod:`lmembed.task_registry`).
A result file is checked (:class:`ResultFile`) before anything in it is used: one of another shape is refused by
:func:`read_result` naming the file and the field, and :func:`load_results` skips it with a warning that says so;
so is a damaged one (not UTF-8 or not JSON: a file cut short) and a JSON array of results. JSON files that are not
task results at all (a report's or a model's metadata) are skipped quietly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, StrictInt, ValidationError, field_validator

from lmembed import __version__
from lmembed.atomic import atomic_write_text
from lmembed.errors import LmembedError
from lmembed.evaluation.base import TaskResult
from lmembed.io import READ_WITH_WRITER, DataFormatError, DuplicateKeyError, check_format, loads_json, read_text
from lmembed.schema import RecordModel, first_problem
from lmembed.task_registry import task_type_of

logger = logging.getLogger(__name__)

LMEMBED_KEY = "lmembed"
#: the layout of lmembed's record in a result file (its ``lmembed.format``; a record without one is of 1)
RESULT_FORMAT = 1
DEFAULT_LANGUAGES = ["eng-Latn"]

_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")
_MAX_SLUG = 100
#: The backend and precision scores are checked against (MTEB's own run): a result of this run keeps its strategy's
#: folder; one of another backend or precision (``--backend onnx``, ``--precision int8``) is kept apart and labelled.
REFERENCE_RUNTIME = ("torch", "float32")


def model_dir_name(model_name: str) -> str:
    """MTEB's folder name for a model: ``org/model`` → ``org__model``."""
    name = (model_name or "unknown-model").strip().replace("/", "__").replace(" ", "_")
    return _SLUG_UNSAFE.sub("-", name)


def strategy_slug(strategy: Mapping[str, Any] | str | None) -> str:
    """A short, path-safe name for an embedding strategy.

    A string is used as is (made path-safe); a mapping uses its ``"slug"`` or ``"name"`` entry if
    present, otherwise its sorted ``key=value`` pairs. Long slugs are cut and suffixed with a hash
    of the full text so that they stay unique.
    """
    if not strategy:
        return "default"
    if isinstance(strategy, str):
        text = strategy
    elif isinstance(strategy.get("slug"), str):
        text = strategy["slug"]
    elif isinstance(strategy.get("name"), str):
        text = strategy["name"]
    else:
        text = "_".join(f"{k}={_compact(v)}" for k, v in sorted(strategy.items()))
    slug = _SLUG_UNSAFE.sub("-", text).strip("-.") or "default"
    if len(slug) > _MAX_SLUG:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        slug = f"{slug[: _MAX_SLUG - 11]}-{digest}"
    return slug


def runtime_record(encoder: Any) -> dict[str, str] | None:
    """What ran ``encoder``'s transformer, as a result records it (``extra["runtime"]``):
    ``{"backend": "onnx", "precision": "int8"}``; None for an encoder without a backend (a test double)."""
    from lmembed.encoding.backends import Backend  # lazy: reading and reporting results needs no torch

    runs = getattr(encoder, "backend", None)  # an Embedder's; encoders of other kinds have none
    if not isinstance(runs, Backend):
        return None
    return {"backend": runs.name, "precision": runs.precision}


def record_strategy(
    result: TaskResult, strategy: Mapping[str, Any], label: str, runtime: dict[str, str] | None
) -> None:
    """Stamp on ``result`` what produced it: its ``strategy``, the ``label`` it is shown under and the backend and
    precision that ran the model (:func:`runtime_record`, None: not recorded): what names its folder."""
    result.strategy = dict(strategy)
    result.extra["strategy_label"] = label
    if runtime is not None:
        result.extra["runtime"] = dict(runtime)


def result_runtime(result: TaskResult) -> tuple[str, str] | None:
    """``(backend, precision)`` of a result run otherwise than the reference (:data:`REFERENCE_RUNTIME`, torch at
    float32); None for a reference run, and for a result that records no runtime (written by MTEB, or before lmembed
    recorded it: those ran on torch at float32)."""
    runtime = result.extra.get("runtime")
    if not isinstance(runtime, Mapping):
        return None
    backend = str(runtime.get("backend") or REFERENCE_RUNTIME[0])
    precision = str(runtime.get("precision") or REFERENCE_RUNTIME[1])
    return None if (backend, precision) == REFERENCE_RUNTIME else (backend, precision)


def result_reading(result: TaskResult) -> list[tuple[str, str]]:
    """How a result's texts were read where it differs from a plain run, as ``(folder tag, label)`` pairs: its
    documents chunked (``extra["settings"]["chunking"]``, ``--chunking``: ``("maxp64-32", "maxp 64/32")``, ``late``
    after a late-chunked one) and its instructions chosen from a table other than the plain run's
    (``extra["instructions"]``, ``--instructions e5``: ``("instr-e5", "instructions e5")``). Empty for a plain run
    (documents truncated at the model's window, the default instructions) and for a result that records neither."""
    parts: list[tuple[str, str]] = []
    settings = result.extra.get("settings")
    chunking = settings.get("chunking") if isinstance(settings, Mapping) else None
    if isinstance(chunking, Mapping):
        aggregate, tokens, overlap = chunking.get("aggregate"), chunking.get("tokens"), chunking.get("overlap")
        late = chunking.get("late") is True
        tag = f"{aggregate}{tokens}-{overlap}{'-late' if late else ''}"
        parts.append((tag, f"{aggregate} {tokens}/{overlap}{' late' if late else ''}"))
    instructions = result.extra.get("instructions")
    if isinstance(instructions, str) and instructions:
        parts.append((f"instr-{instructions}", f"instructions {instructions}"))
    return parts


def _variants(result: TaskResult) -> list[tuple[str, str]]:
    """What tells a result's run from a plain one of its strategy, as ``(folder tag, label)`` pairs: how its texts
    were read (:func:`result_reading`), then the backend and precision where they are not the reference's
    (``("onnx-int8", "onnx int8")``)."""
    runtime = result_runtime(result)
    return result_reading(result) + ([("-".join(runtime), " ".join(runtime))] if runtime else [])


def variant_tag(result: TaskResult) -> str:
    """:func:`_variants` as a result's folder carries them after the label: ``maxp64-32+onnx-int8``; ``""`` for a
    plain run on the reference."""
    return "+".join(tag for tag, _ in _variants(result))


def _own_label(result: TaskResult) -> str | None:
    label = result.extra.get("strategy_label")
    return label if isinstance(label, str) and label else None


def strategy_label(result: TaskResult) -> str:
    """How a result's strategy is shown in tables and charts: the label it was evaluated under
    (``EmbeddingConfig.label``, e.g. ``mean@-1+bidir``, kept in ``extra["strategy_label"]``), or the slug of its
    strategy for a result that has none; followed by how its texts were read where a plain run reads them otherwise
    (:func:`result_reading`) and the backend and precision where they are not the reference's
    (``mean@-1+bidir (onnx int8)``, ``mean@-1+bidir (maxp 64/32)``, ``mean@-1+bidir (instructions e5)``)."""
    label = _own_label(result) or strategy_slug(result.strategy)
    parts = [text for _, text in _variants(result)]
    return f"{label} ({', '.join(parts)})" if parts else label


def strategy_digest(strategy: Mapping[str, Any] | str | None) -> str:
    """Eight hex digits of the whole strategy: what tells apart two strategies that share a label (they may differ
    in a field the label leaves out, such as ``max_length``)."""
    return hashlib.sha256(json.dumps(strategy, sort_keys=True, default=str).encode()).hexdigest()[:8]


def strategy_dir_name(result: TaskResult) -> str:
    """The folder of a result's strategy: its label made path-safe, then :func:`strategy_digest` (so strategies that
    share a label keep apart); the slug of the strategy for a result without a label. A result read otherwise than a
    plain run (chunked documents, instructions of another table: :func:`result_reading`) or run on another backend
    or precision than the reference's (torch at float32) has them after the label (:func:`variant_tag`:
    ``mean--1+bidir+maxp64-32-4083e8f1``, ``mean--1+bidir+instr-e5-4083e8f1``, ``mean--1+bidir+onnx-int8-4083e8f1``),
    so it never replaces the plain run's file; a plain reference run's folder is the one it always was."""
    tag = variant_tag(result)
    suffix = f"+{tag}" if tag else ""
    label = result.extra.get("strategy_label")
    if not isinstance(label, str):
        slug = strategy_slug(result.strategy)
        return strategy_slug(f"{slug}{suffix}") if suffix else slug
    return strategy_slug(
        f"{_own_label(result) or strategy_slug(result.strategy)}{suffix}-{strategy_digest(result.strategy)}"
    )


def _compact(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "+".join(_compact(v) for v in value)
    if isinstance(value, Mapping):
        return "+".join(f"{k}-{_compact(v)}" for k, v in sorted(value.items()))
    return str(value)


def result_path(out_dir: str | Path, result: TaskResult) -> Path:
    """Where :func:`write_result` puts ``result``."""
    return Path(out_dir) / model_dir_name(result.model_name) / strategy_dir_name(result) / f"{result.task_name}.json"


def _clean(value: Any) -> Any:
    """Make a value JSON-safe: numpy scalars → Python, non-finite floats → None, paths → str."""
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays and scalars
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def to_mteb_dict(result: TaskResult) -> dict[str, Any]:
    """The JSON object written for ``result``."""
    extra = dict(result.extra)
    languages = list(extra.get("languages") or DEFAULT_LANGUAGES)
    entry = {
        **{k: v for k, v in result.scores.items() if k != "main_score"},
        "main_score": result.scores["main_score"],
        "hf_subset": result.subset,
        "languages": languages,
    }
    return _clean(
        {
            "dataset_revision": str(extra.get("dataset_revision") or "unknown"),
            "task_name": result.task_name,
            "mteb_version": None,
            "scores": {result.split: [entry]},
            "evaluation_time": result.evaluation_time,
            "kg_co2_emissions": None,
            LMEMBED_KEY: {
                "format": RESULT_FORMAT,
                "version": __version__,
                "model_name": result.model_name,
                "strategy": result.strategy,
                "strategy_slug": strategy_slug(result.strategy),
                "task_type": result.task_type,
                "main_metric": result.main_metric,
                "split": result.split,
                "subset": result.subset,
                "extra": extra,
            },
        }
    )


def write_result(result: TaskResult, out_dir: str | Path) -> Path:
    """Write ``result`` under ``out_dir`` in MTEB's layout; return the file path."""
    path = result_path(out_dir, result)
    atomic_write_text(path, json.dumps(to_mteb_dict(result), indent=2, ensure_ascii=False) + "\n")
    return path


def _pick_split(scores: Mapping[str, Any], preferred: str | None) -> str:
    if preferred and preferred in scores:
        return preferred
    for split in ("test", "validation", "dev"):
        if split in scores:
            return split
    return next(iter(scores))


def _pick_entry(entries: list[Mapping[str, Any]], subset: str | None) -> Mapping[str, Any]:
    for entry in entries:
        if entry.get("hf_subset") == (subset or "default"):
            return entry
    return entries[0]


def _numeric(entry: Mapping[str, Any]) -> dict[str, float]:
    """The entry's finite numbers by metric (a NaN metric, which MTEB's writer may leave, is as absent)."""
    return {
        k: float(v)
        for k, v in entry.items()
        if isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
        and k not in {"hf_subset", "languages"}
    }


class ResultFileError(LmembedError, ValueError):
    """A task result file (it names a task and holds scores) whose fields are not of MTEB's layout."""


class _Scores(RecordModel):
    """One split's entry for one subset: numbers by metric name (the main score a finite number, not text)."""

    main_score: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-1e3, le=1e3)] | None = None
    hf_subset: str = "default"
    languages: list[str] | None = None


class LmembedRecord(RecordModel):
    """lmembed's own record under :data:`LMEMBED_KEY`."""

    format: StrictInt = RESULT_FORMAT  # checked by read_result before the rest
    split: str | None = None
    subset: str | None = None
    task_type: str | None = None
    main_metric: str | None = None
    model_name: str | None = None
    strategy: dict[str, Any] | str | None = None
    extra: dict[str, Any] | None = None


class ResultFile(RecordModel):
    """The fields of a result file that :func:`read_result` reads (MTEB 2.x's layout, lmembed's record beside)."""

    task_name: str
    scores: dict[str, list[_Scores]] = Field(min_length=1)  # a split's single entry (MTEB 1.x) reads as a list
    evaluation_time: float | None = None
    dataset_revision: str | None = None
    lmembed: LmembedRecord | None = None

    @field_validator("scores", mode="before")
    @classmethod
    def _entries_as_lists(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {split: v if isinstance(v, list) else [v] for split, v in value.items()}
        return value


def read_result(path: str | Path) -> TaskResult:
    """Load one result file (ours or MTEB's) as a :class:`TaskResult`."""
    path = Path(path)
    try:
        data = loads_json(read_text(path))
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, exc.lineno, f"invalid JSON ({exc.msg} at column {exc.colno})") from exc
    except DuplicateKeyError as exc:
        raise DataFormatError(path, None, str(exc)) from exc
    except RecursionError:
        raise DataFormatError(path, None, "nests arrays or objects too deeply to read") from None
    if isinstance(data, list) and any(isinstance(item, dict) and "task_name" in item for item in data):
        raise ResultFileError(f"{path}: a JSON array of results; a result file holds one result, a JSON object")
    if not isinstance(data, dict) or "task_name" not in data or "scores" not in data:
        raise ValueError(f"{path} is not a task result file")
    form = data[LMEMBED_KEY].get("format", RESULT_FORMAT) if isinstance(data.get(LMEMBED_KEY), dict) else RESULT_FORMAT
    check_format(
        path, f"{LMEMBED_KEY}.format", form, RESULT_FORMAT, "result records", ResultFileError, READ_WITH_WRITER
    )
    try:
        ResultFile.model_validate(data)
    except ValidationError as exc:
        raise ResultFileError(f"{path}: {first_problem(exc)} (not a task result in MTEB's layout)") from exc
    meta: Mapping[str, Any] = data.get(LMEMBED_KEY) or {}
    split = _pick_split(data["scores"], meta.get("split"))
    entries = data["scores"][split]
    entries = entries if isinstance(entries, list) else [entries]
    if not entries:
        raise ResultFileError(f"{path}: scores.{split}: no entry (not a task result in MTEB's layout)")
    entry = _pick_entry(entries, meta.get("subset"))
    if entry.get("main_score") is None:
        raise ResultFileError(f"{path}: scores.{split}: no main_score (not a task result in MTEB's layout)")
    task_name = str(data["task_name"])
    extra = dict(meta.get("extra") or {})
    extra.setdefault("languages", list(entry.get("languages") or []))
    extra.setdefault("dataset_revision", data.get("dataset_revision"))
    extra["source_path"] = str(path)
    return TaskResult(
        task_name=task_name,
        task_type=str(meta.get("task_type") or task_type_of(task_name) or "Unknown"),
        split=split,
        scores=_numeric(entry),
        main_metric=str(meta.get("main_metric") or "main_score"),
        subset=str(entry.get("hf_subset", "default")),
        evaluation_time=float(data.get("evaluation_time") or 0.0),
        model_name=str(meta.get("model_name") or path.parent.parent.name.replace("__", "/")),
        strategy=meta.get("strategy") or ({} if meta else {"slug": path.parent.name}),
        extra=extra,
    )


@dataclass
class ResultScan:
    """What :func:`scan_results` found: the results, and the files it left out aloud (``<file>: why``)."""

    results: list[TaskResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def scan_results(results_dir: str | Path) -> ResultScan:
    """Every task result file under ``results_dir``; one that is damaged (not JSON: cut short) or claims to be a
    result but is not of MTEB's layout is skipped with a warning naming it, and listed in ``skipped``. Other JSON
    files (a report's, a model's metadata) are skipped quietly."""
    scan = ResultScan()
    for path in sorted(Path(results_dir).rglob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            scan.results.append(read_result(path))
        except (ResultFileError, DataFormatError) as exc:  # a result the user should know is left out, or damaged
            logger.warning("skipping %s", exc)
            scan.skipped.append(str(exc))
        except ValueError as exc:  # another JSON file (a report's, a model's metadata)
            logger.debug("skipping %s: %s", path, exc)
    return scan


def load_results(results_dir: str | Path) -> list[TaskResult]:
    """Every task result file under ``results_dir`` (:func:`scan_results`: damaged ones are skipped aloud, other
    JSON files quietly)."""
    return scan_results(results_dir).results


def markdown_cell(value: Any) -> str:
    """``value`` as one cell of a Markdown table: on one line, its ``|`` escaped (a model name from a result file
    written elsewhere could otherwise end the row or add columns)."""
    return " ".join(str(value).split()).replace("|", "\\|")


def results_markdown(results: Iterable[TaskResult], *, percent: bool = True) -> str:
    """A Markdown table with one row per result: model, strategy, task, type, split, score, time."""
    header = "| model | strategy | task | type | split | main metric | main score | eval time (s) |"
    lines = [header, "|---|---|---|---|---|---|---:|---:|"]
    ordered = sorted(results, key=lambda r: (r.model_name, strategy_label(r), r.task_type, r.task_name))
    for r in ordered:
        score = r.main_score * 100 if percent else r.main_score
        cells = [r.model_name, strategy_label(r), r.task_name, r.task_type, r.split, r.main_metric]
        cells += [f"{score:.2f}", f"{r.evaluation_time:.1f}"]
        lines.append("| " + " | ".join(markdown_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
