"""A saved model's card (README.md): the Hub's front matter, how to load the model, its strategy and training, and
the BibTeX of every paper its methods come from (one registry, lmembed.citations). The card is for people: editing
it never makes the folder fail its checks, and saving over the folder keeps an edited card rather than dropping it."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.citations import CITATIONS, bibtex, check_keys
from lmembed.errors import ConfigError
from lmembed.model_card import CARD_FILE, TrainingRecord, strategy_citations
from lmembed.training.losses import LOSSES, LossSpec, TripletLoss, available_losses, loss_citations

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def cited(card: str) -> list[str]:
    return re.findall(r"^@\w+\{([^,\n]+),$", card, flags=re.M)


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def tiny(tokenizer, family: str, **strategy) -> Embedder:
    model = tiny_model(family, len(tokenizer))
    return Embedder.from_model(model, tokenizer, EmbeddingConfig(**strategy), use_cache=False, show_progress=False)


def test_every_entry_is_one_well_formed_bibtex_record():
    keys = list(CITATIONS)
    text = bibtex(keys)
    assert cited(text) == keys  # each once, in order, under its own key
    for entry in text.split("\n\n"):
        assert entry.count("{") == entry.count("}"), entry
        assert re.search(r"^  title = \{.+\},$", entry, flags=re.M) and re.search(r"^  year = \{\d{4}\}", entry, re.M)
    assert bibtex(["li2023gte", "li2023gte"]).count("@misc{li2023gte,") == 1


def test_a_method_cannot_cite_a_paper_the_registry_lacks():
    with pytest.raises(KeyError, match="nope2020"):
        check_keys(["li2023gte", "nope2020"], "somewhere")
    with pytest.raises(KeyError, match="nope2020"):
        LossSpec(TripletLoss, cites=("nope2020",))
    with pytest.raises(KeyError, match="nope2020"):
        TrainingRecord({}, ("nope2020",))
    for name in available_losses():  # every registered loss resolves its papers
        assert all(key in CITATIONS for key in loss_citations(name, "infonce"))
    assert loss_citations("matryoshka", "gte") == ("kusupati2022mrl", "li2023gte")
    assert loss_citations("2dmse", "infonce") == ("li2024twodmse", "oord2018cpc")
    assert LOSSES["gte"].cites == ("li2023gte",)


def test_the_strategy_cites_the_paper_of_each_part():
    assert strategy_citations(EmbeddingConfig(), is_decoder=False) == ()
    nv = EmbeddingConfig(pooling="latent_attention", attention="bidirectional", layer=-2, dim=16)
    assert strategy_citations(nv, is_decoder=True) == (
        "lee2024nvembed",
        "behnamghader2024llm2vec",
        "juboor2024decoding",
        "kusupati2022mrl",
    )
    assert strategy_citations(EmbeddingConfig(pooling="weighted_mean", echo=True), is_decoder=True) == (
        "muennighoff2022sgpt",
        "springer2024echo",
    )
    assert strategy_citations(EmbeddingConfig(pooling="last"), is_decoder=True) == ("ma2023repllama",)
    assert strategy_citations(EmbeddingConfig(pooling="last"), is_decoder=False) == ()


def test_a_saved_folder_has_a_card_that_loads_tells_and_cites(tokenizer, tmp_path):
    emb = tiny(tokenizer, "llama", pooling="weighted_mean", attention="bidirectional", dim=16)
    folder = emb.save(tmp_path / "my-embedder")
    card = (folder / CARD_FILE).read_text()
    meta = front_matter(card)
    assert meta["library_name"] == "lmembed" and "sentence-similarity" in meta["tags"]
    assert "# my-embedder" in card and 'Embedder.from_pretrained("my-embedder")' in card
    assert "| pooling | weighted_mean |" in card and "| dim | 16 |" in card
    assert cited(card) == ["muennighoff2022sgpt", "behnamghader2024llm2vec", "kusupati2022mrl"]
    assert "## Training" not in card  # nothing was trained
    loaded = Embedder.from_pretrained(str(folder), cache=False, show_progress=False)
    assert loaded.config.pooling == "weighted_mean"

    encoder = tiny(tokenizer, "bert", pooling="mean")
    plain = (encoder.save(tmp_path / "plain") / CARD_FILE).read_text()
    assert "sentence-transformers" in front_matter(plain)["tags"]  # its folder loads there too, and says so
    assert "## Citations" not in plain and "SentenceTransformer(" in plain


def test_a_bundled_model_names_its_hub_id_as_the_base_model(tmp_path):
    from conftest import bundled_or_skip

    emb = Embedder.from_pretrained(bundled_or_skip("minilm"), cache=False, show_progress=False)
    card = (emb.save(tmp_path / "mini") / CARD_FILE).read_text()
    assert front_matter(card)["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"


def test_a_folder_saved_again_keeps_the_model_it_was_made_from(tmp_path):
    """Reloading a saved folder and saving it again (as `lmembed adapt` does to append its term channel) keeps the
    base model it was made from: the card and lmembed.json named the first folder as the base."""
    import json

    from conftest import bundled_or_skip

    first = Embedder.from_pretrained(bundled_or_skip("minilm"), cache=False, show_progress=False).save(tmp_path / "a")
    again = Embedder.from_pretrained(str(first), cache=False, show_progress=False)
    assert again.base_model == "minilm"
    folder = again.fit_terms(["a cat sat", "a dog ran far"], dims=64).save(tmp_path / "b")
    assert json.loads((folder / "lmembed.json").read_text())["base_model"] == "minilm"
    card = (folder / CARD_FILE).read_text()
    assert front_matter(card)["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert "| terms | dims=64, weight=0.5," in card  # a setting of several values reads as one line


def test_a_local_folder_of_hub_id_form_is_not_named_a_hub_base_model(tokenizer, tmp_path, monkeypatch):
    """A checkpoint loaded from a relative folder ``runs/ckpt`` has the form of a Hub id; the card names it as the
    base it was read from but gives the Hub no ``base_model`` (it named the local folder there)."""
    monkeypatch.chdir(tmp_path)
    tiny_model("bert", len(tokenizer)).save_pretrained("runs/ckpt")
    tokenizer.save_pretrained("runs/ckpt")
    emb = Embedder.from_pretrained("runs/ckpt", cache=False, show_progress=False)
    card = (emb.save(tmp_path / "saved") / CARD_FILE).read_text()
    assert "base_model" not in front_matter(card) and "runs/ckpt" in card


def test_a_recorded_base_model_that_is_not_a_name_is_refused_naming_the_field(tokenizer, tmp_path):
    import json

    from lmembed.errors import ModelLoadError

    folder = tiny(tokenizer, "bert", pooling="mean").save(tmp_path / "model")
    record = json.loads((folder / "lmembed.json").read_text())
    record["base_model"] = {"os": "system"}
    (folder / "lmembed.json").write_text(json.dumps(record))
    with pytest.raises(ModelLoadError, match=r"lmembed\.json: base_model=.* must be the name of the model"):
        Embedder.from_pretrained(str(folder), cache=False, show_progress=False)


def test_an_edited_card_still_loads_and_is_not_dropped_by_saving_again(tokenizer, tmp_path):
    emb = tiny(tokenizer, "bert", pooling="mean")
    folder = emb.save(tmp_path / "model")
    emb.save(folder)  # lmembed's own card, unedited: replaced with the folder
    (folder / CARD_FILE).write_text("---\nlicense: mit\n---\n# my notes\n")
    Embedder.from_pretrained(str(folder), cache=False, show_progress=False)  # the card is not a model file
    with pytest.raises(ConfigError, match=r"README\.md was edited since lmembed wrote it"):
        emb.save(folder)
    assert "my notes" in (folder / CARD_FILE).read_text()
