"""A saved model's card, ``README.md``: what the model is, how to load it, how it was trained, and what to cite.

:meth:`Embedder.save <lmembed.embedder.Embedder.save>` writes it beside the weights, in the layout the Hugging Face
Hub reads (YAML front matter, then Markdown), so a saved folder can be published as it is. The card cites the paper
of each part of the strategy (:func:`strategy_citations`) and, for a trained model, of its training
(:class:`TrainingRecord`, written by the trainer): the BibTeX entries come from :mod:`lmembed.citations`.

The card is for people; no loader reads it. ``lmembed.json`` records its sha256 apart from the model's files
(``card``), so that a user may edit it before publishing without the folder failing its checks, and saving over the
folder again replaces lmembed's own card but refuses to drop an edited one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from lmembed.citations import bibtex, check_keys
from lmembed.config import EmbeddingConfig

CARD_FILE = "README.md"
#: the key of ``lmembed.json`` that records the card's sha256
CARD_KEY = "card"


@dataclass(frozen=True)
class TrainingRecord:
    """What a training run tells the card: its settings (name -> value, shown as a table) and its papers."""

    settings: Mapping[str, Any] = field(default_factory=dict)
    cites: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_keys(self.cites, "the training record")


@dataclass(frozen=True)
class ExportRecord:
    """What an ONNX export tells the card: the model it was exported from (how lmembed loads it again) and the
    graph's precision."""

    source: str | None  # None: a model built in memory (the card's snippet then asks for where it is)
    precision: str


def _use(name: str) -> list[str]:
    return [
        "## Use",
        "",
        "```python",
        "from lmembed import Embedder",
        "",
        f'model = Embedder.from_pretrained("{name}")  # this folder, or its Hub id once published',
        'queries = model.encode_queries(["what is this model for?"])',
        'documents = model.encode_corpus(["It turns texts into vectors."])',
        "```",
        "",
    ]


def _use_export(export: ExportRecord) -> list[str]:
    return [
        "## Use",
        "",
        "`model.onnx` takes `input_ids` and `attention_mask` (int64, batch × tokens, as the tokenizer in this folder "
        "gives them) and returns the hidden states the strategy pools (`states_0`, and `states_1` … when it reads "
        "more than one layer; batch × tokens × width). Pooling and what follows it (the strategy below: which tokens "
        "are pooled, a head, normalisation) are not in the graph. lmembed runs this very graph, with its pooling, for "
        f"{f'`{export.source}`' if export.source else 'the model'}, the model it was exported from (its "
        "`lmembed.json` records how it was loaded, int8's calibration texts too):",
        "",
        "```python",
        "import json",
        "",
        "from lmembed import Embedder",
        "from lmembed.load_spec import LoadSpec",
        "",
        'spec = LoadSpec.from_dict(json.load(open("lmembed.json"))["load"])  # the lmembed.json of this folder',
        "model = Embedder.from_spec(spec)" if export.source else 'model = Embedder.from_spec(spec, source="MODEL")',
        'vectors = model.encode(["It turns texts into vectors."])',
        "```",
        "",
    ]


def strategy_citations(config: EmbeddingConfig, is_decoder: bool) -> tuple[str, ...]:
    """The papers of the strategy's parts: its pooling, a decoder's attention and layer, echo, Matryoshka ``dim``
    and a term channel."""
    keys = []
    if config.pooling == "weighted_mean":
        keys.append("muennighoff2022sgpt")
    if config.pooling == "latent_attention":
        keys.append("lee2024nvembed")
    if is_decoder and config.pooling == "last":
        keys.append("ma2023repllama")
    if is_decoder and config.attention == "bidirectional":
        keys.append("behnamghader2024llm2vec")
    if config.echo:
        keys.append("springer2024echo")
    if is_decoder and (config.layers != (-1,) or config.final_norm is not None):
        keys.append("juboor2024decoding")
    if config.dim is not None:
        keys.append("kusupati2022mrl")
    if config.terms is not None:
        keys.append("robertson2009bm25")
    return tuple(keys)


def _version() -> str:
    try:
        return metadata.version("lmembed")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "(from source)"


def _short(value: Any) -> str:
    """A setting as a person reads it: floats to 4 significant digits, digests cut to their first 12 characters."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str):
        return value[:12] + "…" if re.fullmatch(r"[0-9a-f]{32,}", value) else value
    if isinstance(value, dict):
        return ", ".join(f"{k}={_short(v)}" for k, v in value.items())
    return repr(value)


def _cell(value: Any) -> str:
    return _short(value).replace("|", "\\|").replace("\n", "\\n")


def card_text(
    *,
    name: str,
    base_model: str,
    hub_id: str | None,
    config: EmbeddingConfig,
    is_decoder: bool,
    dim: int,
    sentence_transformers: bool,
    training: TrainingRecord | None = None,
    family_cites: tuple[str, ...] = (),
    export: ExportRecord | None = None,
) -> str:
    """The card's Markdown (with the Hub's YAML front matter: ``hub_id``, the base model's id on the Hub when it has
    one, is its ``base_model``), naming the installed lmembed's version;
    ``family_cites``: the papers of the published family the model was loaded as (its preset's); ``export``: the
    folder is an ONNX export (its graph's inputs and outputs, and how lmembed runs it, take the place of loading)."""
    tags = ["lmembed", "feature-extraction", "sentence-similarity"]
    if sentence_transformers:
        tags.append("sentence-transformers")
    if export is not None:
        tags.append("onnx")
    front = ["---", "library_name: lmembed"]
    if hub_id is not None:  # the Hub links a base model by its id only (not a local path)
        front.append(f"base_model: {hub_id}")
    front += ["pipeline_tag: sentence-similarity", "tags:", *(f"- {t}" for t in tags), "---", ""]
    what = "saved" if export is None else f"exported to ONNX ({export.precision})"
    lines = [
        *front,
        f"# {name}",
        "",
        f"A text-embedding model {what} by lmembed {_version()}: `{base_model}` read with the strategy "
        f"`{config.label()}` ({dim} dimensions, {config.similarity} similarity).",
        "",
    ]
    lines += _use(name) if export is None else _use_export(export)
    if sentence_transformers:
        lines += [
            "sentence-transformers loads it too, with the same vectors: "
            f'`SentenceTransformer("{name}").encode(texts)`.',
            "",
        ]
    defaults = EmbeddingConfig().to_dict()
    changed = {k: v for k, v in config.to_dict().items() if defaults.get(k) != v}
    lines += ["## Strategy", "", "| setting | value |", "|---|---|"]
    lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in changed.items()] or ["| (lmembed's defaults) | |"]
    lines.append("")
    if training is not None:
        lines += ["## Training", "", "| setting | value |", "|---|---|"]
        lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in training.settings.items()]
        lines.append("")
    cites = [*family_cites, *strategy_citations(config, is_decoder), *(training.cites if training else ())]
    if cites:
        lines += [
            "## Citations",
            "",
            "The model, its strategy and its training come from these papers:",
            "",
            "```bibtex",
            bibtex(cites),
            "```",
            "",
        ]
    return "\n".join(lines)
