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
abstract task type; LLM2Vec's wrapper ends each in ``":"``. Qwen3-Embedding was scored with its authors' own
evaluation code instead (table ``"qwen3"``, :class:`Qwen3TaskInstructions`): STS and pair classification always get
``"Retrieve semantically similar text"``, bitext mining ``"Retrieve parallel sentences"``, other tasks the
definition of the repository's ``task_prompts.json`` (the E5 definitions, with its own wording for a few
tasks: :data:`QWEN3_OWN_DEFINITIONS`), else mteb's, and a retrieval query with none
``"Retrieval relevant passage for the given query."``. :func:`published_instructions` gives a loaded model's table;
``lmembed eval`` uses it when no ``--instructions`` is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from lmembed.config import DEFAULT_INSTRUCTION_TEMPLATE as DEFAULT_TEMPLATE
from lmembed.errors import ConfigError, UnknownNameError
from lmembed.task_registry import STS_INSTRUCTION, task_type_of
from lmembed.task_registry import instructions as task_instructions

__all__ = [
    "DEFAULT_TEMPLATE",
    "INSTRUCTION_SETS",
    "NV_EMBED_INSTRUCTIONS",
    "QUERY_ONLY_TASK_TYPES",
    "QWEN3_OWN_DEFINITIONS",
    "STS_INSTRUCTION",
    "SYMMETRIC_TASK_TYPES",
    "MtebTaskPrompts",
    "Qwen3TaskInstructions",
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


class _LookedUpTable(Mapping[str, str]):
    """A table whose entries are looked up when asked for (``__getitem__`` raises KeyError for a task it has none
    for): its length and membership follow from the lookup."""

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        try:
            self[name]  # type: ignore[index]
        except KeyError:
            return False
        return True


class MtebTaskPrompts(_LookedUpTable):
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


#: Qwen3-Embedding's evaluation (QwenLM/Qwen3-Embedding, evaluation/qwen3_embedding_model.py get_instruction): the
#: instruction of every STS and pair-classification task, whatever task_prompts.json says, and of bitext mining.
QWEN3_SYMMETRIC = "Retrieve semantically similar text"
QWEN3_BITEXT = "Retrieve parallel sentences"
QWEN3_RETRIEVAL_FALLBACK = "Retrieval relevant passage for the given query."
_QWEN3_BY_TYPE = {"STS": QWEN3_SYMMETRIC, "PairClassification": QWEN3_SYMMETRIC, "BitextMining": QWEN3_BITEXT}

#: Tasks of lmembed's registry whose definition in Qwen3-Embedding's evaluation/task_prompts.json differs from the
#: E5 / NV-Embed table (the rest of its entries for these tasks are that table's definitions). ArguAna's entry there
#: gives documents the instruction too; lmembed gives retrieval documents none (instruction_sides).
QWEN3_OWN_DEFINITIONS: Mapping[str, str] = {
    "ArguAna": "Given a claim, find documents that refute the claim",
    "NFCorpus": "Given a question, retrieve relevant documents that best answer the question",
    "NQ": "Given a question, retrieve Wikipedia passages that answer the question",
    "Touche2020": "Given a question, retrieve detailed and persuasive arguments that answer the question",
    "MasakhaNEWSClusteringS2S": "Identify the topic or theme of the given news articles based on the titles",
    "MasakhaNEWSClusteringP2P": (
        "Identify the topic or theme of the given news articles based on the titles and contents"
    ),
    "SIB200ClusteringS2S": "Identify the category of documents",
    "SummEval": QWEN3_SYMMETRIC,
}


class Qwen3TaskInstructions(_LookedUpTable):
    """Task name → the instruction Qwen3-Embedding's own evaluation code gives a query (see the module doc): by task
    type first (STS and pair classification, bitext mining), then its task table (:data:`QWEN3_OWN_DEFINITIONS`
    over the E5 definitions of lmembed's registry), then mteb's task prompt; a retrieval task with none gets the
    code's fallback. A task of unknown type and no definition has none."""

    def __init__(self, mteb_prompts: Mapping[str, str] | None = None) -> None:
        self._mteb = mteb_prompts

    def __getitem__(self, name: str) -> str:
        task_type = task_type_of(name) or _mteb_task_type(name)
        if task_type in _QWEN3_BY_TYPE:
            return _QWEN3_BY_TYPE[task_type]
        definition = QWEN3_OWN_DEFINITIONS.get(name) or NV_EMBED_INSTRUCTIONS.get(name)
        if definition is None and task_type is not None:
            definition = (self._mteb or INSTRUCTION_SETS["mteb"]).get(name)
        if definition is None and task_type is not None and "Retrieval" in task_type:
            definition = QWEN3_RETRIEVAL_FALLBACK
        if definition is None:
            raise KeyError(name)
        return definition

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*NV_EMBED_INSTRUCTIONS, *QWEN3_OWN_DEFINITIONS]))


def _mteb_task_type(name: str) -> str | None:
    """The type mteb records for a task lmembed's registry does not know; None without mteb or such a task."""
    try:
        import mteb  # lazy: an optional extra
    except ImportError:
        return None
    try:
        return str(mteb.get_task(name).metadata.type)
    except Exception:  # mteb knows no such task
        return None


INSTRUCTION_SETS: dict[str, Mapping[str, str]] = {
    "nv-embed": NV_EMBED_INSTRUCTIONS,
    "e5-mistral": NV_EMBED_INSTRUCTIONS,
    "e5": NV_EMBED_INSTRUCTIONS,
    "mteb": MtebTaskPrompts(),
    "mteb-llm2vec": MtebTaskPrompts(llm2vec_instruction),
    "qwen3": Qwen3TaskInstructions(),
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
