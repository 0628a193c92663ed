"""A text read as it is (no instruction, prefix, suffix or echo) is tokenised once where it fits, and its features
are those of the two-pass path (cut by its own tokens, tokenised again) on every tokenizer kind: WordPiece (BERT,
MPNet), byte-level BPE with trimmed offsets (RoBERTa), Unigram with Metaspace (XLM-R), word-level with a BOS
template, and the bundled minilm and SmolLM2 tokenizers (byte-level BPE, a Llama-family decoder's kind)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conftest import build_tokenizer, bundled_or_skip
from family_builders import bpe_tokenizer, unigram_tokenizer, wordpiece_tokenizer
from lmembed.config import EmbeddingConfig
from lmembed.encoding.inputs import InputBuilder

TEXTS = [
    "the cat sat on the mat",
    "",
    "   ",
    "Hello there,   friend!  A longer text.\n\nWith  two\tparagraphs and odd   spacing  ",
    "the study of protein cells shows that gene models predict a result " * 6,
    "Ünïcödé àccents, emoji 🙂🙂 and 漢字 mixed in a sentence about the dog",
    "a literal </s> and [SEP] and <s> inside the text, then more words after them for the cut",
    "x" * 300,
    " leading space then words the cat the dog the mat the rug the man the woman",
]


def _bundled(name: str) -> Callable[[], Any]:
    def load() -> Any:
        from transformers import AutoTokenizer

        from lmembed.models.bundled import resolve_bundled

        return AutoTokenizer.from_pretrained(str(resolve_bundled(bundled_or_skip(name))))

    return load


KINDS: dict[str, tuple[Callable[[], Any], bool]] = {
    "wordpiece-bert": (wordpiece_tokenizer, False),
    "wordpiece-mpnet": (lambda: wordpiece_tokenizer(fairseq=True), False),
    "bpe-roberta": (bpe_tokenizer, False),
    "unigram-xlmr": (unigram_tokenizer, False),
    "wordlevel-bos-decoder": (lambda: build_tokenizer(bos=True), True),
    "minilm": (_bundled("minilm"), False),
    "smollm2-decoder": (_bundled("smollm2-135m"), True),
}


def _builder(kind: str, max_length: int, **strategy: Any) -> InputBuilder:
    make, decoder = KINDS[kind]
    pooling = "last" if decoder else "mean"
    return InputBuilder(make(), EmbeddingConfig(pooling=pooling, **strategy), is_decoder=decoder, max_length=max_length)


@pytest.mark.parametrize("max_length", [6, 16, 512])
@pytest.mark.parametrize("kind", list(KINDS))
def test_one_pass_gives_the_two_pass_features(kind: str, max_length: int) -> None:
    builder = _builder(kind, max_length)
    assert builder._bare(None)
    budget, limit = builder._budget(None)
    expected = builder._build_cut(TEXTS, None, budget, limit)
    got = builder.build_all(TEXTS)
    for text, want, have in zip(TEXTS, expected, got, strict=True):
        assert (have.input_ids, have.pool_mask) == (want.input_ids, want.pool_mask), (kind, max_length, text)
    assert max(len(f) for f in got) <= max_length


@pytest.mark.parametrize("kind", ["wordpiece-bert", "bpe-roberta", "smollm2-decoder"])
def test_texts_that_fit_are_tokenised_once(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    builder = _builder(kind, 512)
    builder._leading_specials()  # a probe, once per builder
    tokenised: list[str] = []
    encode = builder._encode

    def counting(texts: Any, **kwargs: Any) -> Any:
        tokenised.extend(t for t in texts if t)  # _budget counts the (empty) wrapper around a text
        return encode(texts, **kwargs)

    monkeypatch.setattr(builder, "_encode", counting)
    fitting = [t for t in TEXTS[:7] if t]
    builder.build_all(fitting)
    assert tokenised == fitting
    tokenised.clear()
    long = TEXTS[4] * 40
    builder.build_all([long, TEXTS[0]])  # one over the budget: tokenised whole, then cut and tokenised again
    assert len(tokenised) == 3 and tokenised[:2] == [long, TEXTS[0]] and long.startswith(tokenised[2])


@pytest.mark.parametrize(
    "strategy",
    [{"instruction_template": "Instruct: {instruction}\nQuery: "}, {"echo": True}, {"plain_prefix": "<|embed|>\n"}],
)
def test_wrapped_texts_keep_the_two_pass_path(strategy: dict[str, Any]) -> None:
    builder = _builder("smollm2-decoder", 24, **strategy)
    instruction = "find the passage" if "instruction_template" in strategy else None
    assert not builder._bare(instruction)
    budget, limit = builder._budget(instruction)
    assert builder.build_all(TEXTS, instruction) == builder._build_cut(TEXTS, instruction, budget, limit)


@pytest.mark.parametrize("pool_special", [True, False])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_whole_text_mask_reads_as_the_offsets_rule(kind: str, pool_special: bool) -> None:
    """``_whole_mask`` (only the leading tokens' offsets read) equals ``_pool_mask``'s rule for a text with nothing
    excluded (every token's offsets read): specials by ``pool_special``, the rest where their text ends past 0."""
    builder = _builder(kind, 512)
    odd = ["\u200b\u200bzero width first", "\t\n the cat", "🙂 first", "<s> the", "[CLS] the dog", " ", "a"]
    for enc in builder._encode(TEXTS + odd, special=True):
        want = builder._pool_mask(enc.offsets, enc.special_tokens_mask, 0, pool_special)
        assert builder._whole_mask(enc, pool_special) == want, (kind, enc.tokens)
