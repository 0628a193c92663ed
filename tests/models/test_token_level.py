"""Published models exact at the token level, with byte-level BPE tokenizers (a word-level tokenizer cannot see a
space glued to a word, nor a word split differently in context than alone).

Each reference is written from the authors' code (model cards, FlagEmbedding, llm2vec, sentence-transformers'
prompts) and run on the checkpoint as those authors' transformers read it; lmembed loads the checkpoint as
transformers 5 reads it, where a fast Llama tokenizer whose ``tokenizer.json`` adds only ``<s>`` ignores
``add_eos_token`` in ``tokenizer_config.json``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import WORDS, tiny_decoder_config
from lmembed.encoding.inputs import InputBuilder
from lmembed.models import presets
from test_bge_icl import flag_icl_encode
from test_presets import (
    assert_close,
    e5_card_reference,
    embedder,
    hub_snapshot,
    llm2vec_reference,
    save_adapter,
)

SPECIALS = ["<unk>", "<s>", "</s>", "[CLS]", "[SEP]", "[PAD]"]
QUERIES = ["what is the protein of a cell", "cat", "protein study result"]
DOCS = ["the cat sat on the mat", "a gene study result on the protein of the cell in science", "dog"]
TASK = "search the document"


def bpe_tokenizer(template: str):
    """A byte-level BPE (Llama-3 / Mistral style: decoding gives back the string, a leading space is part of the
    token) with ``template`` as its post-processor: ``"<s> $A"`` adds only BOS, ``"<s> $A </s>"`` ends texts with
    EOS, ``"[CLS] $A [SEP]"`` is an encoder's. Trained on words that follow a space, so a word at the start of a
    string splits into more tokens than the same word after a space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        " " + " ".join(WORDS),
        " what is the protein of a cell",
        presets.BGE_ICL_DEFAULT_TASK,
        "<instruct> <query> <response> search the document query: passage: Represent this sentence",
    ]
    tok.train_from_iterator(corpus * 5, trainer)
    names = [name for name in ("<s>", "</s>", "[CLS]", "[SEP]") if name in template.split()]
    tok.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(name, tok.token_to_id(name)) for name in names]
    )
    encoder = template.startswith("[CLS]")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token=None if encoder else "<s>",
        eos_token=None if encoder else "</s>",
        cls_token="[CLS]" if encoder else None,
        sep_token="[SEP]" if encoder else None,
        pad_token="[PAD]" if encoder else "<unk>",
        clean_up_tokenization_spaces=False,
    )


def save_decoder(folder: Path, family: str, template: str, seed: int = 0, positions: int = 512) -> Path:
    """A tiny random decoder + byte-level tokenizer saved with transformers' own file names."""
    from transformers import AutoModel

    tok = bpe_tokenizer(template)
    torch.manual_seed(seed)
    config = tiny_decoder_config(family, len(tok))
    config.max_position_embeddings = positions
    AutoModel.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def as_published(tmp_path: Path, hub_id: str, family: str = "mistral") -> tuple[Path, Path]:
    """(the checkpoint as transformers 5 reads it: tokenizer.json adds only <s> though tokenizer_config.json says
    add_eos_token, the same weights with the tokenizer its authors' transformers built: every text ends in </s>)."""
    folder = save_decoder(hub_snapshot(tmp_path, hub_id), family, "<s> $A")
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(add_bos_token=True, add_eos_token=True)
    config_file.write_text(json.dumps(config))
    reference = tmp_path / "as-its-authors-ran-it"
    shutil.copytree(folder, reference)
    bpe_tokenizer("<s> $A </s>").save_pretrained(reference)
    return folder, reference


def cosines(ours: np.ndarray, reference: torch.Tensor) -> np.ndarray:
    ref = F.normalize(reference.float(), dim=-1).numpy()
    return (ours * ref).sum(1) / np.linalg.norm(ours, axis=1)


# ---------------------------------------------------------------------------------------------- the final </s>


@pytest.mark.parametrize("hub_id", ["Salesforce/SFR-Embedding-Mistral", "intfloat/e5-mistral-7b-instruct"])
def test_last_token_families_end_with_the_eos_their_tokenizer_appended(tmp_path, hub_id):
    folder, reference = as_published(tmp_path, hub_id)
    emb = embedder(folder)
    assert emb.backbone.tokenizer("cat")["input_ids"][-1] != emb.backbone.tokenizer.eos_token_id  # drops </s>
    assert_close(
        emb.encode_queries(QUERIES, instruction=TASK), e5_card_reference(reference, QUERIES, TASK, append_eos=False)
    )
    assert_close(emb.encode_corpus(DOCS), e5_card_reference(reference, DOCS, None, append_eos=False))
    assert cosines(emb.encode_corpus(DOCS), e5_card_reference(folder, DOCS, None, append_eos=False)).min() < 0.99


def test_bge_en_icl_ends_with_the_eos_its_tokenizer_appended(tmp_path):
    folder, reference = as_published(tmp_path, "BAAI/bge-en-icl")
    emb = embedder(folder)
    assert_close(emb.encode_queries(QUERIES), flag_icl_encode(reference, QUERIES, presets.BGE_ICL_DEFAULT_TASK))
    assert_close(emb.encode_queries(QUERIES, instruction=TASK), flag_icl_encode(reference, QUERIES, TASK))
    assert_close(emb.encode_corpus(DOCS), flag_icl_encode(reference, DOCS, None))


def test_a_tokenizer_that_appends_eos_itself_gets_no_second_one_and_the_same_cut(tmp_path):
    folder = save_decoder(hub_snapshot(tmp_path, "Salesforce/SFR-Embedding-Mistral"), "mistral", "<s> $A </s>")
    emb = embedder(folder)
    tok = emb.backbone.tokenizer
    builder = InputBuilder(tok, emb.config, is_decoder=True, max_length=16)
    long_text = " ".join(DOCS * 3)
    for text in ("cat", long_text):
        ours = builder.build(text).input_ids
        assert ours == tok(text, truncation=True, max_length=16)["input_ids"]  # the card's own cut, one </s>
        assert ours.count(tok.eos_token_id) == 1 and ours[-1] == tok.eos_token_id


# ---------------------------------------------------------------------------------------------- LLM2Vec


def test_llm2vec_counts_the_text_tokens_as_its_embed_mask_does(tmp_path):
    """ " protein" after the instruction is one token, "protein" alone is several: llm2vec's embed mask covers as
    many trailing positions as the text has alone, so it reaches into the instruction; lmembed does the same."""
    from transformers import AutoModel

    mntp = tmp_path / "LLM2Vec-tiny-mntp"
    base = save_decoder(mntp / "base", "llama", "<s> $A")  # an adapter's base lies inside its folder
    save_adapter(AutoModel.from_pretrained(base), mntp, "base", seed=1)
    AutoModel.from_pretrained(base).config.save_pretrained(mntp)
    bpe_tokenizer("<s> $A").save_pretrained(mntp)
    tok = bpe_tokenizer("<s> $A")
    instruction = "search the document:"
    text = "protein study result"
    in_context = tok(f"{instruction} {text}", add_special_tokens=False, return_offsets_mapping=True)
    after = [s for s, _ in in_context["offset_mapping"] if s >= len(instruction)]
    assert len(tok(text, add_special_tokens=False)["input_ids"]) > len(after)  # the split really differs
    emb = embedder(mntp)
    assert emb.published.preset.family == "LLM2Vec"
    reference = llm2vec_reference(base, mntp, None, QUERIES, instruction)
    assert_close(emb.encode_queries(QUERIES, instruction=instruction), reference)
    assert_close(emb.encode_corpus(DOCS), llm2vec_reference(base, mntp, None, DOCS, ""))
    by_offsets = embedder(mntp, instruction_mask="offsets").encode_queries(QUERIES, instruction=instruction)
    assert cosines(by_offsets, reference).min() < 0.9999  # the old mask is not the reference's


# ---------------------------------------------------------------------------------------------- encoders' prompts


def save_st_encoder(tmp_path: Path, hub_id: str, pooling: str) -> Path:
    """A tiny BERT sentence-transformers folder where the Hub cache keeps ``hub_id``, declaring no prompts (as
    e5-base-v2's and bge-base-en-v1.5's folders declare none)."""
    st = pytest.importorskip("sentence_transformers")
    from transformers import BertConfig, BertModel

    tok = bpe_tokenizer("[CLS] $A [SEP]")
    raw = tmp_path / "raw"
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    BertModel(config).save_pretrained(raw)
    tok.save_pretrained(raw)
    modules = pytest.importorskip("sentence_transformers.sentence_transformer.modules")
    stack = [modules.Transformer(str(raw), max_seq_length=128), modules.Pooling(32, pooling)]
    folder = hub_snapshot(tmp_path, hub_id)
    st.SentenceTransformer(modules=stack, device="cpu").save(str(folder))
    settings = folder / "config_sentence_transformers.json"
    data = json.loads(settings.read_text())
    data["prompts"] = {}
    settings.write_text(json.dumps(data))
    return folder


def card_encoder_reference(folder: Path, texts: list[str], prefix: str, pooling: str) -> torch.Tensor:
    """e5-base-v2's card (average_pool over the attention mask of 'query: '/'passage: ' + text) and bge's ([CLS]
    of instruction + query, documents as they are), normalised."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    batch = tok([prefix + t for t in texts], padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        states = model(**batch).last_hidden_state
    if pooling == "cls":
        return F.normalize(states[:, 0], dim=-1)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return F.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)


BGE_QUERY = "Represent this sentence for searching relevant passages: "


@pytest.mark.parametrize(
    ("hub_id", "pooling", "query_prefix", "doc_prefix"),
    [("intfloat/e5-base-v2", "mean", "query: ", "passage: "), ("BAAI/bge-base-en-v1.5", "cls", BGE_QUERY, "")],
)
def test_encoders_get_their_published_prompts_from_mtebs_registry(tmp_path, hub_id, pooling, query_prefix, doc_prefix):
    pytest.importorskip("mteb")
    folder = save_st_encoder(tmp_path, hub_id, pooling)
    emb = embedder(folder)
    assert emb.config.query_instruction == query_prefix
    assert_close(emb.encode_queries(QUERIES), card_encoder_reference(folder, QUERIES, query_prefix, pooling))
    assert_close(emb.encode_corpus(DOCS), card_encoder_reference(folder, DOCS, doc_prefix, pooling))
    # an instruction the caller passes is the model's own kind of prefix, never lmembed's decoder template
    given = emb.encode_queries(QUERIES, instruction=query_prefix)
    assert_close(given, card_encoder_reference(folder, QUERIES, query_prefix, pooling))


def test_an_encoder_unknown_to_the_registry_keeps_its_folders_conventions(tmp_path):
    pytest.importorskip("mteb")
    folder = save_st_encoder(tmp_path, "someone/unknown-encoder", "mean")
    emb = embedder(folder)
    assert emb.config.query_instruction is None and emb.config.prompts == {}
    assert_close(emb.encode_corpus(DOCS), card_encoder_reference(folder, DOCS, "", "mean"))
