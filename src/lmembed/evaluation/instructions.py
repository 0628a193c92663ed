"""Per-task instructions for instruction-tuned embedders (E5-mistral, NV-Embed).

An instruction is a one-sentence task definition. The encoder wraps it in its template (NV-Embed
and E5-mistral use ``"Instruct: {task_definition}\\nQuery: "``, see :data:`DEFAULT_TEMPLATE` and
:func:`format_instruction`) and, where it can, keeps the instruction tokens out of the pooled
embedding. Task code only passes the bare definition, through ``encode_queries(...,
instruction=...)``.

Which texts get it (:func:`instruction_sides`):

* retrieval and reranking: the queries only; documents are embedded as they are;
* symmetric tasks (STS, classification, clustering, pair classification, summarization): *every*
  text, because every text plays the query role. E5-mistral evaluates these through its plain
  ``encode`` path, which adds the task instruction to all inputs, and NV-Embed states that in
  symmetric training data the instruction goes on the documents too. mteb 2.x's instruct wrappers
  do the same (no prompt type → instruction applied; only ``document`` inputs are exempt).

The table is NV-Embed's evaluation table (its Table 10, "Instructions used for evaluation on the
MTEB benchmark"), which reuses E5-mistral's definitions, the "a online banking query" wording
included; "STS*" there means one definition for every STS task (:data:`STS_INSTRUCTION`). The
definitions live with the rest of each task's facts in :mod:`lmembed.task_registry`; this module
names the tables and applies them. E5-mistral's own paper is not in the project's library, so
``"e5-mistral"`` is the same table rather than an independently checked copy.

Published models (:mod:`lmembed.models.presets`) are evaluated with the instructions their MTEB scores were
produced with, looked up as mteb's instruct wrappers do (:class:`MtebTaskPrompts`, tables ``"mteb"`` and
``"mteb-llm2vec"``): the task's own ``metadata.prompt`` (its query side for retrieval), else the prompt of its
abstract task type; LLM2Vec's wrapper ends each in ``":"``. :func:`published_instructions` gives a loaded
model's table; ``lmembed eval`` uses it when no ``--instructions`` is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from lmembed.config import DEFAULT_INSTRUCTION_TEMPLATE as DEFAULT_TEMPLATE
from lmembed.errors import ConfigError, UnknownNameError
from lmembed.task_registry import STS_INSTRUCTION
from lmembed.task_registry import instructions as task_instructions

__all__ = [
    "DEFAULT_TEMPLATE",
    "INSTRUCTION_SETS",
    "NV_EMBED_INSTRUCTIONS",
    "QUERY_ONLY_TASK_TYPES",
    "STS_INSTRUCTION",
    "SYMMETRIC_TASK_TYPES",
    "MtebTaskPrompts",
    "format_instruction",
    "instruction_for",
    "instruction_set",
    "instruction_sides",
    "llm2vec_instruction",
    "published_instructions",
]

#: MTEB task name → NV-Embed's task definition; derived, live, from the task registry's ``instruction``
#: fields (:mod:`lmembed.task_registry`), so a newly registered task is found here at once.
NV_EMBED_INSTRUCTIONS: Mapping[str, str] = task_instructions()


class MtebTaskPrompts(Mapping[str, str]):
    """Task name → the instruction mteb's instruct wrappers give a model with no prompts of its own (see the
    module doc), for the tasks of lmembed's registry; ``transform`` rewrites each (LLM2Vec's ``":"``).

    mteb is imported on the first look-up (``pip install 'lmembed[compare]'``); values are kept once read."""

    def __init__(self, transform: Callable[[str], str] | None = None) -> None:
        self.transform = transform
        self._cache: dict[str, str | None] = {}

    def __getitem__(self, name: str) -> str:
        if name not in self._cache:
            self._cache[name] = self._lookup(name)
        value = self._cache[name]
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter([name for name in NV_EMBED_INSTRUCTIONS if name in self])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        try:
            self[name]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def _lookup(self, name: str) -> str | None:
        mteb = _import_mteb()
        try:
            task = mteb.get_task(name)
        except Exception:  # mteb knows no such task (a local folder's name, ...): no instruction
            return None
        prompt: Any = task.metadata.prompt
        if isinstance(prompt, dict):
            prompt = prompt.get("query")
        if not prompt:
            from mteb.abstasks.abstask import get_abstask_prompt  # lazy: mteb is an optional extra

            prompt = get_abstask_prompt(name)
        if not prompt:
            return None
        return self.transform(prompt) if self.transform else prompt


def _import_mteb() -> Any:
    try:
        import mteb  # lazy: mteb is an optional extra and slow to import
    except ImportError as exc:
        raise ConfigError(
            "the per-task instructions of published models come from mteb's task metadata; "
            "install it with pip install 'lmembed[compare]'"
        ) from exc
    return mteb


def llm2vec_instruction(instruction: str) -> str:
    """mteb's LLM2Vec wrapper: an instruction that does not end in ':' loses its trailing '.' and gains ':'."""
    if instruction and not instruction.endswith(":"):
        return instruction.strip(".") + ":"
    return instruction


INSTRUCTION_SETS: dict[str, Mapping[str, str]] = {
    "nv-embed": NV_EMBED_INSTRUCTIONS,
    "e5-mistral": NV_EMBED_INSTRUCTIONS,
    "e5": NV_EMBED_INSTRUCTIONS,
    "mteb": MtebTaskPrompts(),
    "mteb-llm2vec": MtebTaskPrompts(llm2vec_instruction),
}


def published_instructions(published: Any) -> Mapping[str, str] | None:
    """The instruction table of a published model (an ``Embedder.published`` resolution), None for others."""
    table = getattr(getattr(published, "preset", None), "instructions", None)
    return INSTRUCTION_SETS[table] if table else None


QUERY_ONLY_TASK_TYPES = frozenset({"Retrieval", "Reranking"})
SYMMETRIC_TASK_TYPES = frozenset({"STS", "Classification", "Clustering", "PairClassification", "Summarization"})


def instruction_set(name_or_table: str | Mapping[str, str]) -> Mapping[str, str]:
    """A named instruction table (``"nv-embed"``, ``"e5-mistral"``), or the given mapping itself."""
    if not isinstance(name_or_table, str):
        return name_or_table
    key = name_or_table.strip().lower()
    if key not in INSTRUCTION_SETS:
        raise UnknownNameError(f"unknown instruction set {name_or_table!r}; known: {', '.join(INSTRUCTION_SETS)}")
    return INSTRUCTION_SETS[key]


def instruction_for(task_name: str, instructions: str | Mapping[str, str] = "nv-embed") -> str | None:
    """The task definition for ``task_name`` in the given table, or ``None`` if it has none."""
    return instruction_set(instructions).get(task_name)


def instruction_sides(task_type: str) -> Literal["query", "both"]:
    """``"query"`` when only queries get the instruction, ``"both"`` for symmetric task types."""
    return "query" if task_type in QUERY_ONLY_TASK_TYPES else "both"


def format_instruction(instruction: str, template: str = DEFAULT_TEMPLATE) -> str:
    """The prefix an encoder puts before a text: ``template`` with the definition filled in."""
    if "{instruction}" not in template:
        raise ConfigError(f"instruction template {template!r} must contain '{{instruction}}'")
    return template.format(instruction=instruction)
