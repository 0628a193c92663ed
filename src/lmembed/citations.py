"""The papers lmembed's methods come from: one registry, :data:`CITATIONS`, keyed by BibTeX key.

A method names the papers it implements by key (a loss's :class:`~lmembed.training.losses.LossSpec` ``cites``, the
strategy's parts in :mod:`lmembed.model_card`), and a saved model's card lists the BibTeX of every paper its
strategy and training used, so that whoever publishes or uses the model can cite them. Entries hold what identifies a
paper (authors, title, year, and its arXiv id or venue); an unknown key is an error, so a method cannot cite a paper
that is not here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Citation:
    """One paper: ``authors`` as BibTeX writes them (``A and B and others``)."""

    key: str
    authors: str
    title: str
    year: int
    arxiv: str | None = None
    venue: str | None = None

    def bibtex(self) -> str:
        fields = [("title", self.title), ("author", self.authors), ("year", str(self.year))]
        if self.arxiv:
            fields += [
                ("eprint", self.arxiv),
                ("archivePrefix", "arXiv"),
                ("url", f"https://arxiv.org/abs/{self.arxiv}"),
            ]
        kind = "inproceedings" if self.venue else "misc"
        if self.venue:
            fields.insert(2, ("booktitle", self.venue))
        body = ",\n".join(f"  {name} = {{{value}}}" for name, value in fields)
        return f"@{kind}{{{self.key},\n{body}\n}}"


CITATIONS: dict[str, Citation] = {
    c.key: c
    for c in (
        Citation(
            "reimers2019sbert",
            "Reimers, Nils and Gurevych, Iryna",
            "Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks",
            2019,
            "1908.10084",
        ),
        Citation(
            "oord2018cpc",
            "van den Oord, Aaron and Li, Yazhe and Vinyals, Oriol",
            "Representation Learning with Contrastive Predictive Coding",
            2018,
            "1807.03748",
        ),
        Citation(
            "li2023gte",
            "Li, Zehan and others",
            "Towards General Text Embeddings with Multi-stage Contrastive Learning",
            2023,
            "2308.03281",
        ),
        Citation("li2023angle", "Li, Xianming and Li, Jing", "AnglE-optimized Text Embeddings", 2023, "2309.12871"),
        Citation(
            "kusupati2022mrl", "Kusupati, Aditya and others", "Matryoshka Representation Learning", 2022, "2205.13147"
        ),
        Citation(
            "li2024twodmse",
            "Li, Xianming and Li, Zongxi and Li, Jing and Xie, Haoran and Li, Qing",
            "2D Matryoshka Sentence Embeddings",
            2024,
            "2402.14776",
        ),
        Citation(
            "hofstatter2020marginmse",
            'Hofst{\\"a}tter, Sebastian and others',
            "Improving Efficient Neural Ranking Models with Cross-Architecture Knowledge Distillation",
            2020,
            "2010.02666",
        ),
        Citation(
            "nogueira2019monobert",
            "Nogueira, Rodrigo and Cho, Kyunghyun",
            "Passage Re-ranking with BERT",
            2019,
            "1901.04085",
        ),
        Citation(
            "gao2021lce",
            "Gao, Luyu and Dai, Zhuyun and Callan, Jamie",
            "Rethink Training of BERT Rerankers in Multi-Stage Retrieval Pipeline",
            2021,
            "2101.08751",
        ),
        Citation(
            "gao2021gradcache",
            "Gao, Luyu and Zhang, Yunyi and Han, Jiawei and Callan, Jamie",
            "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup",
            2021,
            "2101.06983",
            "Proceedings of the 6th Workshop on Representation Learning for NLP",
        ),
        Citation(
            "hu2021lora",
            "Hu, Edward J. and Shen, Yelong and Wallis, Phillip and Allen-Zhu, Zeyuan and Li, Yuanzhi "
            "and Wang, Shean and Wang, Lu and Chen, Weizhu",
            "LoRA: Low-Rank Adaptation of Large Language Models",
            2021,
            "2106.09685",
        ),
        Citation(
            "gao2021simcse",
            "Gao, Tianyu and Yao, Xingcheng and Chen, Danqi",
            "SimCSE: Simple Contrastive Learning of Sentence Embeddings",
            2021,
            "2104.08821",
        ),
        Citation(
            "muennighoff2022sgpt",
            "Muennighoff, Niklas",
            "SGPT: GPT Sentence Embeddings for Semantic Search",
            2022,
            "2202.08904",
        ),
        Citation(
            "ma2023repllama",
            "Ma, Xueguang and Wang, Liang and Yang, Nan and Wei, Furu and Lin, Jimmy",
            "Fine-Tuning LLaMA for Multi-Stage Text Retrieval",
            2023,
            "2310.08319",
        ),
        Citation(
            "wang2024e5mistral",
            "Wang, Liang and Yang, Nan and Huang, Xiaolong and Yang, Linjun and Majumder, Rangan and Wei, Furu",
            "Improving Text Embeddings with Large Language Models",
            2024,
            "2401.00368",
        ),
        Citation(
            "behnamghader2024llm2vec",
            "BehnamGhader, Parishad and Adlakha, Vaibhav and Mosbach, Marius and "
            "Bahdanau, Dzmitry and Chapados, Nicolas and Reddy, Siva",
            "LLM2Vec: Large Language Models Are Secretly Powerful Text Encoders",
            2024,
            "2404.05961",
        ),
        Citation(
            "lee2024nvembed",
            "Lee, Chankyu and others",
            "NV-Embed: Improved Techniques for Training LLMs as Generalist Embedding Models",
            2024,
            "2405.17428",
        ),
        Citation(
            "moreira2024nvretriever",
            "Moreira, Gabriel de Souza P. and others",
            "NV-Retriever: Improving text embedding models with effective hard-negative mining",
            2024,
            "2407.15831",
        ),
        Citation(
            "springer2024echo",
            "Springer, Jacob Mitchell and Kotha, Suhas and Fried, Daniel and Neubig, Graham and Raghunathan, Aditi",
            "Repetition Improves Language Model Embeddings",
            2024,
            "2402.15449",
        ),
        Citation(
            "muennighoff2024grit",
            "Muennighoff, Niklas and Su, Hongjin and Wang, Liang and Yang, Nan and Wei, "
            "Furu and Yu, Tao and Singh, Amanpreet and Kiela, Douwe",
            "Generative Representational Instruction Tuning",
            2024,
            "2402.09906",
        ),
        Citation(
            "lee2024gecko",
            "Lee, Jinhyuk and others",
            "Gecko: Versatile Text Embeddings Distilled from Large Language Models",
            2024,
            "2403.20327",
        ),
        Citation(
            "li2024bgeicl", "Li, Chaofan and others", "Making Text Embedders Few-Shot Learners", 2024, "2409.15700"
        ),
        Citation(
            "zhang2025qwen3embedding",
            "Zhang, Yanzhao and others",
            "Qwen3 Embedding: Advancing Text Embedding and Reranking Through Foundation Models",
            2025,
            "2506.05176",
        ),
        Citation(
            "wang2022gpl",
            "Wang, Kexin and Thakur, Nandan and Reimers, Nils and Gurevych, Iryna",
            "GPL: Generative Pseudo Labeling for Unsupervised Domain Adaptation of Dense Retrieval",
            2022,
            "2112.07577",
        ),
        Citation(
            "lee2019ict",
            "Lee, Kenton and Chang, Ming-Wei and Toutanova, Kristina",
            "Latent Retrieval for Weakly Supervised Open Domain Question Answering",
            2019,
            "1906.00300",
        ),
        Citation(
            "juboor2024decoding",
            "Juboor, David N. and Walsh, John MacLaren and Weyant, Christopher",
            "Decoding Latent Spaces: LLM-based Embeddings vs Encoder-Only Architectures",
            2024,
        ),
        Citation(
            "robertson2009bm25",
            "Robertson, Stephen and Zaragoza, Hugo",
            "The Probabilistic Relevance Framework: BM25 and Beyond",
            2009,
        ),
    )
}


def unknown_keys(keys: Iterable[str]) -> list[str]:
    """Those of ``keys`` that :data:`CITATIONS` does not hold."""
    return [k for k in keys if k not in CITATIONS]


def check_keys(keys: Iterable[str], where: str) -> tuple[str, ...]:
    """``keys`` as a tuple, each one of :data:`CITATIONS` (else ``KeyError`` naming ``where``)."""
    keys = tuple(keys)
    if unknown := unknown_keys(keys):
        raise KeyError(f"{where} cites {', '.join(unknown)}, which lmembed.citations does not hold")
    return keys


def bibtex(keys: Iterable[str]) -> str:
    """The BibTeX entries of ``keys`` (each once, in the order first given), blank-line separated."""
    return "\n\n".join(CITATIONS[k].bibtex() for k in dict.fromkeys(check_keys(keys, "bibtex")))
