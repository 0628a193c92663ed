"""Synthesis recipes are files: a YAML document holding a recipe's prompts and parameters.

Every recipe names its ``kind`` (``e5-mistral``, ``gecko``, ``corpus-only``) and a ``version``; the file's
path, version and a digest of its bytes go into every row it produces. Prompts are Python
:class:`string.Template` texts (``$task``, ``$passage``), so JSON braces in a prompt need no escaping. A recipe
is named by its path, or by its file name's stem when it sits in ``recipes/synthesis/`` of the current folder
or of the lmembed checkout.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from lmembed.errors import ConfigError, UnknownNameError
from lmembed.io import read_text
from lmembed.paths import find_named_recipe
from lmembed.schema import Where, read_yaml_file


@dataclass(frozen=True)
class SynthesisKind:
    """One kind of synthesis recipe: the fields its recipe file must hold, the runner that generates its rows
    (``module:Class``, imported when a run starts, implementing :class:`~lmembed.synthesis.runner.RecipeRunner`),
    and whether it reads seed passages and an embedder (``--corpus``, ``--embedder``)."""

    required: tuple[str, ...]
    runner: str
    reads_passages: bool = False


#: The registry of synthesis kinds: every list of kinds, the recipe check and ``synthesize`` read it.
SYNTHESIS_KINDS: dict[str, SynthesisKind] = {
    "e5-mistral": SynthesisKind(("families", "knobs"), "lmembed.synthesis.e5_mistral:E5MistralRunner"),
    "gecko": SynthesisKind(
        ("generate", "keys", "query_likelihood", "relevance"), "lmembed.synthesis.gecko:GeckoRunner", True
    ),
    "corpus-only": SynthesisKind(("generate", "keys"), "lmembed.synthesis.corpus_only:CorpusOnlyRunner", True),
}
KINDS = tuple(SYNTHESIS_KINDS)


class SynthesisRecipeError(ConfigError):
    """A synthesis recipe file is missing, unreadable or lacks a field its kind needs."""


@dataclass(frozen=True)
class SynthesisRecipe:
    """A loaded recipe: where it came from, its kind and version, its fields."""

    path: Path
    kind: str
    version: str
    digest: str
    data: dict[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def require(self, key: str, where: dict[str, Any] | None = None, label: str = "") -> Any:
        source = self.data if where is None else where
        if key not in source:
            raise SynthesisRecipeError(f"{self.path}: {label}{key!r} is missing")
        return source[key]

    def provenance(self) -> dict[str, str]:
        return {"recipe": str(self.path), "kind": self.kind, "version": self.version, "digest": self.digest}


def render(template: str, **fields: Any) -> str:
    """Fill a prompt's ``$placeholders``; one the prompt names but ``fields`` lack stays as it is written."""
    return Template(template).safe_substitute({k: str(v) for k, v in fields.items()})


def find_recipe(name: str | Path) -> Path:
    """A synthesis recipe file: a path, or the stem of a file in ``recipes/synthesis/``."""
    found = find_named_recipe("synthesis", name)
    if isinstance(found, Path):
        return found
    raise UnknownNameError(f"synthesis recipe {str(name)!r} is not a file nor one of: {', '.join(found) or 'none'}")


def load_recipe(name: str | Path) -> SynthesisRecipe:
    """Read and check a recipe file (a path or a known stem such as ``e5-mistral``)."""
    path = find_recipe(name)
    raw = path.read_bytes()
    data, lines = read_yaml_file(path, SynthesisRecipeError, read_text(path))  # not UTF-8: named, file:line
    if not isinstance(data, dict):
        raise SynthesisRecipeError(f"{path}: a recipe is a YAML mapping")
    where = Where(str(path), lines, SynthesisRecipeError)
    kind = data.get("kind")
    if kind not in SYNTHESIS_KINDS:
        raise where.error(("kind",), f"'kind' must be one of {', '.join(SYNTHESIS_KINDS)}, got {kind!r}")
    recipe = SynthesisRecipe(path, kind, str(data.get("version", "1")), hashlib.sha256(raw).hexdigest()[:12], data)
    plain = data.get("answer", "json")
    if plain not in ("json", "plain-query") or (kind == "e5-mistral" and plain != "json"):
        raise where.error(("answer",), f"'answer' must be json or plain-query (gecko, corpus-only), got {plain!r}")
    for key in SYNTHESIS_KINDS[kind].required:
        if not (key == "keys" and plain == "plain-query"):  # a plain-text query answer has no JSON keys
            recipe.require(key)
    if kind == "e5-mistral":
        for family, spec in recipe.data["families"].items():
            for key in ("brainstorm", "generate", "keys", "row"):
                recipe.require(key, spec, f"families.{family}.")
    return recipe
