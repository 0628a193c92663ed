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
included; "STS*" there means one definition for every STS task. E5-mistral's own paper is not in
the project's library, so ``"e5-mistral"`` is the same table rather than an independently checked
copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from lmembed.config import DEFAULT_INSTRUCTION_TEMPLATE as DEFAULT_TEMPLATE

STS_INSTRUCTION = "Retrieve semantically similar text."

_STS_TASKS = (
    "STSBenchmark",
    "SICK-R",
    "STS12",
    "STS13",
    "STS14",
    "STS15",
    "STS16",
    "STS17",
    "STS22",
    "BIOSSES",
)

NV_EMBED_INSTRUCTIONS: dict[str, str] = {
    # Retrieval
    "ArguAna": "Given a claim, retrieve documents that support or refute the claim",
    "ClimateFEVER": "Given a claim about climate change, retrieve documents that support or refute the claim",
    "DBPedia": "Given a query, retrieve relevant entity descriptions from DBPedia",
    "FEVER": "Given a claim, retrieve documents that support or refute the claim",
    "FiQA2018": "Given a financial question, retrieve user replies that best answer the question",
    "HotpotQA": "Given a multi-hop question, retrieve documents that can help answer the question",
    "MSMARCO": "Given a web search query, retrieve relevant passages that answer the query",
    "NFCorpus": "Given a question, retrieve relevant documents that answer the question",
    "NQ": "Given a question, retrieve passages that answer the question",
    "QuoraRetrieval": "Given a question, retrieve questions that are semantically equivalent to the given question",
    "SCIDOCS": "Given a scientific paper title, retrieve paper abstracts that are cited by the given paper",
    "SciFact": "Given a scientific claim, retrieve documents that support or refute the claim",
    "Touche2020": "Given a question, retrieve passages that answer the question",
    "TRECCOVID": "Given a query on COVID-19, retrieve documents that answer the query",
    # STS (one definition for all) and summarization
    **dict.fromkeys(_STS_TASKS, STS_INSTRUCTION),
    "SummEval": "Given a news summary, retrieve other semantically similar summaries",
    "SummEvalSummarization.v2": "Given a news summary, retrieve other semantically similar summaries",
    # Classification
    "AmazonCounterfactualClassification": (
        "Classify a given Amazon customer review text as either counterfactual or not-counterfactual"
    ),
    "AmazonPolarityClassification": "Classify Amazon reviews into positive or negative sentiment",
    "AmazonReviewsClassification": "Classify the given Amazon review into its appropriate rating category",
    "Banking77Classification": "Given a online banking query, find the corresponding intents",
    "EmotionClassification": (
        "Classify the emotion expressed in the given Twitter message into one of the six emotions: "
        "anger, fear, joy, love, sadness, and surprise"
    ),
    "ImdbClassification": "Classify the sentiment expressed in the given movie review text from the IMDB dataset",
    "MassiveIntentClassification": "Given a user utterance as query, find the user intents",
    "MassiveScenarioClassification": "Given a user utterance as query, find the user scenarios",
    "MTOPDomainClassification": "Classify the intent domain of the given utterance in task-oriented conversation",
    "MTOPIntentClassification": "Classify the intent of the given utterance in task-oriented conversation",
    "ToxicConversationsClassification": "Classify the given comments as either toxic or not toxic",
    "TweetSentimentExtractionClassification": (
        "Classify the sentiment of a given tweet as either positive, negative, or neutral"
    ),
    # Clustering
    "ArxivClusteringP2P": "Identify the main and secondary category of Arxiv papers based on the titles and abstracts",
    "ArxivClusteringS2S": "Identify the main and secondary category of Arxiv papers based on the titles",
    "BiorxivClusteringP2P": "Identify the main category of Biorxiv papers based on the titles and abstracts",
    "BiorxivClusteringS2S": "Identify the main category of Biorxiv papers based on the titles",
    "MedrxivClusteringP2P": "Identify the main category of Medrxiv papers based on the titles and abstracts",
    "MedrxivClusteringS2S": "Identify the main category of Medrxiv papers based on the titles",
    "RedditClustering": "Identify the topic or theme of Reddit posts based on the titles",
    "RedditClusteringP2P": "Identify the topic or theme of Reddit posts based on the titles and posts",
    "StackExchangeClustering": "Identify the topic or theme of StackExchange posts based on the titles",
    "StackExchangeClusteringP2P": "Identify the topic or theme of StackExchange posts based on the given paragraphs",
    "TwentyNewsgroupsClustering": "Identify the topic or theme of the given news articles",
    # Reranking
    "AskUbuntuDupQuestions": "Retrieve duplicate questions from AskUbuntu forum",
    "MindSmallReranking": "Retrieve relevant news articles based on user browsing history",
    "SciDocsRR": "Given a title of a scientific paper, retrieve the titles of other relevant papers",
    "StackOverflowDupQuestions": "Retrieve duplicate questions from StackOverflow forum",
    # Pair classification
    "SprintDuplicateQuestions": "Retrieve duplicate questions from Sprint forum",
    "TwitterSemEval2015": "Retrieve tweets that are semantically similar to the given tweet",
    "TwitterURLCorpus": "Retrieve tweets that are semantically similar to the given tweet",
}

INSTRUCTION_SETS: dict[str, Mapping[str, str]] = {
    "nv-embed": NV_EMBED_INSTRUCTIONS,
    "e5-mistral": NV_EMBED_INSTRUCTIONS,
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
