"""bge-en-icl against an independent re-implementation of FlagEmbedding's ``FlagICLModel`` steps.

Written from ``FlagICLModel.set_examples``/``encode_queries``/``encode_corpus``: a query becomes the examples
prefix + ``<instruct>{task}\\n<query>{query}`` (tokenised without special tokens, cut to its budget and decoded
back) + ``\\n<response>``, tokenised with the tokenizer's own special tokens, padded, run causally, and the last
real token's state is taken (``last_token_pool``) and normalised; a document is tokenised as it is.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import WORDS, tiny_decoder_config
from lmembed import Embedder
from lmembed.config import EmbeddingConfig
from lmembed.errors import ConfigError
from lmembed.models import presets

QUERIES = ["what is the protein of a cell", "cat", "a study of the gene in science and the cell"]
DOCS = ["the cat sat on the mat", "a gene study result on the protein of the cell in science", "dog"]
EXAMPLES = [
    {
        "instruct": "Given a web search query, retrieve relevant passages",
        "query": "what is a cell",
        "response": "a cell",
    },
    {"query": "the gene {of} science", "response": "a gene study"},  # braces survive; instruct defaults to the task
]


def build_tokenizer():
    """A byte-level BPE tokenizer (decoding gives back the exact string) that ends every text with </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [" ".join(WORDS), presets.BGE_ICL_DEFAULT_TASK, "<instruct> <query> <response> search the document"]
    tok.train_from_iterator(corpus * 5, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def save_bge_icl(root: Path) -> Path:
    """A tiny Mistral + tokenizer where the Hub cache keeps BAAI/bge-en-icl (recognised by that path)."""
    from transformers import MistralModel

    folder = root / "hub" / "models--BAAI--bge-en-icl" / "snapshots" / "0123abc"
    tok = build_tokenizer()
    torch.manual_seed(0)
    config = tiny_decoder_config("mistral", len(tok))
    config.max_position_embeddings = 512  # room for few-shot examples (lmembed caps max_length at this limit)
    MistralModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------------ the reference, re-written


def last_token_pool(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if bool(mask[:, -1].sum() == mask.shape[0]):  # left padding
        return states[:, -1]
    return states[torch.arange(states.shape[0]), mask.sum(dim=1) - 1]


def flag_icl_encode(
    folder: Path, texts: list[str], task: str | None, examples: list[dict] | None = None, max_length: int = 512
) -> torch.Tensor:
    """FlagICLModel.encode_queries (``task`` given) or encode_corpus (``task=None``), one batch, left padding."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    model = AutoModel.from_pretrained(folder).eval()
    if task is None:
        batch = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    else:
        shots = [
            f"<instruct>{e.get('instruct', task)}\n<query>{e.get('query', '')}\n<response>{e.get('response', '')}"
            for e in examples or []
        ]
        prefix = "\n\n".join(shots) + "\n\n" if shots else ""
        suffix = "\n<response>"
        sentences = [f"<instruct>{task}\n<query>{q}" for q in texts]
        budget = max_length - len(tok("<s>", add_special_tokens=False)["input_ids"])
        budget -= len(tok("\n<response></s>", add_special_tokens=False)["input_ids"])
        cut = tok(sentences, max_length=budget, truncation=True, add_special_tokens=False)["input_ids"]
        decoded = tok.batch_decode(cut)
        room = len(tok(prefix, add_special_tokens=False)["input_ids"]) + len(tok(suffix)["input_ids"]) + max_length
        room = (room + 8) // 8 * 8 + 8
        batch = tok([prefix + d + suffix for d in decoded], padding=True, truncation=True, max_length=room,
                    return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        states = model(**batch).last_hidden_state
    return F.normalize(last_token_pool(states, batch["attention_mask"]), p=2, dim=1)


def assert_close(ours: np.ndarray, reference: torch.Tensor) -> None:
    cosines = (torch.from_numpy(ours).float() * reference).sum(-1) / torch.from_numpy(ours).float().norm(dim=-1)
    assert cosines.min() >= 0.9999, cosines


def embedder(folder: Path, **options) -> Embedder:
    return Embedder.from_pretrained(str(folder), cache=False, show_progress=False, **options)


# ------------------------------------------------------------------------------------------------------ tests


def test_bge_en_icl_matches_flag_icl_model(tmp_path):
    folder = save_bge_icl(tmp_path)
    emb = embedder(folder)
    assert emb.published.preset.family == "bge-en-icl"
    default_task = presets.BGE_ICL_DEFAULT_TASK
    assert_close(emb.encode_queries(QUERIES), flag_icl_encode(folder, QUERIES, default_task))
    task = "search the document"
    assert_close(emb.encode_queries(QUERIES, instruction=task), flag_icl_encode(folder, QUERIES, task))
    assert_close(emb.encode_corpus(DOCS), flag_icl_encode(folder, DOCS, None))
    alone = np.concatenate([emb.encode_queries([q], instruction=task) for q in QUERIES])
    assert_close(alone, flag_icl_encode(folder, QUERIES, task))


def test_bge_en_icl_few_shot_examples(tmp_path, caplog):
    folder = save_bge_icl(tmp_path)
    template = presets.bge_icl_template(EXAMPLES)
    with caplog.at_level(logging.WARNING, logger="lmembed"):
        emb = embedder(folder, instruction_template=template)
    assert not [r for r in caplog.records if "overrides" in r.getMessage()]  # examples are the reference's own
    reference = flag_icl_encode(folder, QUERIES, presets.BGE_ICL_DEFAULT_TASK, EXAMPLES)
    assert_close(emb.encode_queries(QUERIES), reference)
    plain = flag_icl_encode(folder, QUERIES, presets.BGE_ICL_DEFAULT_TASK)
    assert float((reference * plain).sum(-1).min()) < 0.9999  # the examples really change the vectors


def test_bge_en_icl_suffix_is_read_by_last_token_pooling(tmp_path):
    folder = save_bge_icl(tmp_path)
    emb = embedder(folder)
    from lmembed.encoding.inputs import InputBuilder

    builder = InputBuilder(emb.backbone.tokenizer, emb.config, is_decoder=True, max_length=24)
    long_query = " ".join(QUERIES * 4)
    features = builder.build(long_query, "search the document")
    tokens = emb.backbone.tokenizer.convert_ids_to_tokens(features.input_ids)
    assert len(features) <= 24 and tokens[-1] == "</s>" and features.pool_mask[-1] == 1
    assert emb.backbone.tokenizer.decode(features.input_ids).endswith("\n<response></s>")
    assert not emb.sentence_transformers_compatible()  # a suffix has no sentence-transformers prompt


def test_instruction_suffix_needs_lmembed_prompts():
    with pytest.raises(ConfigError, match="instruction_suffix"):
        EmbeddingConfig(instruction_suffix="\n<response>", prompt_style="sentence_transformers")
