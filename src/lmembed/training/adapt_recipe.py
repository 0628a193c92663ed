"""The recipe of ``lmembed adapt``: which pseudo-queries it makes from a corpus, how it mines and labels them,
and how long it trains; read from a YAML file (``recipes/adapt/default.yaml``) through the schema layer.

Every key has a default (the values of ``recipes/adapt/default.yaml``), so a recipe file names only what it changes;
an unknown key or a value of the wrong type is refused as ``FILE:LINE: key: message``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from lmembed.errors import ConfigError
from lmembed.io import read_text
from lmembed.paths import find_named_recipe
from lmembed.protocols import ENCODE_BATCH_SIZE
from lmembed.schema import FileModel, Where, check_keys, read_yaml_file


class AdaptRecipeError(ConfigError):
    """An adapt recipe file is malformed; the message names the file, the line and the key."""


class TitleSource(FileModel):
    """Titles as queries for their own bodies (documents without a title give none). ``unique``: a title that
    several documents share (a section name, a tag list, a template) names none of them and is not used."""

    enabled: bool = True
    min_words: int = Field(2, ge=1)
    unique: bool = True


class CropSource(FileModel):
    """Spans cropped from a document as queries for it; the span is cut out of the positive (inverse cloze), so
    the pair teaches the topic, not the string match."""

    enabled: bool = True
    per_document: int = Field(1, ge=1)
    min_words: int = Field(6, ge=1)
    max_words: int = Field(24, ge=1)
    min_rest_words: int = Field(8, ge=1)  # words the document must keep once the span is cut out
    only_untitled: bool = True  # crop only documents that gave no title query (titles are the closer proxy)


class GeneratorSource(FileModel):
    """LLM-written queries through a ``synthesize`` corpus-only recipe, used when ``--generator`` is given."""

    recipe: str = "corpus-only-plain"
    limit: int | None = Field(None, ge=1)  # documents to write queries for (None: all)
    shard_size: int = Field(16, ge=1)


class Sources(FileModel):
    titles: TitleSource = TitleSource()
    crops: CropSource = CropSource()
    generator: GeneratorSource = GeneratorSource()


class Filters(FileModel):
    """Queries dropped before training: a copy of their passage's opening, a passage span copied whole
    (``max_copied``: the share of the query's word trigrams found in the passage), a near-duplicate of a query
    kept already (same words), or too few words."""

    max_copied: float = Field(0.8, gt=0, le=1)
    min_query_words: int = Field(2, ge=1)


#: The kinds of pseudo-query (``PseudoQuery.source``), as ``mining.sources`` names them.
QuerySource = Literal["title", "crop", "generator"]


class Mining(FileModel):
    """Hard negatives from the starting model, positive-aware (NV-Retriever's TopK-PercPos by default); the
    query's own document is never a negative. ``sources``: the kinds of pseudo-query whose rows get mined negatives
    when training without a teacher; the others train on the batch's documents and random ones (a title sums up
    its whole document, so its nearest other documents are often relevant to it too). With a teacher every row is
    mined, since its scores label the negatives. ``candidates: teacher`` (with an embedder teacher or ``hybrid``):
    the teacher's own ``k`` best documents instead, unfiltered, for a listwise distillation loss; ``method``,
    ``margin`` and ``skip_top`` then do not apply."""

    candidates: Literal["model", "teacher"] = "model"
    sources: list[QuerySource] = Field(default_factory=lambda: ["crop", "generator"])
    method: str = "perc_pos"
    margin: float | None = 0.95
    k: int = Field(3, ge=1)
    skip_top: int = Field(0, ge=0)
    batch_size: int = Field(ENCODE_BATCH_SIZE, ge=1)


class Selection(FileModel):
    """The held-back pseudo-queries that pick the step to keep (no labels needed)."""

    fraction: float = Field(0.1, gt=0, lt=1)
    max_queries: int = Field(200, ge=1)
    max_documents: int = Field(1000, ge=2)  # the corpus they are retrieved from is cut to this many (theirs kept)
    every: int = Field(50, ge=1)  # evaluate (and checkpoint) every N steps
    # own: nDCG@10 of retrieving each query's own document; teacher: nDCG@10 against the --teacher's ranking of
    # the slice (its 10 best documents, graded by its softmax), for a distillation run whose own-document score
    # saturates
    metric: Literal["own", "teacher"] = "own"


class Training(FileModel):
    """TrainConfig options of the run (``loss: infonce``, or ``margin_mse`` when a teacher is given)."""

    steps: int = Field(150, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-5, gt=0)
    warmup_steps: int = Field(15, ge=0)
    temperature: float = Field(0.05, gt=0)
    num_negatives: int = Field(1, ge=0)
    max_length: int | None = Field(128, ge=8)  # tokens per text while training (None: the model's own); the
    # saved model keeps its own window
    loss: str = "infonce"
    teacher_loss: str = "margin_mse"
    hybrid_weight: float = Field(0.25, ge=0)  # --teacher hybrid: the BM25 share of its score (see HybridTeacher)
    # --teacher reranker:NAME: its logits times this factor are the labels; auto: the factor that gives their margins
    # the spread of the starting model's cosine margins (adapt.reranker_scale_to_student)
    reranker_scale: Annotated[float, Field(gt=0)] | Literal["auto"] = "auto"
    merge: float = Field(0.5, gt=0, le=1)  # the kept weights: start + merge × (adapted − start) (1: as adapted)


class Terms(FileModel):
    """The term channel fitted on the corpus once training ends (:mod:`lmembed.pooling.terms`): each token's idf
    over the corpus, hashed into ``dims`` buckets appended to the vector, weighed ``weight`` against the dense part
    in the cosine."""

    enabled: bool = True
    dims: int = Field(4096, ge=16, le=1 << 20)
    weight: float = Field(0.5, gt=0, le=10)


class AdaptRecipe(FileModel):
    version: int = 1
    seed: int = 42
    sources: Sources = Sources()
    filters: Filters = Filters()
    mining: Mining = Mining()
    selection: Selection = Selection()
    training: Training = Training()
    terms: Terms = Terms()

    @property
    def source_names(self) -> list[str]:
        return [name for name in ("titles", "crops") if getattr(self.sources, name).enabled]


def find_adapt_recipe(name: str | Path) -> Path:
    """A recipe file: a path, or the stem of a file in ``recipes/adapt/`` (:func:`lmembed.paths.recipe_dirs`)."""
    found = find_named_recipe("adapt", name)
    if isinstance(found, Path):
        return found
    raise AdaptRecipeError(f"{name}: no such recipe file, nor one of the adapt recipes ({', '.join(found) or 'none'})")


def load_adapt_recipe(path: str | Path | None) -> AdaptRecipe:
    """The recipe in ``path`` (a file, or a name in ``recipes/adapt/``; its keys over the defaults), or the defaults
    when ``path`` is None."""
    if path is None:
        return AdaptRecipe()
    path = find_adapt_recipe(path)
    data, lines = read_yaml_file(path, AdaptRecipeError, read_text(path))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AdaptRecipeError(f"{path}: an adapt recipe is a YAML mapping")
    recipe = check_keys(AdaptRecipe, data, Where(str(path), lines, AdaptRecipeError), (), "adapt recipe")
    assert isinstance(recipe, AdaptRecipe)
    crops = recipe.sources.crops
    if crops.max_words < crops.min_words:
        raise Where(str(path), lines, AdaptRecipeError).error(
            ("sources", "crops", "max_words"), f"{crops.max_words} is below min_words ({crops.min_words})"
        )
    return recipe


def recipe_summary(recipe: AdaptRecipe) -> dict[str, Any]:
    return recipe.model_dump()
