"""Decontamination: drop training rows that overlap the evaluation sets a model will be scored on.

A training row is a tuple of texts (a query and its positives, say). It is *contaminated* when one of its
texts repeats an evaluation item: a retrieval task's query, or any text of an STS, classification,
clustering or pair-classification task (a retrieval corpus is not an evaluation item: training on the
documents of a public corpus is how BEIR train splits work). Five tests, cheapest first; the first that
fires names the reason:

``exact``
    the texts are equal after normalisation (lower case, punctuation dropped, white space folded);
``ngram``
    they share a run of ``ngram`` words (13 by default, the length GPT-3's report used), for texts at least
    that long;
``contains``
    a row's query holds an evaluation text of ``contains`` (6) to ``ngram`` − 1 words as a run of its words (a
    short test query wrapped in other words, "Is it true that <query>?": the n-gram test does not see texts
    shorter than ``ngram`` words, and the BM25 test compares texts of like length only). Queries only: a passage
    may well use a short test query's phrase ("the effect of aspirin on cardiovascular events") as any text on
    its subject does;
``near_duplicate``
    the Jaccard similarity of their sets of words is at least ``near_duplicate`` (0.8), among the evaluation
    texts BM25 ranks highest for the training text (sets of words rather than of word n-grams: one changed
    word in a ten-word query leaves 9/11 of the words shared but only 5/11 of the 3-grams);
``bm25``
    the BM25 score of the training text against the evaluation text, divided by that evaluation text's
    score against itself, is at least ``bm25`` (0.9), for texts of comparable length (neither has more than
    1.5 times the other's words): NV-Embed filtered its classification training data with a BM25 similarity
    threshold against the MTEB evaluation sets. The relative score only says how much of the evaluation
    text's weight the training text covers, so without the length bound any longer text that contains a short
    text's rarer words would count (on the NLI triplets against SICK-R, "A woman in a blue shirt talking to a
    baby." against "There is no baby talking" scored 1.0). Each word of the training text counts once, and an
    evaluation text with fewer than two words that are not stop words is left to the other tests.

BM25 comes from :mod:`lmembed.lexical` (``bm25s``). The result lists every dropped row with its reason, the
matched evaluation set and text, so a user can check what went and why.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from lmembed.errors import ConfigError

REASONS = ("exact", "ngram", "contains", "near_duplicate", "bm25")
#: The BM25 test needs an evaluation text with at least this many distinct indexed (non-stop) words: "No you are
#: not." keeps only "no", and every text with a "no" in it would cover all of its weight.
MIN_BM25_WORDS = 2
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class DecontaminationSettings:
    """The five tests' thresholds (``None`` turns a test off); see the module docstring."""

    ngram: int | None = 13
    contains: int | None = 6
    near_duplicate: float | None = 0.8
    bm25: float | None = 0.9
    candidates: int = 5  # evaluation texts BM25 proposes per training text for the last two tests

    def __post_init__(self) -> None:
        if self.ngram is not None and self.ngram < 3:
            raise ConfigError(f"decontamination ngram={self.ngram}: use 3 words or more (or None to turn it off)")
        if self.contains is not None and self.contains < 3:
            raise ConfigError(f"decontamination contains={self.contains}: use 3 words or more (or None: off)")
        # a Jaccard overlap is at most 1 (above it the test would silently never fire); a relative BM25 score may
        # pass 1 a little (a training text that repeats the evaluation text's rare words)
        for name, top in (("near_duplicate", 1.0), ("bm25", 1.5)):
            value = getattr(self, name)
            if value is not None and not 0 < value <= top:
                raise ConfigError(f"decontamination {name}={value}: a threshold in (0, {top:g}], or None: off")
        if self.candidates < 1:
            raise ConfigError(f"decontamination candidates={self.candidates}: at least 1")


@dataclass(frozen=True)
class ProtectedText:
    """One evaluation text and where it comes from."""

    text: str
    source: str  # the evaluation set's name


@dataclass(frozen=True)
class Drop:
    """Why one training row was dropped."""

    row: int  # index of the row in the input
    reason: str  # one of REASONS
    text: str  # the row's text that matched
    matched: str  # the evaluation text it matched
    source: str  # the evaluation set
    score: float  # 1.0 for exact; the n-gram or contained text's length; the Jaccard similarity; the relative BM25


@dataclass
class DecontaminationReport:
    """What was kept and what was dropped, and why."""

    kept: list[int]
    dropped: list[Drop]
    protected: dict[str, int]  # evaluation set → number of texts checked against
    settings: DecontaminationSettings
    rows: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "rows": self.rows,
            "kept": len(self.kept),
            "dropped": len(self.dropped),
            "by_reason": self.by_reason,
            "by_source": dict(Counter(d.source for d in self.dropped)),
            "protected": self.protected,
            "settings": asdict(self.settings),
            "drops": [asdict(d) for d in self.dropped],
        }

    def markdown(self, *, examples: int = 10) -> str:
        """A short human-readable summary with the first ``examples`` drops."""
        lines = [
            f"Decontamination: {self.rows} rows, {len(self.kept)} kept, {len(self.dropped)} dropped.",
            "",
            "| reason | rows |",
            "|---|---:|",
            *(f"| {reason} | {self.by_reason.get(reason, 0)} |" for reason in REASONS),
            "",
            "Checked against: " + ", ".join(f"{name} ({n} texts)" for name, n in self.protected.items()),
        ]
        if self.dropped:
            lines += [
                "",
                "| row | reason | score | evaluation set | training text | evaluation text |",
                "|---|---|---|---|---|---|",
            ]
            for d in self.dropped[:examples]:
                lines.append(
                    f"| {d.row} | {d.reason} | {d.score:.3g} | {d.source} | {_clip(d.text)} | {_clip(d.matched)} |"
                )
        return "\n".join(lines) + "\n"


def _clip(text: str, width: int = 60) -> str:
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def words(text: str) -> list[str]:
    """Lower-cased words of ``text`` (Unicode-normalised; punctuation dropped)."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).lower())


def normalise(text: str) -> str:
    """The form the exact test compares."""
    return " ".join(words(text))


def shingles(tokens: Sequence[str], n: int = 3) -> set[tuple[str, ...]]:
    """Word n-grams of ``tokens`` (the whole text when it is shorter than ``n``)."""
    if len(tokens) < n:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def comparable(a: int, b: int, ratio: float = 1.5) -> bool:
    """Two word counts within ``ratio`` of each other (the BM25 test's length bound)."""
    return max(a, b) <= ratio * max(1, min(a, b))


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


class Decontaminator:
    """Evaluation texts indexed once; :meth:`check` finds what a training text overlaps."""

    def __init__(self, protected: Sequence[ProtectedText], settings: DecontaminationSettings | None = None) -> None:
        self.settings = settings or DecontaminationSettings()
        self.protected = list(protected)
        self.tokens = [words(p.text) for p in self.protected]
        self.exact = {" ".join(t): i for i, t in enumerate(self.tokens) if t}
        n = self.settings.ngram
        self.ngrams: dict[tuple[str, ...], int] = {}
        if n is not None:
            for i, t in enumerate(self.tokens):
                for gram in shingles(t, n) if len(t) >= n else ():
                    self.ngrams.setdefault(gram, i)
        # shorter evaluation texts, searched whole inside a training text (longer ones share an n-gram with it)
        self.contained: dict[tuple[str, ...], int] = {}
        low = self.settings.contains
        if low is not None:
            for i, t in enumerate(self.tokens):
                if len(t) >= low and (n is None or len(t) < n):
                    self.contained.setdefault(tuple(t), i)
        self.contained_lengths = sorted({len(t) for t in self.contained})
        self.lexical = None
        self.self_scores = np.zeros(0)
        self.known_words: list[int] = []
        if self.protected and (self.settings.near_duplicate is not None or self.settings.bm25 is not None):
            self._index()

    def _index(self) -> None:
        from lmembed.lexical import LexicalIndex

        texts = [p.text for p in self.protected]
        self.lexical = LexicalIndex.build(texts, [str(i) for i in range(len(texts))])
        depth = min(len(texts), 10)
        scores, rows = self.lexical.search(texts, depth)
        self_scores = np.zeros(len(texts))
        for i in range(len(texts)):
            own = np.flatnonzero(rows[i] == i)
            # its own score (a duplicate may outrank it: then the best score it reached)
            self_scores[i] = scores[i, own[0]] if own.size else scores[i, 0]
        self.self_scores = self_scores
        self.known_words = self.lexical.known_words(texts)

    def check_many(self, texts: Sequence[str], queries: Sequence[bool] | None = None) -> list[Drop | None]:
        """For each text, the first test it fails (``Drop.row`` is the text's position), or ``None``; ``queries``
        marks the texts that are a row's query (the ``contains`` test reads only those; default: all)."""
        marks = [True] * len(texts) if queries is None else list(queries)
        found: list[Drop | None] = [self._cheap(i, t, marks[i]) for i, t in enumerate(texts)]
        pending = [i for i, d in enumerate(found) if d is None]
        if self.lexical is None or not pending:
            return found
        depth = min(self.settings.candidates, len(self.protected))
        # each word once: BM25 sums over the query's words, so a repeated word would count twice
        queries = [" ".join(dict.fromkeys(words(texts[i]))) for i in pending]
        scores, rows = self.lexical.search(queries, depth)
        for slot, i in enumerate(pending):
            found[i] = self._by_candidates(i, texts[i], scores[slot], rows[slot])
        return found

    def _drop(self, position: int, reason: str, text: str, match: int, score: float) -> Drop:
        p = self.protected[match]
        return Drop(position, reason, text, p.text, p.source, float(score))

    def _cheap(self, position: int, text: str, query: bool = True) -> Drop | None:
        tokens = words(text)
        if not tokens:
            return None
        match = self.exact.get(" ".join(tokens))
        if match is not None:
            return self._drop(position, "exact", text, match, 1.0)
        n = self.settings.ngram
        if n is not None and len(tokens) >= n:
            for gram in shingles(tokens, n):
                match = self.ngrams.get(gram)
                if match is not None:
                    return self._drop(position, "ngram", text, match, float(n))
        for length in self.contained_lengths if query else ():
            if length > len(tokens):
                break
            for gram in shingles(tokens, length):
                match = self.contained.get(gram)
                if match is not None:
                    return self._drop(position, "contains", text, match, float(length))
        return None

    def _by_candidates(self, position: int, text: str, scores: np.ndarray, rows: np.ndarray) -> Drop | None:
        tokens = words(text)
        mine = set(tokens)
        for score, row in zip(scores, rows, strict=True):
            if row < 0:
                continue
            if self.settings.near_duplicate is not None:
                similarity = jaccard(mine, set(self.tokens[row]))
                if similarity >= self.settings.near_duplicate:
                    return self._drop(position, "near_duplicate", text, int(row), similarity)
            if (
                self.settings.bm25 is not None
                and self.known_words[row] >= MIN_BM25_WORDS
                and comparable(len(tokens), len(self.tokens[row]))
            ):
                relative = float(score) / self.self_scores[row] if self.self_scores[row] > 0 else 0.0
                if relative >= self.settings.bm25:
                    return self._drop(position, "bm25", text, int(row), relative)
        return None


def decontaminate(
    rows: Sequence[Sequence[str]],
    protected: Sequence[ProtectedText],
    settings: DecontaminationSettings | None = None,
) -> DecontaminationReport:
    """Check every text of every row (its first text is its query) against ``protected``; a row with one
    contaminated text is dropped."""
    checker = Decontaminator(protected, settings)
    flat: list[str] = []
    owner: list[int] = []
    queries: list[bool] = []
    for r, texts in enumerate(rows):
        for k, text in enumerate(texts):
            flat.append(text)
            owner.append(r)
            queries.append(k == 0)  # a row's first text is its query
    first: dict[int, Drop] = {}
    for drop in checker.check_many(flat, queries):
        if drop is not None and owner[drop.row] not in first:
            row = owner[drop.row]
            first[row] = Drop(row, drop.reason, drop.text, drop.matched, drop.source, drop.score)
    dropped = [first[r] for r in sorted(first)]
    return DecontaminationReport(
        kept=[r for r in range(len(rows)) if r not in first],
        dropped=dropped,
        protected=dict(Counter(p.source for p in protected)),
        settings=checker.settings,
        rows=len(rows),
        by_reason=dict(Counter(d.reason for d in dropped)),
    )


def protected_texts(sources: Mapping[str, Iterable[str]]) -> list[ProtectedText]:
    """``{evaluation set: its texts}`` → the flat list :func:`decontaminate` takes (duplicates kept once)."""
    out: list[ProtectedText] = []
    for source, texts in sources.items():
        out.extend(ProtectedText(t, source) for t in dict.fromkeys(texts) if t.strip())
    return out
