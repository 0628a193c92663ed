"""The texts of named evaluation sets that training rows must not repeat.

Each name is resolved as ``lmembed eval --data`` resolves it (a known task name, a folder or a file), and the
task says itself what it embeds (:meth:`lmembed.evaluation.base.Task.embedded_texts`): its queries and plain
texts are evaluation items; the documents of a retrieval corpus are not (BEIR train splits share the corpus
with the test split, and a model is expected to have read it).
"""

from __future__ import annotations

from collections.abc import Sequence

from lmembed.synthesis.decontaminate import ProtectedText, protected_texts


def evaluation_texts(names: Sequence[str], *, split: str = "test") -> list[ProtectedText]:
    """The evaluation items of every named set, labelled with the task's name."""
    # lazy: the task readers import scikit-learn and SciPy; training's config (and so `lmembed --help`) only
    # needs parse_names
    from lmembed.evaluation.suites import resolve_task

    by_task: dict[str, list[str]] = {}
    for name in names:
        task = resolve_task(name, split=split)
        texts = by_task.setdefault(task.name, [])
        for call in task.embedded_texts():
            if call.role != "document":
                texts.extend(call.texts)
    return protected_texts(by_task)


def parse_names(value: str | Sequence[str] | None) -> list[str]:
    """``"scifact,nfcorpus"`` or a list of names → the names, without blanks or repeats."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    return list(dict.fromkeys(item.strip() for item in items if item.strip()))
