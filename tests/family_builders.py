"""Tiny random encoders of each architecture family, saved as sentence-transformers folders by
sentence-transformers itself, with a tokenizer of the family's own kind (WordPiece for BERT-style models,
byte-level BPE for RoBERTa-style ones, Unigram for XLM-R / CamemBERT), whose pad and special tokens match the
config (``pad_token_id`` is RoBERTa's ``padding_idx``: positions are numbered after it).

Used by tests/models/test_family_matrix.py; imported as ``from family_builders import ...`` (tests/ is on
``sys.path`` while the suite runs).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

WORDS = [
    *("the", "a", "of", "to", "in", "on", "is", "cat", "dog", "sat", "mat", "rug", "man", "woman", "food"),
    *("horse", "riding", "movie", "great", "query", "document", "search", "find", "passage", "hello"),
    *("there", "friend", "longer", "text", "science", "protein", "cell", "gene", "study", "result"),
]
#: The sentence-transformers truncation length of every built folder (the longest text below exceeds it).
MAX_SEQ_LENGTH = 40
HIDDEN = 32
#: Sizes shared by every family (each config takes the ones it knows under its own names).
SIZES: dict[str, Any] = {
    "hidden_size": HIDDEN,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 37,
}
# fairseq-style tokens (RoBERTa, XLM-R, CamemBERT, MPNet): <s>=0 <pad>=1 </s>=2 <unk>=3, positions after 1
FAIRSEQ_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def wordpiece_tokenizer(fairseq: bool = False) -> Any:
    """BERT's kind: lowercasing WordPiece, ``[CLS] text [SEP]`` (MPNet's: the same with ``<s> text </s>`` and
    fairseq's special-token ids)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = FAIRSEQ_SPECIALS if fairseq else BERT_SPECIALS
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(WORDS)) + list(":,.!?"))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token=specials[3] if fairseq else "[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if fairseq:
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<s>",
            eos_token="</s>",
            sep_token="</s>",
            cls_token="<s>",
            pad_token="<pad>",
            unk_token="<unk>",
            mask_token="<mask>",
        )
    tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def _fairseq_wrap(tok: Any) -> Any:
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )


def _corpus() -> list[str]:
    return [" ".join(WORDS)] * 4 + [" ".join(reversed(WORDS)), "Hello there, friend! A longer text."]


def bpe_tokenizer() -> Any:
    """RoBERTa's kind: byte-level BPE trained here, ``<s> text </s>``, ``<pad>`` = 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=FAIRSEQ_SPECIALS, show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    return _fairseq_wrap(tok)


def unigram_tokenizer() -> Any:
    """XLM-R's and CamemBERT's kind: a SentencePiece-style Unigram trained here, ``<s> text </s>``, ``<pad>`` = 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=120, special_tokens=FAIRSEQ_SPECIALS, unk_token="<unk>", show_progress=False
    )
    tok.train_from_iterator(_corpus(), trainer)
    return _fairseq_wrap(tok)


def _fairseq(config_class: Callable[..., Any], **extra: Any) -> Callable[[int], Any]:
    def build(vocab: int) -> Any:
        return config_class(
            **SIZES,
            vocab_size=vocab,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            max_position_embeddings=MAX_SEQ_LENGTH + 2,  # positions 2 .. 41: padding_idx + 1 on
            **extra,
        )

    return build


def _bert_like(config_class: Callable[..., Any], **extra: Any) -> Callable[[int], Any]:
    def build(vocab: int) -> Any:
        return config_class(**{**SIZES, **extra}, vocab_size=vocab, pad_token_id=0, max_position_embeddings=64)

    return build


def _distilbert(vocab: int) -> Any:
    from transformers import DistilBertConfig

    return DistilBertConfig(vocab_size=vocab, dim=HIDDEN, n_layers=2, n_heads=2, hidden_dim=37, pad_token_id=0)


def _modernbert(vocab: int) -> Any:
    from transformers import ModernBertConfig

    return ModernBertConfig(
        **SIZES,
        vocab_size=vocab,
        pad_token_id=0,
        cls_token_id=2,
        sep_token_id=3,
        bos_token_id=2,
        eos_token_id=3,
        max_position_embeddings=64,
        global_attn_every_n_layers=2,
        local_attention=8,  # the first layer attends in a sliding window shorter than the longest text
    )


def _gemma3_bidirectional(vocab: int) -> Any:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        **SIZES,
        vocab_size=vocab,
        num_key_value_heads=1,
        head_dim=16,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        max_position_embeddings=64,
        sliding_window=8,
        use_bidirectional_attention=True,  # EmbeddingGemma's setting: a natively bidirectional model
    )


def _t5(vocab: int) -> Any:
    from transformers import T5Config

    return T5Config(
        vocab_size=vocab,
        d_model=HIDDEN,
        d_kv=16,
        d_ff=37,
        num_layers=2,
        num_heads=2,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        pad_token_id=0,
    )


def family_config(model_type: str, vocab: int) -> Any:
    """The tiny config of ``model_type``."""
    import transformers as tf

    builders: dict[str, Callable[[int], Any]] = {
        "bert": _bert_like(tf.BertConfig),
        "roberta": _fairseq(tf.RobertaConfig),
        "xlm-roberta": _fairseq(tf.XLMRobertaConfig),
        "camembert": _fairseq(tf.CamembertConfig),
        "xlm-roberta-xl": _fairseq(tf.XLMRobertaXLConfig),
        "data2vec-text": _fairseq(tf.Data2VecTextConfig),
        "roberta-prelayernorm": _fairseq(tf.RobertaPreLayerNormConfig),
        "mpnet": _fairseq(tf.MPNetConfig),
        "distilbert": _distilbert,
        "electra": _bert_like(tf.ElectraConfig, embedding_size=16),
        "albert": _bert_like(tf.AlbertConfig, embedding_size=16),
        "deberta-v2": _bert_like(
            tf.DebertaV2Config,
            relative_attention=True,
            position_biased_input=False,
            pos_att_type=["p2c", "c2p"],
            position_buckets=8,
            max_relative_positions=-1,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
        ),
        "modernbert": _modernbert,
        "ernie": _bert_like(tf.ErnieConfig),
        "megatron-bert": _bert_like(tf.MegatronBertConfig),
        "rembert": _bert_like(
            tf.RemBertConfig, input_embedding_size=16, output_embedding_size=16, bos_token_id=2, eos_token_id=3
        ),
        "roformer": _bert_like(tf.RoFormerConfig, embedding_size=HIDDEN),
        "big_bird": _bert_like(
            tf.BigBirdConfig, attention_type="original_full", bos_token_id=2, eos_token_id=3, sep_token_id=3
        ),
        "bert-generation": _bert_like(tf.BertGenerationConfig),
        "deberta": _bert_like(tf.DebertaConfig),
        "convbert": _bert_like(tf.ConvBertConfig, embedding_size=HIDDEN),
        "nomic_bert": _bert_like(tf.NomicBertConfig),
        "gte": _bert_like(tf.GteConfig),
        "jina_embeddings_v3": _bert_like(tf.JinaEmbeddingsV3Config),
        "ibert": _fairseq(tf.IBertConfig),
        "gemma3_text": _gemma3_bidirectional,
        "t5": _t5,
    }
    return builders[model_type](vocab)


def family_tokenizer(model_type: str) -> Any:
    if model_type in ("roberta", "data2vec-text", "roberta-prelayernorm", "ibert"):
        return bpe_tokenizer()
    if model_type in ("xlm-roberta", "camembert", "xlm-roberta-xl"):
        return unigram_tokenizer()
    return wordpiece_tokenizer(fairseq=model_type == "mpnet")


def save_family_folder(folder: Path, model_type: str, seed: int = 0) -> Path:
    """A tiny random ``model_type`` encoder with mean pooling and normalisation, saved by sentence-transformers
    under ``folder / model_type``; returns that folder."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules
    from transformers import AutoModel, T5EncoderModel

    tok = family_tokenizer(model_type)
    config = family_config(model_type, len(tok))
    assert config.model_type == model_type
    torch.manual_seed(seed)
    # sentence-transformers runs a T5 checkpoint's encoder alone (sentence-t5)
    model = (T5EncoderModel(config) if model_type == "t5" else AutoModel.from_config(config)).eval()
    with torch.no_grad():  # random position and token-type rows far apart, so a wrong row shows clearly
        for name, param in model.named_parameters():
            if "position_embeddings" in name or "token_type_embeddings" in name:
                param.normal_(0.0, 0.5)
    backbone = folder / f"{model_type}-backbone"
    model.save_pretrained(backbone)
    tok.save_pretrained(backbone)
    stack = [
        modules.Transformer(str(backbone), max_seq_length=MAX_SEQ_LENGTH),
        modules.Pooling(HIDDEN, pooling_mode="mean"),
        modules.Normalize(),
    ]
    out = folder / model_type
    SentenceTransformer(modules=stack, device="cpu").save(str(out))
    shutil.rmtree(backbone)
    return out
