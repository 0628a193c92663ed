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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from lmembed.config import DEFAULT_INSTRUCTION_TEMPLATE as DEFAULT_TEMPLATE
from lmembed.task_registry import STS_INSTRUCTION
from lmembed.task_registry import instructions as task_instructions

__all__ = [
    "DEFAULT_TEMPLATE",
    "INSTRUCTION_SETS",
    "NV_EMBED_INSTRUCTIONS",
    "QUERY_ONLY_TASK_TYPES",
    "STS_INSTRUCTION",
    "SYMMETRIC_TASK_TYPES",
    "format_instruction",
    "instruction_for",
    "instruction_set",
    "instruction_sides",
]

#: MTEB task name → NV-Embed's task definition; derived, live, from the task registry's ``instruction``
#: fields (:mod:`lmembed.task_registry`), so a newly registered task is found here at once.
NV_EMBED_INSTRUCTIONS: Mapping[str, str] = task_instructions()

INSTRUCTION_SETS: dict[str, Mapping[str, str]] = {
    "nv-embed": NV_EMBED_INSTRUCTIONS,
    "e5-mistral": NV_EMBED_INSTRUCTIONS,
    "e5": NV_EMBED_INSTRUCTIONS,
}

QUERY_ONLY_TASK_TYPES = frozenset({"Retrieval", "Reranking"})
SYMMETRIC_TASK_TYPES = frozenset({"STS", "Classification", "Clustering", "PairClassification", "Summarization"})


def instruction_set(name_or_table: str | Mapping[str, str]) -> Mapping[str, str]:
    """A named instruction table (``"nv-embed"``, ``"e5-mistral"``), or the given mapping itself."""
    if not isinstance(name_or_table, str):
        return name_or_table
    key = name_or_table.strip().lower()
    if key not in INSTRUCTION_SETS:
        raise KeyError(f"unknown instruction set {name_or_table!r}; known: {', '.join(INSTRUCTION_SETS)}")
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
        raise ValueError("an instruction template must contain '{instruction}'")
    return template.format(instruction=instruction)
