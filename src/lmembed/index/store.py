"""The documents of an index: ids, texts and metadata, row ``i`` being the vector at row ``i``.

On disk: a JSON-lines file, one ``{"id", "text"[, "metadata"]}`` object per row, in row order.
Ids are unique; adding an id the store already holds is a :class:`DuplicateIdError` and changes nothing, and a file
that gives one id twice is refused when read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from lmembed.index.corpus import Document
from lmembed.index.errors import DuplicateIdError, IndexFormatError
from lmembed.io import DataFormatError, iter_jsonl

SHOWN_DUPLICATES = 5


class DocumentStore:
    """Row-aligned ids, texts and metadata."""

    def __init__(self, documents: Sequence[Document] = ()) -> None:
        self.ids: list[str] = []
        self.texts: list[str] = []
        self.metadata: list[dict] = []
        self._rows: dict[str, int] = {}
        self.extend(documents)

    def __len__(self) -> int:
        return len(self.ids)

    def row_of(self, doc_id: str) -> int | None:
        return self._rows.get(doc_id)

    def document(self, row: int) -> Document:
        return Document(self.ids[row], self.texts[row], self.metadata[row])

    def check_new(self, documents: Sequence[Document]) -> None:
        """Refuse documents whose ids repeat among themselves or are already held."""
        seen: set[str] = set()
        repeated = []
        for doc in documents:
            if doc.id in self._rows or doc.id in seen:
                repeated.append(doc.id)
            seen.add(doc.id)
        if repeated:
            shown = ", ".join(repeated[:SHOWN_DUPLICATES]) + (" ..." if len(repeated) > SHOWN_DUPLICATES else "")
            raise DuplicateIdError(
                f"{len(repeated)} document id(s) already in the index or given twice: {shown}; nothing was added"
            )

    def extend(self, documents: Sequence[Document]) -> None:
        self.check_new(documents)
        for doc in documents:
            self._rows[doc.id] = len(self.ids)
            self.ids.append(doc.id)
            self.texts.append(doc.text)
            self.metadata.append(dict(doc.metadata))

    def save(self, folder: Path, stem: str) -> dict[str, str]:
        name = f"{stem}.docs.jsonl"
        with (folder / name).open("w", encoding="utf-8") as handle:
            for doc_id, text, meta in zip(self.ids, self.texts, self.metadata, strict=True):
                row = {"id": doc_id, "text": text, **({"metadata": meta} if meta else {})}
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return {"documents": name}

    @classmethod
    def load(cls, path: Path) -> DocumentStore:
        store = cls()
        first_line: dict[str, int] = {}
        try:
            for line_no, row in iter_jsonl(path):
                if not isinstance(row.get("id"), str) or not isinstance(row.get("text"), str):
                    raise DataFormatError(path, line_no, "expected an object with string fields 'id' and 'text'")
                if row["id"] in first_line:
                    raise DataFormatError(
                        path, line_no, f"id {row['id']!r} is given twice (first on line {first_line[row['id']]})"
                    )
                first_line[row["id"]] = line_no
                store._rows[row["id"]] = len(store.ids)
                store.ids.append(row["id"])
                store.texts.append(row["text"])
                store.metadata.append(row.get("metadata") or {})
        except (DataFormatError, OSError) as exc:
            raise IndexFormatError(f"cannot read the index's documents: {exc}") from exc
        return store
