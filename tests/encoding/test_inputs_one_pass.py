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


#: The pre-tokenizer regex of the Llama-3 / Qwen2 tokenizers (a split before byte-level BPE), written out.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def split_regex_tokenizer() -> Any:
    """Qwen2's and Llama-3's kind: that regex split, then byte-level BPE (trained here on a few sentences)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(TEXTS)] * 3 + ["Hello there, friend! It's a longer text: 12 cats, 3.5 dogs."]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


KINDS: dict[str, tuple[Callable[[], Any], bool]] = {
    "split-regex-decoder": (split_regex_tokenizer, True),
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
    expected = builder._build_cut(TEXTS, None, budget, limit, prefixes=False)
    got = builder.build_all(TEXTS)
    for text, want, have in zip(TEXTS, expected, got, strict=True):
        assert (have.input_ids, have.pool_mask) == (want.input_ids, want.pool_mask), (kind, max_length, text)
    assert max(len(f) for f in got) <= max_length


@pytest.mark.parametrize("kind", ["wordpiece-bert", "bpe-roberta", "smollm2-decoder"])
def test_texts_that_fit_are_tokenised_once(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    builder = _builder(kind, 512)
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
    builder.build_all([long, TEXTS[0]])  # one over the budget: a prefix tokenised, then the cut text
    prefix, fitting_text, cut = tokenised
    assert fitting_text == TEXTS[0] and long.startswith(prefix) and len(prefix) < len(long) and prefix.startswith(cut)


@pytest.mark.parametrize(
    "strategy",
    [{"instruction_template": "Instruct: {instruction}\nQuery: "}, {"echo": True}, {"plain_prefix": "<|embed|>\n"}],
)
def test_wrapped_texts_keep_the_two_pass_path(strategy: dict[str, Any]) -> None:
    builder = _builder("smollm2-decoder", 24, **strategy)
    instruction = "find the passage" if "instruction_template" in strategy else None
    assert not builder._bare(instruction)
    budget, limit = builder._budget(instruction)
    assert builder.build_all(TEXTS, instruction) == builder._build_cut(
        TEXTS, instruction, budget, limit, prefixes=False
    )


@pytest.mark.parametrize("pool_special", [True, False])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_whole_text_mask_reads_as_the_offsets_rule(kind: str, pool_special: bool) -> None:
    """``_pool_mask`` with nothing excluded pools every token, as sentence-transformers does: specials by
    ``pool_special``, every other token, one with no text of its own included (a byte-level BPE's "Ġ" before a text
    that starts with a space was left out: the RoBERTa family's vectors of such texts differed from the reference)."""
    builder = _builder(kind, 512)
    odd = ["\u200b\u200bzero width first", "\t\n the cat", "🙂 first", "<s> the", "[CLS] the dog", " ", "a"]
    for enc in builder._encode(TEXTS + odd, special=True):
        rule = [(1 if pool_special else 0) if is_special else 1 for is_special in enc.special_tokens_mask]
        assert builder._pool_mask(enc, 0, pool_special) == rule, (kind, enc.tokens)


def _random_texts(seed: int, n: int) -> list[str]:
    """Long texts of every kind of piece a tokenizer splits on: words in and out of the vocabularies, punctuation,
    runs of spaces and newlines, accents, emoji, CJK, digits, literal special tokens, a very long unknown word."""
    import random

    rng = random.Random(seed)
    pieces = [
        *("the", "cat", "sat", "on", "mat", "protein", "gene", "study", "result", "hello", "friend", "longer"),
        *(",", ".", "!", "?", ":", "'s", "(", ")", "--", "  ", "\n", "\n\n", "\t", "   "),
        *("Ünïcödé", "àccents", "🙂", "🙂🙂", "漢字", "字", "12345", "3.14", "</s>", "[SEP]", "<s>", "x" * 70),
    ]
    texts = []
    for _ in range(n):
        words = [rng.choice(pieces) for _ in range(rng.randint(40, 400))]
        joiners = [rng.choice([" ", " ", " ", "", "  "]) for _ in words]
        texts.append("".join(w + j for w, j in zip(words, joiners, strict=True)))
    return texts


@pytest.mark.parametrize("max_length", [8, 24, 64])
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_long_text_cut_on_a_prefix_gives_the_whole_texts_features(kind: str, max_length: int) -> None:
    """Texts far over the budget are cut where their prefix's tokens say (the rest never tokenised): the features
    equal the two-pass path's, which tokenises every text whole, on 60 random long texts per tokenizer and length."""
    builder = _builder(kind, max_length)
    texts = _random_texts(seed=max_length, n=60)
    budget, limit = builder._budget(None)
    assert builder._prefixes_are_exact()  # every kind here splits locally: the prefix path is really taken ...
    assert len(builder._exact_prefixes(texts, budget)) > 30  # ... for most of the texts
    expected = builder._build_cut(texts, None, budget, limit, prefixes=False)
    got = builder.build_all(texts)
    for text, want, have in zip(texts, expected, got, strict=True):
        assert (have.input_ids, have.pool_mask) == (want.input_ids, want.pool_mask), (kind, max_length, text[:200])


def test_a_tokenizer_that_reads_the_whole_text_at_once_is_never_cut_on_a_prefix() -> None:
    """No pre-tokenizer (the model sees the text as one piece) or an unknown step: every text is tokenised whole."""
    from tokenizers import Tokenizer, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "a": 1, "b": 2}
    rust = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))  # no pre-tokenizer: one piece
    whole = PreTrainedTokenizerFast(tokenizer_object=rust, unk_token="[UNK]", eos_token="[UNK]")
    builder = InputBuilder(whole, EmbeddingConfig(pooling="mean"), is_decoder=False, max_length=8)
    assert not builder._prefixes_are_exact()
    assert builder._exact_prefixes(["a b " * 500], 8) == {}
    builder = _builder("wordpiece-bert", 8)
    builder.tokenizer.backend_tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.BertNormalizer()]
    )
    builder._prefix_safe = None
    assert builder._prefixes_are_exact()  # a sequence of local steps is local


@pytest.mark.parametrize(
    "strategy",
    [{"instruction_template": "Instruct: {instruction}\nQuery: "}, {"echo": True}, {"plain_prefix": "<|embed|>\n"}],
)
@pytest.mark.parametrize("kind", ["bpe-roberta", "smollm2-decoder", "unigram-xlmr"])
def test_wrapped_long_texts_cut_on_a_prefix_as_on_the_whole_text(kind: str, strategy: dict[str, Any]) -> None:
    builder = _builder(kind, 64, **strategy)
    instruction = "find the passage" if "instruction_template" in strategy else None
    texts = _random_texts(seed=7, n=40)
    budget, limit = builder._budget(instruction)
    assert builder._exact_prefixes(texts, budget)  # the prefix path is taken
    whole = builder._build_cut(texts, instruction, budget, limit, prefixes=False)
    assert builder.build_all(texts, instruction) == whole


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("kind", ["wordpiece-bert", "bpe-roberta", "smollm2-decoder", "minilm"])
def test_prompted_long_texts_read_on_a_prefix_are_truncated_as_whole(
    kind: str, side: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sentence-transformers prompts: a prompted string is truncated by the tokenizer to its first tokens; where a
    prefix shows them exactly only the prefix is read (right truncation; left truncation keeps the end: never)."""
    make, decoder = KINDS[kind]
    tokenizer = make()
    tokenizer.truncation_side = side
    config = EmbeddingConfig(
        pooling="last" if decoder else "mean",
        prompt_style="sentence_transformers",
        instruction_template="{instruction}",
    )
    builder = InputBuilder(tokenizer, config, is_decoder=decoder, max_length=32)
    texts = _random_texts(seed=11, n=40)
    taken: list[int] = []
    exact = builder._exact_prefixes

    def spy(strings: Any, budget: int) -> dict[int, int]:
        found = exact(strings, budget)
        taken.append(len(found))
        return found

    monkeypatch.setattr(builder, "_exact_prefixes", spy)
    got = builder.build_all(texts, "query: ")
    assert (sum(taken) > 20) if side == "right" else not taken
    monkeypatch.setattr(builder, "_exact_prefixes", lambda strings, budget: {})  # every string read whole
    assert got == builder.build_all(texts, "query: ")


@pytest.mark.parametrize("kind", ["wordpiece-bert", "bpe-roberta", "smollm2-decoder", "minilm", "split-regex-decoder"])
def test_a_left_truncating_tokenizer_keeps_the_end_of_a_long_text(kind: str) -> None:
    """A folder whose tokenizer truncates on the left (``truncation_side: left``) had its long texts cut from the
    start anyway, unless it used sentence-transformers prompts (another vector than sentence-transformers'). A bare
    text is now truncated by the tokenizer itself; a wrapped one keeps its last tokens inside the whole wrapper."""
    make, decoder = KINDS[kind]
    tokenizer = make()
    tokenizer.truncation_side = "left"
    builder = InputBuilder(tokenizer, EmbeddingConfig(pooling="mean"), is_decoder=decoder, max_length=24)
    texts = _random_texts(seed=5, n=20)
    eos = [builder.eos_id] if builder.eos_id is not None and not builder.tokenizer_ends_with_eos else []
    for text, features in zip(texts, builder.build_all(texts), strict=True):
        own = tokenizer(text, truncation=True, max_length=24 - len(eos))["input_ids"]
        assert features.input_ids == own + eos, text
    wrapped = InputBuilder(
        tokenizer, EmbeddingConfig(pooling="mean", instruction_template="Q: {instruction} | "), is_decoder=decoder,
        max_length=24,
    )  # fmt: skip
    specials = set(tokenizer.all_special_ids)
    wrapper = tokenizer("Q: find | ", add_special_tokens=False)["input_ids"][:-1]  # its last may join the text
    wrapper = [i for i in wrapper if i not in specials]
    sentences = [
        f"the study of protein cells shows that gene models predict a result {i} " * 6 + "the end" for i in (1, 2)
    ]
    for text, features in zip(sentences, wrapped.build_all(sentences, "find"), strict=True):
        ids = [i for i in features.input_ids if i not in specials]
        tail = [i for i in tokenizer(text, add_special_tokens=False)["input_ids"] if i not in specials][-3:]
        assert ids[: len(wrapper)] == wrapper and ids[-3:] == tail, text  # the whole wrapper, the text's end


@pytest.mark.parametrize("kind", ["smollm2-decoder", "split-regex-decoder", "bpe-roberta"])
def test_a_wrapped_long_text_is_cut_as_the_published_cards_cut(kind: str) -> None:
    """E5-mistral's and SFR's cards tokenise ``instruction + query`` whole, truncated to ``max_length - 1``, then
    append EOS. The text was cut on its own tokens, and where the wrapper's last space joins the text's first word a
    byte-level tokenizer counts that word apart: 1-3 tokens of the window stayed unused, and a last-token vector
    differed from the card's."""
    make, _ = KINDS[kind]
    tokenizer = make()
    template = "Instruct: {instruction}\nQuery: "
    builder = InputBuilder(
        tokenizer, EmbeddingConfig(pooling="last", instruction_template=template, add_eos=True), is_decoder=True,
        max_length=32,
    )  # fmt: skip
    texts = _random_texts(seed=3, n=40)
    eos = builder.eos_id
    for text, features in zip(texts, builder.build_all(texts, "find the passage"), strict=True):
        room = 32 if builder.tokenizer_ends_with_eos else 31  # SFR's tokenizer adds EOS itself; E5-mistral's not
        card = tokenizer(template.format(instruction="find the passage") + text, truncation=True, max_length=room)
        ids = card["input_ids"] if card["input_ids"][-1] == eos else [*card["input_ids"], eos]
        assert features.input_ids == ids, text
