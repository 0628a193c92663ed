"""The Python API of ``lmembed synthesize``: run a recipe file with a generator into a training JSONL file.

Example::

    from lmembed.synthesis.generators import TinyGenerator
    from lmembed.synthesis.synthesize import synthesize

    stats = synthesize("e5-mistral", TinyGenerator(), "synthetic.jsonl")

The output is read by ``lmembed train --data synthetic.jsonl`` as it is (``query``, ``positive``,
``negatives``, ``instruction``, ``task``, ``symmetric``; ``provenance`` rides along).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmembed.errors import ConfigError
from lmembed.synthesis.generators import Generator
from lmembed.synthesis.recipes import Recipe, load_recipe
from lmembed.synthesis.runner import Context, Encode, RecipeRunner, run_shards


def _runner(kind: str) -> RecipeRunner:
    if kind == "e5-mistral":
        from lmembed.synthesis.e5_mistral import E5MistralRunner

        return E5MistralRunner()
    if kind == "gecko":
        from lmembed.synthesis.gecko import GeckoRunner

        return GeckoRunner()
    from lmembed.synthesis.corpus_only import CorpusOnlyRunner

    return CorpusOnlyRunner()


def synthesize(
    recipe: str | Path | Recipe,
    generator: Generator,
    output: str | Path,
    *,
    corpus: tuple[list[str], list[str]] | None = None,
    encode: Encode | None = None,
    seed: int = 0,
    shard_size: int = 32,
    limit: int | None = None,
    echo: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Generate the recipe's rows into ``output`` (JSON lines), resuming from ``output``'s ``.parts`` folder;
    returns the run's stats (also written as ``<output>.stats.json``). ``corpus`` (ids, texts) and ``encode``
    (an embedder for retrieval) are needed by the Gecko and corpus-only recipes."""
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    if recipe.kind in ("gecko", "corpus-only"):
        if corpus is None or not corpus[0]:
            raise ConfigError(f"recipe {recipe.path} ({recipe.kind}) needs a corpus of passages (--corpus)")
        if encode is None:
            raise ConfigError(f"recipe {recipe.path} ({recipe.kind}) needs an embedder to retrieve with (--embedder)")
    output = Path(output)
    ids, texts = corpus or ([], [])
    context = Context(recipe, generator, output.with_name(output.name + ".parts"), seed, list(ids), list(texts), encode)
    return run_shards(_runner(recipe.kind), context, output, shard_size=shard_size, limit=limit, echo=echo)


def read_passages(path: str | Path, limit: int | None = None) -> tuple[list[str], list[str]]:
    """Seed passages as (ids, texts): a BEIR folder or ``corpus.jsonl`` (its ``_id``s), or a text file with one
    passage per line (ids ``line-N``)."""
    from lmembed.io import CORPUS_FILE, find_file, iter_lines, read_corpus

    path = Path(path)
    if path.is_dir():
        ids, texts = read_corpus(find_file(path, CORPUS_FILE))
    elif path.suffix in (".jsonl", ".gz"):
        ids, texts = read_corpus(path)
    else:
        pairs = [(f"line-{n}", line.strip()) for n, line in iter_lines(path) if line.strip()]
        ids, texts = [p[0] for p in pairs], [p[1] for p in pairs]
    return (ids[:limit], texts[:limit]) if limit is not None else (ids, texts)
