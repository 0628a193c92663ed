"""The contrastive trainer on tiny random models: saving, LoRA, GradCache, evaluation, exact resumption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import REPO, tiny_model
from helpers import write_jsonl
from lmembed import Embedder, EmbeddingConfig
from lmembed.training.dev_eval import subsample_retrieval
from lmembed.training.distributed import setup_distributed
from lmembed.training.losses.factory import build_training_loss
from lmembed.training.train_config import TrainConfig, TrainConfigError
from lmembed.training.trainable import LoraSettings, TrainableEmbedder, trim_padding
from lmembed.training.trainer import Trainer
from test_training_rows import make_beir

ROWS = [
    ("the cat sat on the mat", "a cat sat on a rug", "the dog was bad"),
    ("a man riding a horse", "the man is riding", "a woman eating food"),
    ("protein gene study", "the cell gene result", "a great movie"),
    ("a great movie", "the movie was great", "the movie was bad"),
    ("language model embedding", "embedding vector search", "a horse eating food"),
    ("hello there friend", "hello friend", "the first document"),
    ("science of the cell", "a study of the cell", "the dog sat"),
    ("retrieval of text", "search the document", "a woman riding"),
]
TEXTS = ["the cat sat", "a study of the gene", "hello there"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def data_file(tmp_path) -> Path:
    rows = [{"query": q, "positive": p, "negatives": [n]} for q, p, n in ROWS]
    rows[2]["instruction"] = "find the study"
    return write_jsonl(tmp_path / "train.jsonl", rows)


def tiny_embedder(tokenizer, family: str = "llama", seed: int = 0, dtype=torch.float32, **strategy) -> Embedder:
    strategy = {"pooling": "mean", "attention": "bidirectional", **strategy}
    model = tiny_model(family, len(tokenizer), seed=seed).to(dtype)
    return Embedder.from_model(model, tokenizer, EmbeddingConfig(**strategy), use_cache=False, show_progress=False)


def make_config(tmp_path: Path, data_file: Path, **changes) -> TrainConfig:
    options = {
        "data": [str(data_file)],
        "output": str(tmp_path / "run"),
        "batch_size": 4,
        "steps": 4,
        "lr": 5e-3,
        "warmup_steps": 1,
        "lora": True,
        "lora_r": 4,
        "lora_alpha": 8,
        "progress": False,
        "seed": 7,
    }
    options.update(changes)
    if options["lora"] is not True:  # no adapters trained: their options are refused, not dropped
        for name in ("lora_r", "lora_alpha"):
            if name not in changes:
                del options[name]
    return TrainConfig(**options)


def encode(embedder: Embedder) -> np.ndarray:
    return embedder.encode(TEXTS)


# ---------------------------------------------------------------------------------------------- training + saving
def test_training_run_writes_metrics_curve_and_loadable_model(tmp_path, tokenizer, data_file):
    emb = tiny_embedder(tokenizer)
    untrained = encode(emb)
    cfg = make_config(tmp_path, data_file, steps=5, save_every=2, keep_checkpoints=2)
    trainer = Trainer(cfg, model=emb)
    for _ in range(cfg.steps):
        trainer.train_step()
    trainer.model.eval()
    trained = encode(trainer.model.embedder)
    assert np.abs(trained - untrained).max() > 1e-4
    model_dir = trainer.save_model()
    loaded = Embedder.from_pretrained(str(model_dir), cache=False, show_progress=False)
    assert loaded.config.attention == "bidirectional" and loaded.config.pooling == "mean"
    np.testing.assert_allclose(encode(loaded), trained, atol=1e-5)

    result = Trainer(
        make_config(tmp_path, data_file, steps=5, save_every=2, output=str(tmp_path / "b")),
        model=tiny_embedder(tokenizer),
    ).train()
    out = result.output
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert all({"loss", "lr", "rows_per_s", "grad_norm"} <= set(r) for r in records)
    assert records[0]["lr"] == pytest.approx(5e-3) and records[-1]["lr"] < 5e-3
    assert (out / "loss_curve.png").stat().st_size > 1000
    assert TrainConfig.from_yaml(out / "train_config.yaml").steps == 5
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000004", "step-0000005"]
    assert (result.model_dir / "lmembed.json").exists() and result.losses == [r["loss"] for r in records]


def test_the_trained_model_card_tells_the_run_and_cites_its_loss_and_techniques(tmp_path, tokenizer, data_file):
    import re

    cfg = make_config(tmp_path, data_file, steps=2, loss="gte", grad_cache_chunk=2)
    model_dir = Trainer(cfg, model=tiny_embedder(tokenizer)).train().model_dir
    card = (model_dir / "README.md").read_text()
    assert f"# {model_dir.name}\n" in card and ".tmp" not in card  # the folder's name, not the scratch one it was in
    assert "## Training" in card and "| loss | gte |" in card and "| steps | 2 |" in card
    assert "| LoRA | rank 4, alpha 8, merged |" in card and f"| data | {data_file.name} |" in card
    keys = re.findall(r"^@\w+\{([^,\n]+),$", card, flags=re.M)
    # the strategy's bidirectional attention, then the run's loss, GradCache and LoRA
    assert keys == ["behnamghader2024llm2vec", "li2023gte", "gao2021gradcache", "hu2021lora"]
    Embedder.from_pretrained(str(model_dir), cache=False, show_progress=False)


def test_adapter_can_be_kept_instead_of_merged(tmp_path, tokenizer):
    model = TrainableEmbedder(tiny_embedder(tokenizer), lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    with torch.no_grad():
        for name, param in model.named_trainable_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    model.eval()
    expected = encode(model.embedder)
    for merge in (True, False):
        saved = model.save(tmp_path / f"merge-{merge}", merge_lora=merge)
        assert (saved / "adapter_config.json").exists() is not merge
        moved = saved.rename(tmp_path / f"moved-{merge}")  # the folder is self-contained: it can move
        loaded = Embedder.from_pretrained(str(moved), cache=False, show_progress=False)
        np.testing.assert_allclose(encode(loaded), expected, atol=1e-5)
    assert model.uses_lora  # saving a copy leaves the adapters in training


def test_a_save_that_fails_keeps_the_model_before_and_leaves_nothing_behind(
    tmp_path, tokenizer, data_file, monkeypatch
):
    """The model is written beside its place and renamed in; the one saved before stays whole until then (the old
    save deleted it first, and a failed save left its scratch folder)."""
    trainer = Trainer(make_config(tmp_path, data_file, steps=1, lora=False), model=tiny_embedder(tokenizer))
    trainer.train_step()
    first = trainer.save_model()
    before = sorted(p.name for p in first.parent.iterdir())
    saved = {p.relative_to(first): p.read_bytes() for p in first.rglob("*") if p.is_file()}

    def broken(folder, **_):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "config.json").write_text("{")
        raise OSError("disk full")

    monkeypatch.setattr(trainer.model, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_model()
    assert {p.relative_to(first): p.read_bytes() for p in first.rglob("*") if p.is_file()} == saved
    assert sorted(p.name for p in first.parent.iterdir()) == before


def test_latent_attention_head_is_trained_and_saved(tmp_path, tokenizer, data_file):
    emb = tiny_embedder(tokenizer, pooling="latent_attention", latent={"num_latents": 8, "num_heads": 4})
    before = {k: v.clone() for k, v in emb.pooling_head.state_dict().items()}
    trainer = Trainer(make_config(tmp_path, data_file, steps=2, lora=False), model=emb)
    trainer.train_step()
    trainer.train_step()
    after = emb.pooling_head.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    trainer.model.eval()
    expected = encode(trainer.model.embedder)
    loaded = Embedder.from_pretrained(str(trainer.save_model()), cache=False, show_progress=False)
    np.testing.assert_allclose(encode(loaded), expected, atol=1e-5)


def test_a_term_channel_is_kept_through_training(tmp_path, tokenizer, data_file):
    """A model with a fitted term channel trains (its vectors carry the channel, as they will be read) and is saved
    with the same table: the channel is fitted on a corpus, not trained (saving it used to fail)."""
    emb = tiny_embedder(tokenizer).fit_terms(TEXTS, dims=64)
    trainer = Trainer(make_config(tmp_path, data_file, steps=2), model=emb)
    trainer.train_step()
    trainer.train_step()
    trainer.model.eval()
    expected = encode(trainer.model.embedder)
    assert expected.shape[1] == emb.backbone.hidden_size + 64
    loaded = Embedder.from_pretrained(str(trainer.save_model()), cache=False, show_progress=False)
    assert loaded.config.terms == emb.config.terms
    np.testing.assert_allclose(encode(loaded), expected, atol=1e-5)


def test_encoder_with_triplet_loss_keeps_sentence_transformers_files(tmp_path, tokenizer, data_file):
    emb = tiny_embedder(tokenizer, family="bert", attention="causal")
    result = Trainer(make_config(tmp_path, data_file, loss="triplet", steps=2, lora=None), model=emb).train()
    assert not emb.backbone.model.config.model_type.startswith("llama")
    assert all(np.isfinite(result.losses))
    assert (result.model_dir / "modules.json").exists()


def test_weight_updates_never_serve_stale_cached_vectors(tmp_path, tokenizer, data_file):
    model = tiny_model("llama", len(tokenizer))
    config = EmbeddingConfig(pooling="mean", attention="bidirectional")
    emb = Embedder.from_model(
        model, tokenizer, config, use_cache=True, cache_dir=tmp_path / "cache", show_progress=False
    )
    before = encode(emb)
    trainer = Trainer(make_config(tmp_path, data_file, steps=1, lora=False), model=emb)
    trainer.train_step()
    trainer.model.eval()
    after = encode(emb)
    assert np.abs(after - before).max() > 1e-4
    emb.engine.use_cache = False
    np.testing.assert_allclose(after, encode(emb), atol=1e-6)


# ---------------------------------------------------------------------------------------------- GradCache, losses, eval
def test_grad_cache_step_equals_plain_step(tmp_path, tokenizer, data_file):
    results = []
    for chunk in (None, 2):
        cfg = make_config(tmp_path, data_file, steps=1, grad_cache_chunk=chunk, lora_dropout=0.0)
        trainer = Trainer(cfg, model=tiny_embedder(tokenizer))
        record = trainer.train_step()
        results.append((record["loss"], trainer.model.trainable_state_dict()))
    (loss_a, state_a), (loss_b, state_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    for name, tensor in state_a.items():
        torch.testing.assert_close(tensor, state_b[name], atol=1e-6, rtol=1e-5)


def test_gradient_checkpointing_and_bfloat16(tmp_path, tokenizer, data_file):
    runs = {}
    for name, checkpointing, dtype in [
        ("plain", False, torch.float32),
        ("ckpt", True, torch.float32),
        ("bf16", False, torch.bfloat16),
    ]:
        cfg = make_config(tmp_path, data_file, steps=1, lora_dropout=0.0, gradient_checkpointing=checkpointing)
        trainer = Trainer(cfg, model=tiny_embedder(tokenizer, dtype=dtype))
        runs[name] = (trainer.train_step()["loss"], trainer.model)
    assert runs["ckpt"][0] == pytest.approx(runs["plain"][0], rel=1e-5)
    backbone = runs["ckpt"][1].model  # transformers renamed the flag in 5.2x; accept either spelling
    assert getattr(backbone, "is_activation_checkpointing", None) or backbone.is_gradient_checkpointing
    assert runs["bf16"][0] == pytest.approx(runs["plain"][0], rel=0.1)
    assert all(p.dtype == torch.float32 for _, p in runs["bf16"][1].named_trainable_parameters())


def test_symmetric_rows_instruct_their_documents(tmp_path, tokenizer):
    rows = [
        {"query": q, "positive": p, "negatives": [n], "instruction": "same", "symmetric": i % 2 == 0}
        for i, (q, p, n) in enumerate(ROWS)
    ]
    data = write_jsonl(tmp_path / "sts.jsonl", rows)
    cfg = make_config(tmp_path, data, batch_size=8, grad_cache_chunk=2)
    trainer = Trainer(cfg, model=tiny_embedder(tokenizer))
    batch = trainer.sampler.batch(0)
    positives, negatives = trainer.document_instructions(batch)
    assert sorted(batch.symmetric) == [False] * 4 + [True] * 4
    assert positives == ["same" if flag else None for flag in batch.symmetric] and negatives == positives
    whole = make_config(tmp_path, data, data=[{"path": str(data), "symmetric": True}])
    batch = Trainer(whole, model=tiny_embedder(tokenizer)).sampler.batch(0)
    assert all(batch.symmetric)
    (tmp_path / "bad.jsonl").write_text(json.dumps({**rows[0], "symmetric": "yes"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: field .symmetric"):
        Trainer(make_config(tmp_path, tmp_path / "bad.jsonl"), model=tiny_embedder(tokenizer))


def test_queries_and_documents_are_trained_as_the_saved_model_reads_them(tmp_path, tokenizer, data_file):
    """A strategy's query and document instructions were not used in training (its queries trained bare, then
    served wrapped: cosine 0.77 between the two); an instruction given for training (``--instruction``) was lost on
    saving; a dot-product objective saved a normalised cosine model. Each is now as training had it."""
    instructed = tiny_embedder(tokenizer, query_instruction="find the cat", document_instruction="a passage")
    trainer = Trainer(make_config(tmp_path, data_file, steps=1), model=instructed)
    batch = trainer.sampler.batch(0)
    own = list(batch.instructions)  # the rows' own: one row says "find the study", the others nothing
    assert trainer.query_instructions(batch) == [i if i is not None else "find the cat" for i in own]
    assert trainer.document_instructions(batch)[0] == ["a passage"] * len(batch)

    plain = write_jsonl(tmp_path / "plain.jsonl", [{"query": q, "positive": p, "negatives": [n]} for q, p, n in ROWS])
    given = make_config(
        tmp_path, plain, output=str(tmp_path / "given"), steps=1, lora=False, similarity="dot",
        data=[{"path": str(plain), "instruction": "retrieve the answer"}],
    )  # fmt: skip
    folder = Trainer(given, model=tiny_embedder(tokenizer)).train().model_dir
    strategy = json.loads((folder / "lmembed.json").read_text())["strategy"]
    assert strategy["query_instruction"] == "retrieve the answer"
    assert (strategy["normalize"], strategy["similarity"]) == (False, "dot")
    card = (folder / "README.md").read_text()
    assert "| query instructions | retrieve the answer |" in card and "| similarity | dot |" in card
    loaded = Embedder.from_pretrained(str(folder), cache=False, show_progress=False)
    assert loaded.config.query_instruction == "retrieve the answer" and not loaded.config.normalize
    # rows that carry their own: every row "find the study" (its source none) is that; two instructions are neither
    mixed = make_config(tmp_path, data_file, output=str(tmp_path / "mixed"), steps=1, lora=False)
    assert Trainer(mixed, model=tiny_embedder(tokenizer)).trained_strategy().query_instruction is None
    rows = [{"query": q, "positive": p, "instruction": "find it"} for q, p, _ in ROWS]
    own = write_jsonl(tmp_path / "own.jsonl", rows)
    alone = make_config(tmp_path, own, output=str(tmp_path / "own"), steps=1, lora=False)
    assert Trainer(alone, model=tiny_embedder(tokenizer)).trained_strategy().query_instruction == "find it"


def test_loss_construction(tmp_path, data_file):
    cfg = make_config(tmp_path, data_file, temperature=0.05, similarity="dot")
    loss = build_training_loss(cfg)
    assert loss.temperature == 0.05 and loss.similarity == "dot"
    assert build_training_loss(make_config(tmp_path, data_file, loss="gte")).temperature == 0.01  # its own default
    mrl = build_training_loss(make_config(tmp_path, data_file, loss="matryoshka", loss_kwargs={"dims": [8, 32]}))
    assert type(mrl).__name__ == "MatryoshkaLoss"
    triplet = build_training_loss(make_config(tmp_path, data_file, loss="triplet", loss_kwargs={"margin": 0.3}))
    assert triplet.margin == 0.3
    with pytest.raises(TrainConfigError, match="labelled text pairs"):
        build_training_loss(make_config(tmp_path, data_file, loss="angle"))


def test_dev_evaluation_logs_ndcg(tmp_path, tokenizer, data_file):
    pytest.importorskip("pytrec_eval")
    folder = make_beir(tmp_path / "dev")
    (folder / "qrels" / "train.tsv").rename(folder / "qrels" / "test.tsv")
    cfg = make_config(tmp_path, data_file, steps=2, eval_every=2, eval_data=[str(folder)])
    result = Trainer(cfg, model=tiny_embedder(tokenizer)).train()
    assert len(result.evaluations) == 1 and 0.0 <= result.evaluations[0]["dev"] <= 1.0
    records = [json.loads(line) for line in (result.output / "metrics.jsonl").read_text().splitlines()]
    assert records[-1] == {"step": 2, "eval": {"dev": result.evaluations[0]["dev"]}}


def test_trim_padding_and_gradients(tokenizer):
    model = TrainableEmbedder(tiny_embedder(tokenizer), lora=LoraSettings(r=2, alpha=4))
    features = model.tokenize(["the cat", "the cat sat on the mat"], ["find", None])
    assert features["input_ids"].shape == features["pool_mask"].shape
    ids, mask, pool = (
        torch.nn.functional.pad(features[k], (3, 0)) for k in ("input_ids", "attention_mask", "pool_mask")
    )
    trimmed = trim_padding(ids, mask, pool)
    assert all(torch.equal(a, b) for a, b in zip(trimmed, features.values(), strict=True))
    texts = ["the cat"] * 9 + [" ".join(["the cat sat on the mat"] * 4)] * 9  # two length buckets
    features = model.tokenize(texts)
    bucketed = model(**features)
    whole = model.embedder.engine.forward_pool(*features.values(), [model.config])[0]
    torch.testing.assert_close(bucketed, whole, atol=1e-5, rtol=1e-5)
    vectors = model.embed(["the cat", "a dog"], instruction="find")
    assert vectors.shape == (2, 32) and vectors.requires_grad
    assert 0 < model.num_parameters(trainable_only=True) < model.num_parameters() / 10


# ---------------------------------------------------------------------------------------------- resumption
def test_resume_continues_the_exact_loss_sequence(tmp_path, tokenizer, data_file):
    options = {"steps": 6, "save_every": 3, "lora_dropout": 0.1}  # dropout: the RNG state must be restored too
    reference = Trainer(
        make_config(tmp_path, data_file, output=str(tmp_path / "a"), **options), model=tiny_embedder(tokenizer)
    )
    expected = reference.train().losses

    cfg = make_config(tmp_path, data_file, output=str(tmp_path / "b"), **options)
    first = Trainer(cfg, model=tiny_embedder(tokenizer))
    losses = [first.train_step()["loss"] for _ in range(3)]
    first.save_checkpoint()
    for _ in range(2):  # steps after the checkpoint that a crash loses
        first.train_step()
    (Path(cfg.output) / "checkpoints" / ".tmp-step-0000006").mkdir()  # an interrupted checkpoint write

    resumed = Trainer(
        make_config(tmp_path, data_file, output=str(tmp_path / "b"), resume=True, **options),
        model=tiny_embedder(tokenizer),
    )
    result = resumed.train()
    assert result.start_step == 3 and result.end_step == 6
    assert losses == expected[:3]
    assert result.losses == expected[3:]
    logged = [json.loads(line)["loss"] for line in (Path(cfg.output) / "metrics.jsonl").read_text().splitlines()]
    assert logged == expected


def test_a_second_run_on_an_output_folder_in_use_is_refused(tmp_path, tokenizer, data_file):
    """Two runs started on one --output both trained and wrote interleaved metrics and a mixed folder; the second
    is refused while the first holds the folder (the lock ends with the process however it ends)."""
    import subprocess
    import sys

    from lmembed.training.trainer import RUN_LOCK

    output = tmp_path / "shared"
    output.mkdir()
    holder = (
        "import fcntl, sys, time; h = open(sys.argv[1], 'a'); fcntl.flock(h, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(60)"
    )
    other = subprocess.Popen([sys.executable, "-c", holder, str(output / RUN_LOCK)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"  # another process writes to the folder now
        second = Trainer(make_config(tmp_path, data_file, output=str(output), steps=2), model=tiny_embedder(tokenizer))
        with pytest.raises(TrainConfigError, match="another training run is writing to this folder now"):
            second.train()
        assert not (output / "metrics.jsonl").exists() or not (output / "metrics.jsonl").read_text()
    finally:
        other.kill()
        other.wait()
    done = Trainer(make_config(tmp_path, data_file, output=str(output), steps=2), model=tiny_embedder(tokenizer))
    assert done.train().end_step == 2  # the holder ended: the folder is free


def test_kill_9_after_a_checkpoint_then_resume(tmp_path, tokenizer, data_file):
    model_dir = tiny_embedder(tokenizer).save(tmp_path / "tiny")
    output = tmp_path / "killed"
    args = [
        sys.executable, "-m", "lmembed.cli.train", "--model", str(model_dir), "--data", str(data_file),
        "--batch-size", "4", "--steps", "10", "--save-every", "3", "--lr", "5e-3", "--warmup-steps", "1",
        "--lora-r", "4", "--lora-alpha", "8", "--seed", "7", "--no-progress", "--output", str(output),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    log_file = tmp_path / "killed.log"
    with log_file.open("w") as log:
        process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not (output / "checkpoints" / "step-0000003").exists():
        assert process.poll() is None, log_file.read_text()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL and not (output / "model").exists()

    def config(output: Path, resume: bool) -> TrainConfig:
        return TrainConfig(
            model=str(model_dir), data=[str(data_file)], batch_size=4, steps=10, lr=5e-3, warmup_steps=1,
            lora_r=4, lora_alpha=8, seed=7, progress=False, output=str(output), resume=resume,
        )  # fmt: skip

    resumed = Trainer(config(output, resume=True)).train()  # a fresh process would do the same
    assert 3 <= resumed.start_step < 10
    logged = [json.loads(line)["loss"] for line in (output / "metrics.jsonl").read_text().splitlines()]
    expected = Trainer(config(tmp_path / "uninterrupted", resume=False)).train().losses
    np.testing.assert_allclose(logged, expected, rtol=1e-5)
    assert (output / "model" / "lmembed.json").exists()


def test_subsample_keeps_relevant_documents_first():
    from lmembed.evaluation.retrieval_data import RetrievalData

    data = RetrievalData(
        name="x",
        split="test",
        corpus_ids=[f"d{i}" for i in range(20)],
        corpus_texts=[f"text {i}" for i in range(20)],
        query_ids=["q0", "q1", "q2"],
        query_texts=["a", "b", "c"],
        qrels={"q0": {"d1": 2, "d2": 1, "d3": 1}, "q1": {"d5": 1}, "q2": {"d19": 0}},
    )
    small = subsample_retrieval(data, max_docs=3)
    assert small.corpus_ids == ["d1", "d2", "d5"]  # best judgment of each query first, round-robin
    assert small.qrels == {"q0": {"d1": 2, "d2": 1}, "q1": {"d5": 1}} and small.query_ids == ["q0", "q1"]
    padded = subsample_retrieval(data, max_docs=10, seed=1)
    assert len(padded.corpus_ids) == 10 and {"d1", "d2", "d3", "d5"} <= set(padded.corpus_ids)
    assert subsample_retrieval(data, max_queries=1, seed=0).query_ids[0] in {"q0", "q1"}


def test_cli_registers_train_command():
    from typer.testing import CliRunner

    from lmembed.cli.app import app

    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "160"})  # rich cuts long names at 80
    assert result.exit_code == 0 and "--grad-cache-chunk" in result.output
    failed = CliRunner().invoke(app, ["train", "--data", "x.jsonl"])
    assert failed.exit_code == 2 and "no model given" in failed.output and "Traceback" not in failed.output


def test_setup_distributed_always_names_a_cuda_index(monkeypatch):
    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert setup_distributed("cuda").device == "cuda:0"  # a bare "cuda" is refused by set_device on torch 2.11
    assert setup_distributed("auto").device == "cuda:0"
    assert setup_distributed("cpu").device == "cpu"
    assert chosen == [torch.device("cuda:0")] * 2


def test_decontamination_drops_rows_that_repeat_an_evaluation_set_and_reports_them(tmp_path, tokenizer, data_file):
    """``decontaminate_against`` names an evaluation set whose query repeats training row 3 (case and spaces
    differ); the run trains on the other rows and writes what went and why."""
    folder = tmp_path / "ev"
    (folder / "qrels").mkdir(parents=True)
    write_jsonl(folder / "corpus.jsonl", [{"_id": "d1", "text": "unrelated"}])
    write_jsonl(folder / "queries.jsonl", [{"_id": "q1", "text": "A  GREAT movie"}])
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    cfg = make_config(tmp_path, data_file, steps=1, decontaminate_against=str(folder))
    assert cfg.decontaminate_against == [str(folder)]
    trainer = Trainer(cfg, model=tiny_embedder(tokenizer))
    (dataset,) = trainer.sampler.datasets
    assert len(dataset.examples) == len(ROWS) - 1 and all(e.query != "a great movie" for e in dataset.examples)
    report = json.loads((tmp_path / "run" / "decontamination.json").read_text())
    assert report["rows"] == len(ROWS) and report["dropped"] == 1 and report["drops"][0]["row"] == 3
