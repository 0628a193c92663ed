"""lmembed.rerank: the cross-encoder against sentence-transformers' CrossEncoder (both directions of the saved
format, one and several labels, a recorded activation), the LLM yes/no reranker against its log-odds computed by
hand, batch invariance under the token budget, save/load, ranking and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from conftest import build_tokenizer
from helpers import save_tiny_cross_encoder
from lmembed.errors import ConfigError, InputError, ModelLoadError
from lmembed.rerank import CrossEncoderReranker, LLMReranker, load_reranker
from lmembed.rerank.batching import token_batches
from lmembed.rerank.llm import RelevancePrompt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PAIRS = [
    ("the cat", "the cat sat on the mat"),
    ("dog", "a man was riding a horse and a woman was eating food on the rug with the dog"),
    ("protein cell", "gene"),
    ("hello there friend", "the study of protein and cell and gene gave a longer result than the first one"),
    ("movie", "a great movie"),
]


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory):
    """A tiny random cross-encoder saved by sentence-transformers itself."""
    from sentence_transformers import CrossEncoder

    raw = save_tiny_cross_encoder(tmp_path_factory.mktemp("raw"))
    folder = tmp_path_factory.mktemp("st")
    CrossEncoder(str(raw)).save(str(folder))
    return folder


def test_cross_encoder_scores_equal_sentence_transformers(st_folder, tmp_path):
    from sentence_transformers import CrossEncoder

    expected = CrossEncoder(str(st_folder)).predict(PAIRS)
    ours = load_reranker(str(st_folder))
    assert isinstance(ours, CrossEncoderReranker)
    assert isinstance(ours.activation, nn.Sigmoid)
    np.testing.assert_allclose(ours.predict(PAIRS), expected, rtol=0, atol=1e-6)
    # ... and the other way round: what lmembed saves, sentence-transformers loads to the same scores
    ours.save(tmp_path / "ours")
    again = CrossEncoder(str(tmp_path / "ours"))
    np.testing.assert_allclose(again.predict(PAIRS), expected, rtol=0, atol=1e-6)
    assert again.max_length == ours.max_length
    record = tmp_path / "ours" / "lmembed_reranker.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "format": 99}))  # a newer lmembed's
    said = r"lmembed_reranker.json: format: 99; this lmembed reads reranker folders of format 1"
    with pytest.raises(ModelLoadError, match=said):
        load_reranker(str(tmp_path / "ours"))


def test_cross_encoder_several_labels_and_recorded_activation(tmp_path):
    """num_labels > 1 → Identity and an (n, labels) array; an activation recorded by sentence-transformers is used."""
    from sentence_transformers import CrossEncoder

    raw = save_tiny_cross_encoder(tmp_path / "raw3", num_labels=3, seed=1)
    ce = CrossEncoder(str(raw))
    ce.save(str(tmp_path / "st3"))
    ours = load_reranker(str(tmp_path / "st3"))
    assert ours.num_labels == 3 and isinstance(ours.activation, nn.Identity)
    np.testing.assert_allclose(ours.predict(PAIRS), ce.predict(PAIRS), rtol=0, atol=1e-6)
    with pytest.raises(ConfigError, match="3 labels"):
        ours.rank("cat", ["the cat"])

    raw1 = save_tiny_cross_encoder(tmp_path / "raw1", seed=2)
    tanh = CrossEncoder(str(raw1), activation_fn=nn.Tanh())
    tanh.save(str(tmp_path / "tanh"))
    ours = load_reranker(str(tmp_path / "tanh"))
    assert isinstance(ours.activation, nn.Tanh)
    np.testing.assert_allclose(ours.predict(PAIRS), tanh.predict(PAIRS), rtol=0, atol=1e-6)


def test_token_batches_respect_both_bounds():
    lengths = [5, 40, 3, 17, 17, 90, 1, 8]
    batches = token_batches(lengths, max_batch_tokens=64, max_batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= 3
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 64
    assert [5] in batches  # longer than the budget: alone


def test_scores_do_not_depend_on_batching(st_folder):
    one = load_reranker(str(st_folder), max_batch_tokens=1)  # every pair alone
    many = load_reranker(str(st_folder), max_batch_tokens=10_000)
    np.testing.assert_allclose(one.predict(PAIRS), many.predict(PAIRS), rtol=0, atol=1e-5)


def test_rank_orders_by_score_and_cuts_at_top_k(st_folder):
    reranker = load_reranker(str(st_folder))
    docs = [d for _, d in PAIRS]
    scores = reranker.score("the cat", docs)
    ranked = reranker.rank("the cat", docs, top_k=3, return_documents=True)
    assert [r.index for r in ranked] == list(np.argsort(-scores, kind="stable")[:3])
    assert [r.document for r in ranked] == [docs[r.index] for r in ranked]
    np.testing.assert_allclose([r.score for r in ranked], np.sort(scores)[::-1][:3], rtol=0, atol=0)


def test_bad_pairs_are_refused(st_folder):
    reranker = load_reranker(str(st_folder))
    with pytest.raises(InputError, match="pairs\\[1\\]"):
        reranker.predict([("a", "b"), ("only one",)])
    with pytest.raises(InputError, match="single pair"):
        reranker.predict(("a", "b"))
    with pytest.raises(InputError, match="single string"):
        reranker.rank("a", "b")
    assert reranker.predict([]).shape == (0,)


# ---------------------------------------------------------------------------------------------- LLM reranker
TINY_PROMPT = RelevancePrompt(
    prefix="instruct :",
    template="query : {query} document : {document}",
    suffix=" ?",
    instruction="",
    true_token="great",
    false_token="bad",
)


@pytest.fixture(scope="module")
def llm_folder(tmp_path_factory):
    from transformers import LlamaForCausalLM

    from conftest import tiny_decoder_config

    torch.manual_seed(3)
    tok = build_tokenizer(bos=True)
    folder = tmp_path_factory.mktemp("llm")
    LlamaForCausalLM(tiny_decoder_config("llama", len(tok))).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_llm_reranker_scores_are_yes_no_log_odds(llm_folder):
    from transformers import AutoModelForCausalLM

    reranker = load_reranker(str(llm_folder), prompt=TINY_PROMPT.__dict__, activation="none", max_batch_tokens=4096)
    assert isinstance(reranker, LLMReranker)
    model = AutoModelForCausalLM.from_pretrained(str(llm_folder)).eval()
    tok = reranker.tokenizer
    yes, no = tok.convert_tokens_to_ids("great"), tok.convert_tokens_to_ids("bad")
    expected = []
    for query, doc in PAIRS:  # one prompt at a time, no padding
        text = f"instruct :query : {query} document : {doc} ?"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        expected.append(float(logits[yes] - logits[no]))
    np.testing.assert_allclose(reranker.predict(PAIRS), expected, rtol=0, atol=1e-5)  # batched, left-padded


def test_llm_reranker_saves_its_prompt_and_truncates_the_document(llm_folder, tmp_path):
    reranker = load_reranker(str(llm_folder), prompt=TINY_PROMPT.__dict__, max_length=16)
    assert all(len(reranker.encode_pair(q, d)["input_ids"]) <= 16 for q, d in PAIRS)
    scores = reranker.predict(PAIRS)
    assert np.all((scores > 0) & (scores < 1))  # sigmoid of the log-odds by default
    reranker.save(tmp_path / "saved")
    again = load_reranker(str(tmp_path / "saved"))
    assert isinstance(again, LLMReranker) and again.prompt == TINY_PROMPT and again.max_length == 16
    np.testing.assert_allclose(again.predict(PAIRS), scores, rtol=0, atol=1e-6)


def test_llm_reranker_refuses_answer_tokens_outside_the_vocabulary(llm_folder):
    with pytest.raises(ModelLoadError, match="true_token='yes'"):
        load_reranker(str(llm_folder))  # the default prompt's "yes" is not in the tiny vocabulary
    with pytest.raises(ConfigError, match="kind='nope'"):
        load_reranker(str(llm_folder), kind="nope")


def test_a_new_head_has_one_label_and_reset_pooler_makes_the_pooler_the_identity(tmp_path, llm_folder):
    """A bare BERT backbone gets a new head; reset_pooler sets the pooler under it to the identity (the head then
    reads tanh of [CLS]); a model without a BERT-style pooler is refused, naming it."""
    from transformers import BertModel

    from conftest import build_tokenizer as tokenizer

    raw = save_tiny_cross_encoder(tmp_path / "raw")
    BertModel.from_pretrained(raw).save_pretrained(tmp_path / "bare")  # a backbone without a head
    tokenizer().save_pretrained(tmp_path / "bare")
    ce = load_reranker(str(tmp_path / "bare"), reset_pooler=True)
    assert ce.num_labels == 1  # a new head gives one relevance score (not transformers' default of two)
    dense = ce.model.bert.pooler.dense
    assert torch.equal(dense.weight, torch.eye(32)) and not dense.bias.any()
    features = ce.collate(ce.encode_pairs(PAIRS[:2]))
    with torch.no_grad():
        out = ce.model.bert(**features)
    torch.testing.assert_close(out.pooler_output, torch.tanh(out.last_hidden_state[:, 0]))
    with pytest.raises(ModelLoadError, match="reset_pooler needs a BERT-style pooler"):
        load_reranker(str(llm_folder), kind="cross-encoder", reset_pooler=True)


def test_a_pair_given_twice_is_scored_once_and_copies_tie_in_order(st_folder):
    """Copies in batches of different shapes could score a rounding apart and break the documented tie order."""
    reranker = load_reranker(str(st_folder), batch_size=2)
    rows: list[int] = []
    forward = reranker.forward

    def counting(batch):
        rows.append(len(batch["input_ids"]))
        return forward(batch)

    reranker.forward = counting
    documents = ["the cat sat on the mat", "gene", "the cat sat on the mat", "gene", "the cat sat on the mat"]
    scores = reranker.score("the cat", documents)
    assert sum(rows) == 2  # two distinct pairs
    assert scores[0] == scores[2] == scores[4] and scores[1] == scores[3]
    ranked = [r.index for r in reranker.rank("the cat", documents)]
    assert ranked == sorted(range(5), key=lambda i: (-scores[i], i))
