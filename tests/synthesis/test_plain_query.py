"""Plain-text query answers (recipes with ``answer: plain-query``, made for small generators that cannot hold a
JSON format): the strict one-line reader and its rejection reasons, the corpus-only and Gecko variants run with a
scripted generator, the passage cut the generator sees, and the local generator's length-sorted batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lmembed.synthesis.generators import LocalGenerator, Request, TinyGenerator
from lmembed.synthesis.parsing import QUERY_REASONS, parse_query_line
from lmembed.synthesis.recipes import SynthesisRecipeError as RecipeError
from lmembed.synthesis.recipes import load_recipe
from lmembed.synthesis.synthesize import synthesize
from test_relabel_recipes import IDS, TOPICS, encode

PASSAGE = "Protein folding in the cell membrane needs energy from ATP, as the experiments with yeast cells show."


@pytest.mark.parametrize(
    ("answer", "query", "reason", "repaired"),
    [
        ("How does protein folding use energy?", "How does protein folding use energy?", None, False),
        ('Query: "Where does membrane folding get energy?"', "Where does membrane folding get energy?", None, True),
        ("**Question:** why do yeast cells fold proteins", "why do yeast cells fold proteins", None, True),
        ("   \n  ", None, "empty", False),
        ('{"query": "protein folding energy"}', None, "not_plain", False),
        ("How does folding use energy?\n\nThis question asks about ATP.", None, "multi_line", False),
        ("Protein folding?", None, "too_short", False),
        ("What " + "protein " * 30 + "folding?", None, "too_long", False),
        ("Protein folding in the cell membrane needs energy from ATP", None, "copy", False),
        ("What is the question?", None, "off_passage", False),
        ("What is the answer to this question?", None, "off_passage", False),
    ],
)
def test_a_plain_query_is_one_sane_line_about_its_passage_or_rejected_with_its_reason(answer, query, reason, repaired):
    parsed = parse_query_line(answer, PASSAGE, min_words=3, max_words=24)
    assert parsed.reason == reason and parsed.repaired == repaired
    assert (parsed.value or {}).get("query") == query
    assert reason is None or reason in QUERY_REASONS


def test_an_answer_instead_of_a_question_is_rejected_only_when_a_question_is_required():
    answer = 'The answer to your question is: "yeast cells fold proteins with ATP energy.'
    assert parse_query_line(answer, PASSAGE).ok
    assert parse_query_line(answer, PASSAGE, question=True).reason == "not_question"
    assert parse_query_line("Why do yeast cells fold proteins?", PASSAGE, question=True).ok


class _Scripted(TinyGenerator):
    """Answers in plain text: a question on the passage's own words, except for passages 1 and 2, whose answers
    are the prompt echoed and a JSON object; records the prompts it was shown."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[str] = []

    def generate(self, requests: list[Request]) -> list[str]:
        out = []
        for request in requests:
            prompt = request.messages[-1]["content"]
            self.prompts.append(prompt)
            passage = next(t for t in TOPICS if t.split()[0] in prompt)
            if passage == TOPICS[1]:
                out.append("What is the question?")
            elif passage == TOPICS[2]:
                out.append('{"query": "garden soil"}')
            else:
                out.append(f"What do we know about {' '.join(passage.split()[:3])}?")
        return out


def test_corpus_only_plain_keeps_sane_queries_and_counts_each_rejection(tmp_path):
    out = tmp_path / "c.jsonl"
    generator = _Scripted()
    stats = synthesize("recipes/synthesis/corpus-only-plain.yaml", generator, out, corpus=(IDS, TOPICS), encode=encode)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert stats["rejected"]["off_passage"] == 1 and stats["rejected"]["not_plain"] == 1
    assert stats["rows"] + sum(stats["rejected"].values()) == len(TOPICS) == stats["attempted"]
    for row in rows:
        assert row["query"].startswith("What do we know about")
        assert row["positive"] in TOPICS and row["negatives"]
        assert row["provenance"]["kind"] == "corpus-only"
    assert all("Reply with the question only" in p for p in generator.prompts)


def test_gecko_plain_relabels_plain_queries_and_carries_an_instruction_only_when_the_recipe_sets_one(tmp_path):
    out = tmp_path / "g.jsonl"
    stats = synthesize("recipes/synthesis/gecko-plain.yaml", _Scripted(), out, corpus=(IDS, TOPICS), encode=encode)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert stats["rows"] == len(rows) == len(TOPICS) - 2
    for row in rows:
        assert row["instruction"] is None and row["query"].startswith("What do we know about")
        assert row["provenance"]["relabel"] == "query-likelihood+relevance"
    recipe = yaml.safe_load(Path("recipes/synthesis/gecko-plain.yaml").read_text())
    path = tmp_path / "instructed.yaml"
    path.write_text(yaml.safe_dump({**recipe, "instruction": "Given a question, retrieve its passage"}))
    synthesize(path, _Scripted(), tmp_path / "i.jsonl", corpus=(IDS, TOPICS), encode=encode)
    rows = [json.loads(line) for line in (tmp_path / "i.jsonl").read_text().splitlines()]
    assert rows and all(row["instruction"] == "Given a question, retrieve its passage" for row in rows)


def test_the_generator_sees_the_passage_cut_and_the_rows_keep_it_whole(tmp_path):
    recipe = yaml.safe_load(Path("recipes/synthesis/corpus-only-plain.yaml").read_text())
    recipe["max_passage_words"] = 2
    path = tmp_path / "cut.yaml"
    path.write_text(yaml.safe_dump(recipe))
    generator = _Scripted()
    synthesize(path, generator, tmp_path / "c.jsonl", corpus=(IDS, TOPICS), encode=encode)
    rows = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert "Text: protein folding ...\n" in generator.prompts[0] and "membrane" not in generator.prompts[0]
    assert rows and all(row["positive"] in TOPICS for row in rows)


def test_a_plain_query_recipe_needs_no_keys_and_an_unknown_answer_kind_is_refused(tmp_path):
    recipe = yaml.safe_load(Path("recipes/synthesis/corpus-only-plain.yaml").read_text())
    assert "keys" not in recipe and load_recipe("recipes/synthesis/corpus-only-plain.yaml").kind == "corpus-only"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**recipe, "answer": "xml"}))
    with pytest.raises(RecipeError, match="'answer' must be json or plain-query"):
        load_recipe(path)
    e5 = yaml.safe_load(Path("recipes/synthesis/e5-mistral.yaml").read_text())
    path.write_text(yaml.safe_dump({**e5, "answer": "plain-query"}))
    with pytest.raises(RecipeError, match="'answer'"):
        load_recipe(path)


def test_the_local_generator_batches_by_prompt_length_and_answers_in_request_order():
    generator = LocalGenerator.__new__(LocalGenerator)  # no model: the batching around it is under test
    generator.batch_size = 2
    batches: list[list[str]] = []

    def fake_batch(requests):
        batches.append([r.messages[0]["content"] for r in requests])
        return [f"answer to {r.messages[0]['content']}" for r in requests]

    generator._generate_batch = fake_batch
    texts = ["a" * 50, "b", "c" * 30, "d" * 2]
    answers = generator.generate([Request(({"role": "user", "content": t},)) for t in texts])
    assert answers == [f"answer to {t}" for t in texts]
    assert batches == [["b", "dd"], ["c" * 30, "a" * 50]]
