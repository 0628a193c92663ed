"""The one registry of evaluation tasks lmembed knows: one :class:`TaskSpec` per MTEB task.

A spec holds every fact about a task: its MTEB name and task type, where its data lives under a data
root (``$LMEMBED_DATA`` or the project's ``shared/datasets``), the split scored, the settings its task
class takes (``samples_per_label``, ``ignore_identical_ids``, MTEB's dataset revision ...), short
names such as ``scifact`` or ``sick-r``, and the NV-Embed / E5-mistral task instruction. Every other
table is derived from :data:`TASKS`, live:

* :func:`dataset_locations` / :func:`dataset_aliases`: ``lmembed.datasets``' name → folder tables;
* :func:`find` / :func:`get`: lookup by MTEB name or short name (suites, ``lmembed eval --data``);
* :func:`task_type_of`: the type of a results file that does not record one;
* :func:`instructions`: the instruction table of ``lmembed.evaluation.instructions``.

**Adding a dataset is one entry**: append a :class:`TaskSpec` to the list below (or call
:func:`register` at run time). A spec without ``path`` names a task we hold no data for; it still
carries the task's type and instruction.

This module sits below ``lmembed.datasets`` and imports nothing heavy, so anything may read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from lmembed.errors import UnknownNameError
from lmembed.io import CORPUS_FILE, QRELS_DIR, QUERIES_FILE

#: NV-Embed / E5-mistral use one definition for every STS task (and training's STS converter uses it too).
STS_INSTRUCTION = "Retrieve semantically similar text."

_TYPE_SUFFIXES = ("classification", "clustering", "retrieval")


class UnknownTaskError(UnknownNameError):
    """A task name is in no registry entry (or the entry has no data location)."""


@dataclass(frozen=True)
class TaskSpec:
    """Everything lmembed knows about one MTEB task.

    ``path`` is relative to the data root: a folder (BEIR layout for retrieval, ``<split>.jsonl``
    files otherwise) or one ``.jsonl`` file; ``None`` when no local data is known. ``settings`` are
    the keyword arguments the task type's ``from_path`` takes beyond name, split and instruction
    (``samples_per_label``, ``subset``, ``ignore_identical_ids``, ``mteb_dataset_revision`` ...).
    ``extra_splits`` are further splits the task reads (classification's ``train``). ``aliases``
    are other spellings accepted by name lookups (case-insensitive). ``instruction`` is the task
    definition of NV-Embed's evaluation table (also E5-mistral's).
    """

    name: str
    task_type: str  # an MTEB task-type name, a key of lmembed.evaluation.tasks.TASK_TYPES
    path: str | None = None
    split: str = "test"
    settings: Mapping[str, Any] = field(default_factory=dict)
    extra_splits: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    instruction: str | None = None
    note: str = ""

    @property
    def short_name(self) -> str | None:
        """The data folder's name (``scifact``, ``sickr``, ``banking77``), the dataset's short name."""
        return PurePosixPath(self.path).name.removesuffix(".jsonl").lower() if self.path else None

    @property
    def ignore_identical_ids(self) -> bool:
        """Retrieval: a hit whose id equals the query id is not counted, where MTEB's task class sets it (ArguAna,
        FiQA2018, QuoraRetrieval, FEVER, MSMARCO; checked against mteb in tests)."""
        return bool(self.settings.get("ignore_identical_ids", False))

    def files(self, root: str | Path) -> list[Path]:
        """The files that must exist under ``root`` for this task to be usable (none known: empty)."""
        if self.path is None:
            return []
        base = Path(root) / self.path
        if self.task_type == "Retrieval":  # BEIR folder layout
            return [base / CORPUS_FILE, base / QUERIES_FILE, base / QRELS_DIR / f"{self.split}.tsv"]
        if base.suffix == ".jsonl":
            return [base]
        return [base / f"{split}.jsonl" for split in (self.split, *self.extra_splits)]

    def is_available(self, root: str | Path) -> bool:
        """True when this task has a data location and every file it needs is under ``root``."""
        files = self.files(root)
        return bool(files) and all(path.is_file() for path in files)

    def lookup_keys(self) -> set[str]:
        """Lower-case names that find this task: the MTEB name without its type suffix, the folder, aliases."""
        lower = self.name.lower()
        short = lower
        for suffix in _TYPE_SUFFIXES:
            short = short.removesuffix(suffix)
        keys = {lower, short, short.replace("-", ""), *(alias.lower() for alias in self.aliases)}
        if self.short_name:
            keys.add(self.short_name)
        return keys


def _beir(
    name: str, folder: str, instruction: str, revision: str | None = None, *, ignore_identical_ids: bool = False
) -> TaskSpec:
    settings: dict[str, Any] = {}
    if revision:  # the Hugging Face revision of MTEB's copy, recorded with each result
        settings["mteb_dataset_revision"] = revision
    if ignore_identical_ids:
        settings["ignore_identical_ids"] = True
    return TaskSpec(name, "Retrieval", f"beir/{folder}", settings=settings, instruction=instruction)


def _sts(name: str, folder: str | None, **kwargs: Any) -> TaskSpec:
    path = f"sts/{folder}" if folder else None
    return TaskSpec(name, "STS", path, instruction=STS_INSTRUCTION, **kwargs)


def _classification(name: str, folder: str | None, instruction: str, **settings: Any) -> TaskSpec:
    if folder is None:
        return TaskSpec(name, "Classification", instruction=instruction)
    path = f"classification/{folder}"
    note = "the en subset" if settings.get("subset") == "en" else ""
    return TaskSpec(
        name, "Classification", path, settings=settings, extra_splits=("train",), instruction=instruction, note=note
    )


def _typed(task_type: str, area: str) -> Callable[[str, str | None, str], TaskSpec]:
    def make(name: str, folder: str | None, instruction: str) -> TaskSpec:
        return TaskSpec(name, task_type, f"{area}/{folder}" if folder else None, instruction=instruction)

    return make


_clustering = _typed("Clustering", "clustering")
_reranking = _typed("Reranking", "reranking")
_pairs = _typed("PairClassification", "pair_classification")
_SUMMEVAL = "Given a news summary, retrieve other semantically similar summaries"
_SUMMEVAL_FILE = "summarization/summeval/test.bartscore_tokenized.jsonl"

_SPECS: tuple[TaskSpec, ...] = (
    # Retrieval (BEIR folders). Revisions: MTEB's copies of SciFact, NFCorpus and ArguAna.
    _beir(
        "SciFact",
        "scifact",
        "Given a scientific claim, retrieve documents that support or refute the claim",
        "0228b52cf27578f30900b9e5271d331663a030d7",
    ),
    _beir(
        "NFCorpus",
        "nfcorpus",
        "Given a question, retrieve relevant documents that answer the question",
        "ec0fa4fe99da2ff19ca1214b7966684033a58814",
    ),
    _beir(
        "ArguAna",
        "arguana",
        "Given a claim, retrieve documents that support or refute the claim",
        "c22ab2a51041ffd869aaddef7af8d8215647e41a",
        ignore_identical_ids=True,
    ),
    _beir(
        "SCIDOCS",
        "scidocs",
        "Given a scientific paper title, retrieve paper abstracts that are cited by the given paper",
    ),
    _beir(
        "FiQA2018",
        "fiqa",
        "Given a financial question, retrieve user replies that best answer the question",
        ignore_identical_ids=True,
    ),
    _beir("TRECCOVID", "trec-covid", "Given a query on COVID-19, retrieve documents that answer the query"),
    _beir(
        "QuoraRetrieval",
        "quora",
        "Given a question, retrieve questions that are semantically equivalent to the given question",
        ignore_identical_ids=True,  # every query is also a document under its own id
    ),
    TaskSpec(
        "ClimateFEVER",
        "Retrieval",
        instruction="Given a claim about climate change, retrieve documents that support or refute the claim",
    ),
    TaskSpec("DBPedia", "Retrieval", instruction="Given a query, retrieve relevant entity descriptions from DBPedia"),
    TaskSpec(
        "FEVER",
        "Retrieval",
        instruction="Given a claim, retrieve documents that support or refute the claim",
        settings={"ignore_identical_ids": True},
    ),
    TaskSpec(
        "HotpotQA",
        "Retrieval",
        instruction="Given a multi-hop question, retrieve documents that can help answer the question",
    ),
    TaskSpec(
        "MSMARCO",
        "Retrieval",
        split="dev",
        instruction="Given a web search query, retrieve relevant passages that answer the query",
        settings={"ignore_identical_ids": True},
    ),
    TaskSpec("NQ", "Retrieval", instruction="Given a question, retrieve passages that answer the question"),
    TaskSpec("Touche2020", "Retrieval", instruction="Given a question, retrieve passages that answer the question"),
    # STS. STS12-16 are the lowercased, tokenized text of MTEB's copies; SICK-R is all 9,927 SICK
    # pairs (train + trial + test), as in MTEB.
    _sts("STSBenchmark", "stsbenchmark", aliases=("sts-b", "stsb")),
    _sts("SICK-R", "sickr", aliases=("sick-r", "sick_r")),
    _sts("STS12", "sts12"),
    _sts("STS13", "sts13"),
    _sts("STS14", "sts14"),
    _sts("STS15", "sts15"),
    _sts("STS16", "sts16"),
    _sts("STS17", "sts17", settings={"subset": "en-en"}, note="MTEB(eng) uses the en-en subset"),
    _sts("STS22", "sts22", settings={"subset": "en"}, note="the en subset"),
    _sts("BIOSSES", "biosses", settings={"min_score": 0.0, "max_score": 4.0}),
    # Classification (samples_per_label as the MTEB task sets it; 8 otherwise).
    _classification(
        "Banking77Classification", "banking77", "Given a online banking query, find the corresponding intents"
    ),
    _classification(
        "EmotionClassification",
        "emotion",
        "Classify the emotion expressed in the given Twitter message into one of the six emotions: "
        "anger, fear, joy, love, sadness, and surprise",
        samples_per_label=16,
    ),
    _classification(
        "MassiveIntentClassification",
        "massive_intent",
        "Given a user utterance as query, find the user intents",
        subset="en",
    ),
    _classification(
        "MassiveScenarioClassification",
        "massive_scenario",
        "Given a user utterance as query, find the user scenarios",
        subset="en",
    ),
    _classification(
        "AmazonCounterfactualClassification",
        "amazon_counterfactual",
        "Classify a given Amazon customer review text as either counterfactual or not-counterfactual",
        samples_per_label=32,
        subset="en",
    ),
    _classification(
        "ToxicConversationsClassification",
        "toxic_conversations",
        "Classify the given comments as either toxic or not toxic",
        samples_per_label=16,
    ),
    _classification(
        "TweetSentimentExtractionClassification",
        "tweet_sentiment_extraction",
        "Classify the sentiment of a given tweet as either positive, negative, or neutral",
        samples_per_label=32,
    ),
    _classification(
        "ImdbClassification",
        "imdb",
        "Classify the sentiment expressed in the given movie review text from the IMDB dataset",
    ),
    _classification(
        "AmazonPolarityClassification", None, "Classify Amazon reviews into positive or negative sentiment"
    ),
    _classification(
        "AmazonReviewsClassification", None, "Classify the given Amazon review into its appropriate rating category"
    ),
    _classification(
        "MTOPDomainClassification",
        None,
        "Classify the intent domain of the given utterance in task-oriented conversation",
    ),
    _classification(
        "MTOPIntentClassification", None, "Classify the intent of the given utterance in task-oriented conversation"
    ),
    # Clustering (MTEB's legacy protocol; the .v2 variants are not implemented).
    _clustering(
        "BiorxivClusteringS2S", "biorxiv_s2s", "Identify the main category of Biorxiv papers based on the titles"
    ),
    _clustering(
        "BiorxivClusteringP2P",
        "biorxiv_p2p",
        "Identify the main category of Biorxiv papers based on the titles and abstracts",
    ),
    _clustering(
        "MedrxivClusteringS2S", "medrxiv_s2s", "Identify the main category of Medrxiv papers based on the titles"
    ),
    _clustering(
        "MedrxivClusteringP2P",
        "medrxiv_p2p",
        "Identify the main category of Medrxiv papers based on the titles and abstracts",
    ),
    _clustering(
        "TwentyNewsgroupsClustering", "twentynewsgroups", "Identify the topic or theme of the given news articles"
    ),
    _clustering(
        "ArxivClusteringS2S",
        "arxiv_s2s",
        "Identify the main and secondary category of Arxiv papers based on the titles",
    ),
    _clustering(
        "ArxivClusteringP2P",
        "arxiv_p2p",
        "Identify the main and secondary category of Arxiv papers based on the titles and abstracts",
    ),
    _clustering("RedditClustering", "reddit", "Identify the topic or theme of Reddit posts based on the titles"),
    _clustering(
        "StackExchangeClustering",
        "stackexchange",
        "Identify the topic or theme of StackExchange posts based on the titles",
    ),
    _clustering(
        "RedditClusteringP2P", None, "Identify the topic or theme of Reddit posts based on the titles and posts"
    ),
    _clustering(
        "StackExchangeClusteringP2P",
        None,
        "Identify the topic or theme of StackExchange posts based on the given paragraphs",
    ),
    # MTEB's English subsets of multilingual clustering sets, as shared/datasets holds them. MasakhaNEWS
    # (subset eng) is legacy clustering: 5 sets, one k-means each; under scikit-learn 1.5.1 it gives MTEB's
    # published scores set by set, later releases' MiniBatchKMeans other ones (bench/mteb_fidelity.py).
    # SIB-200 (eng_Latn) is one set of 1,004 sentences, scored with the bootstrap protocol
    # (SIB200ClusteringFast: max_document_to_embed 1004, 10 samples of 16,384).
    TaskSpec(
        "MasakhaNEWSClusteringS2S",
        "Clustering",
        "clustering/masakhanews_eng/test_s2s.jsonl",
        settings={"subset": "eng"},
        aliases=("masakhanews-s2s", "masakhanews_s2s"),
        instruction="Identify the topic of the given news headlines",
        note="the eng subset; headlines",
    ),
    TaskSpec(
        "MasakhaNEWSClusteringP2P",
        "Clustering",
        "clustering/masakhanews_eng/test_p2p.jsonl",
        settings={"subset": "eng"},
        aliases=("masakhanews-p2p", "masakhanews_p2p"),
        instruction="Identify the topic of the given news articles from their headlines and text",
        note="the eng subset; headline + article",
    ),
    TaskSpec(
        "SIB200ClusteringS2S",
        "Clustering",
        "clustering/sib200_eng",
        settings={"subset": "eng_Latn", "protocol": "bootstrap", "max_documents": 1004},
        aliases=("sib200", "sib-200"),
        instruction="Identify the topic of the given sentences",
        note="the eng_Latn subset; bootstrap protocol (10 k-means on samples of 16,384 drawn with replacement)",
    ),
    # Pair classification
    TaskSpec(
        "RTE3",
        "PairClassification",
        "pair_classification/rte3_en",
        settings={"subset": "en"},
        aliases=("rte-3",),
        instruction="Retrieve a statement that is entailed by the given text",
        note="the en subset",
    ),
    _pairs("SprintDuplicateQuestions", "sprint_duplicate_questions", "Retrieve duplicate questions from Sprint forum"),
    _pairs(
        "TwitterSemEval2015",
        "twitter_semeval2015",
        "Retrieve tweets that are semantically similar to the given tweet",
    ),
    _pairs(
        "TwitterURLCorpus", "twitter_url_corpus", "Retrieve tweets that are semantically similar to the given tweet"
    ),
    # Reranking
    _reranking(
        "StackOverflowDupQuestions",
        "stackoverflow_dup_questions",
        "Retrieve duplicate questions from StackOverflow forum",
    ),
    _reranking(
        "SciDocsRR", "scidocs_rr", "Given a title of a scientific paper, retrieve the titles of other relevant papers"
    ),
    _reranking("AskUbuntuDupQuestions", "askubuntu_dup_questions", "Retrieve duplicate questions from AskUbuntu forum"),
    _reranking("MindSmallReranking", "mind_small", "Retrieve relevant news articles based on user browsing history"),
    # Summarization. SummEval keeps MTEB's original evaluator bug (see tasks/summarization.py); the
    # .v2 task is the fixed one, on the same data. shared/datasets holds SummEval's scores with the
    # PTB-tokenised text of the BARTScore release, not MTEB's raw text: scores are close, not equal.
    TaskSpec(
        "SummEval",
        "Summarization",
        _SUMMEVAL_FILE,
        settings={"legacy_pvalue_bug": True},
        aliases=("summeval",),
        instruction=_SUMMEVAL,
        note="approximate: PTB-tokenised text (BARTScore's copy), MTEB's scores",
    ),
    TaskSpec(
        "SummEvalSummarization.v2",
        "Summarization",
        _SUMMEVAL_FILE,
        instruction=_SUMMEVAL,
        note="approximate: PTB-tokenised text (BARTScore's copy)",
    ),
)

#: Every known task by MTEB name. Add an entry (or call :func:`register`) to add a dataset.
TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in _SPECS}


def register(spec: TaskSpec, *, replace: bool = False) -> TaskSpec:
    """Add ``spec`` to :data:`TASKS` (``replace=True`` overwrites an entry of the same name)."""
    if spec.name in TASKS and not replace:
        raise ValueError(f"a task named {spec.name!r} is already registered")
    TASKS[spec.name] = spec
    return spec


def find(name: str) -> TaskSpec | None:
    """The task called ``name``: its MTEB name, or (case-insensitively) a short name such as
    ``scifact``, ``sickr``, ``sick-r``, ``banking77`` or ``twentynewsgroups``; ``None`` if unknown.

    An exact MTEB name wins; otherwise the first entry with a matching key, in registry order."""
    if name in TASKS:
        return TASKS[name]
    wanted = name.strip().lower()
    return next((spec for spec in TASKS.values() if wanted in spec.lookup_keys()), None)


def get(name: str) -> TaskSpec:
    """:func:`find`, raising :class:`UnknownTaskError` for an unknown name."""
    spec = find(name)
    if spec is None:
        raise UnknownTaskError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
    return spec


def task_type_of(name: str) -> str | None:
    """The MTEB task type of the task called ``name`` (exact MTEB name), or ``None``."""
    spec = TASKS.get(name)
    return spec.task_type if spec else None


V = TypeVar("V")


class _LiveView(Mapping[str, V]):
    """A read-only mapping recomputed from :data:`TASKS` on every access, so it never goes stale."""

    def __init__(self, build: Callable[[], dict[str, V]], what: str) -> None:
        self._build = build
        self._what = what

    def __getitem__(self, key: str) -> V:
        return self._build()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._build())

    def __len__(self) -> int:
        return len(self._build())

    def __repr__(self) -> str:
        return f"<{self._what}, derived from lmembed.task_registry.TASKS: {self._build()!r}>"


def _locations() -> dict[str, str]:
    return {spec.short_name: spec.path for spec in TASKS.values() if spec.short_name and spec.path}


def _aliases() -> dict[str, str]:
    return {alias.lower(): spec.short_name for spec in TASKS.values() if spec.short_name for alias in spec.aliases}


def _instructions() -> dict[str, str]:
    return {spec.name: spec.instruction for spec in TASKS.values() if spec.instruction}


def dataset_locations() -> Mapping[str, str]:
    """Live view: dataset short name (``scifact``, ``sts14``, ``banking77``) → folder under the data root."""
    return _LiveView(_locations, "dataset locations")


def dataset_aliases() -> Mapping[str, str]:
    """Live view: alias (``sick-r``, ``stsb``) → dataset short name."""
    return _LiveView(_aliases, "dataset aliases")


def instructions() -> Mapping[str, str]:
    """Live view: MTEB task name → NV-Embed / E5-mistral task instruction."""
    return _LiveView(_instructions, "task instructions")
