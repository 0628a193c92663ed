"""Hand-checked values and behaviours of the training losses."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmembed.training.losses import (
    AnglELoss,
    GTELoss,
    InfoNCELoss,
    MatryoshkaLoss,
    TripletLoss,
    angle_similarity,
    available_losses,
    build_loss,
    cosent_loss,
)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a, b, dim=0))


def _batch(batch: int = 4, negatives: int = 2, dim: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, dim, generator=gen)
    p = torch.randn(batch, dim, generator=gen)
    n = torch.randn(batch, negatives, dim, generator=gen)
    return q, p, n


def _ce(logits: list[float], target: int) -> float:
    return -logits[target] + math.log(sum(math.exp(x) for x in logits))


# --------------------------------------------------------------------------------------- InfoNCE


def test_infonce_b2_matches_manual_cross_entropy():
    q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    p = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    tau = 0.5
    loss = InfoNCELoss(temperature=tau)(q, p, None)
    rows = []
    for i in range(2):
        logits = [_cos(q[i], p[j]) / tau for j in range(2)]
        rows.append(_ce(logits, i))
    assert loss.item() == pytest.approx(sum(rows) / 2, abs=1e-6)


def test_infonce_hard_negatives_are_shared_across_the_batch():
    q, p, n = _batch(batch=2, negatives=1, dim=3)
    tau = 0.1
    loss = InfoNCELoss(temperature=tau)(q, p, n)
    candidates = [p[0], p[1], n[0, 0], n[1, 0]]
    expected = sum(_ce([_cos(q[i], c) / tau for c in candidates], i) for i in range(2)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_infonce_dot_similarity_does_not_normalise():
    q = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    p = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    loss = InfoNCELoss(temperature=1.0, similarity="dot")(q, p)
    expected = (_ce([2.0, 2.0], 0) + _ce([0.0, 1.0], 1)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_infonce_without_in_batch_negatives_only_sees_own_candidates():
    q, p, n = _batch(batch=3, negatives=2, dim=5)
    tau = 0.05
    loss = InfoNCELoss(temperature=tau, in_batch_negatives=False)(q, p, n)
    expected = 0.0
    for i in range(3):
        logits = [_cos(q[i], p[i]) / tau] + [_cos(q[i], n[i, k]) / tau for k in range(2)]
        expected += _ce(logits, 0) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert loss.item() != pytest.approx(InfoNCELoss(temperature=tau)(q, p, n).item(), rel=1e-3)


def _grad_of_second_positive(loss_fn, q, p, n):
    p = p.clone().requires_grad_(True)
    loss_fn(q, p, n).backward()
    return p.grad[1].clone()


@pytest.mark.parametrize("in_batch", [True, False])
def test_other_queries_reach_a_positive_only_with_in_batch_negatives(in_batch):
    q, p, n = _batch(batch=3, negatives=1, dim=5)
    loss_fn = InfoNCELoss(temperature=0.1, in_batch_negatives=in_batch)
    q_moved = q.clone()
    q_moved[0] = torch.randn(5)
    same = torch.allclose(_grad_of_second_positive(loss_fn, q, p, n), _grad_of_second_positive(loss_fn, q_moved, p, n))
    assert same is not in_batch


def test_infonce_in_batch_false_and_no_negatives_is_zero():
    q, p, _ = _batch()
    loss = InfoNCELoss(in_batch_negatives=False)(q, p, None)
    assert loss.item() == pytest.approx(0.0, abs=1e-7)


def test_infonce_symmetric_adds_document_to_query_term():
    q, p, n = _batch(batch=3, negatives=1, dim=4)
    tau = 0.2
    forward = InfoNCELoss(temperature=tau)(q, p, n)
    both = InfoNCELoss(temperature=tau, symmetric=True)(q, p, n)
    reverse = sum(_ce([_cos(p[i], q[j]) / tau for j in range(3)], i) for i in range(3)) / 3
    assert both.item() == pytest.approx(0.5 * (forward.item() + reverse), rel=1e-5)


def test_infonce_symmetric_requires_in_batch_negatives():
    with pytest.raises(ValueError):
        InfoNCELoss(symmetric=True, in_batch_negatives=False)


def test_infonce_accepts_empty_negatives_and_2d_negatives():
    q, p, n = _batch(negatives=1)
    loss_fn = InfoNCELoss()
    assert loss_fn(q, p, n[:, :0]).item() == pytest.approx(loss_fn(q, p, None).item())
    assert loss_fn(q, p, n[:, 0]).item() == pytest.approx(loss_fn(q, p, n).item())


def test_infonce_gather_hook_is_used():
    q, p, n = _batch()
    calls: list[tuple[int, ...]] = []

    def gather(t: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(t.shape))
        return t

    loss = InfoNCELoss(gather=gather, symmetric=True)(q, p, n)
    assert loss.item() == pytest.approx(InfoNCELoss(symmetric=True)(q, p, n).item())
    assert calls == [(4, 8), (8, 8), (4, 8)]  # positives, flattened negatives, queries


@pytest.mark.parametrize(
    "loss_fn",
    [
        InfoNCELoss(),
        InfoNCELoss(in_batch_negatives=False),
        InfoNCELoss(symmetric=True, similarity="dot", temperature=1.0),
        TripletLoss(),
        TripletLoss(distance="cosine"),
        GTELoss(),
        MatryoshkaLoss(InfoNCELoss(), dims=[8, 4, 2]),
    ],
)
def test_gradients_flow_to_every_input(loss_fn):
    q, p, n = (t.requires_grad_(True) for t in _batch())
    loss = loss_fn(q, p, n)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    for t in (q, p, n):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------- Triplet


def test_triplet_euclidean_hand_computed():
    q = torch.tensor([[0.0, 0.0]])
    p = torch.tensor([[3.0, 4.0]])  # distance 5
    n = torch.tensor([[[1.0, 0.0], [0.0, 10.0]]])  # distances 1 and 10
    loss = TripletLoss(margin=1.0)(q, p, n)
    assert loss.item() == pytest.approx(((5 - 1 + 1) + max(0.0, 5 - 10 + 1)) / 2)


def test_triplet_cosine_and_default_margins():
    assert TripletLoss().margin == 5.0
    assert TripletLoss(distance="cosine").margin == 0.5
    q = torch.tensor([[1.0, 0.0]])
    p = torch.tensor([[1.0, 1.0]])  # cosine distance 1 - 1/sqrt(2)
    n = torch.tensor([[0.0, 3.0]])  # cosine distance 1
    loss = TripletLoss(margin=0.5, distance="cosine")(q, p, n)
    assert loss.item() == pytest.approx(max(0.0, (1 - 1 / math.sqrt(2)) - 1 + 0.5), abs=1e-6)


def test_triplet_needs_negatives():
    q, p, _ = _batch()
    with pytest.raises(ValueError):
        TripletLoss()(q, p, None)


# ------------------------------------------------------------------------------------------- GTE


def _gte_manual(q, p, n, tau):
    batch, num_neg = n.shape[:2]
    docs = [p[j] for j in range(batch)] + [n[j, k] for j in range(batch) for k in range(num_neg)]
    owner = list(range(batch)) + [j for j in range(batch) for _ in range(num_neg)]
    total = 0.0
    for i in range(batch):
        positive = _cos(q[i], p[i]) / tau
        z = sum(math.exp(_cos(q[i], d) / tau) for d in docs)
        z += sum(math.exp(_cos(q[i], q[j]) / tau) for j in range(batch) if j != i)
        z += sum(math.exp(_cos(q[j], p[i]) / tau) for j in range(batch))  # every query, its own too (eq. 3)
        z += sum(math.exp(_cos(d, p[i]) / tau) for d, o in zip(docs, owner, strict=True) if o != i)
        total += -positive + math.log(z)
    return total / batch


@pytest.mark.parametrize("num_neg", [0, 2])
def test_gte_matches_the_four_term_partition_function(num_neg):
    q, p, n = _batch(batch=3, negatives=num_neg, dim=5, seed=3)
    tau = 0.3
    loss = GTELoss(temperature=tau)(q, p, n if num_neg else None)
    assert loss.item() == pytest.approx(_gte_manual(q, p, n, tau), rel=1e-5)


def test_gte_equals_sentence_transformers_four_directions():
    """GTE's improved contrastive loss is sentence-transformers' MultipleNegativesRankingLoss with its four
    directions (query→doc, query→query, doc→query, doc→doc); lmembed left the row's own query out of the
    doc→query term, 0.14 off this loss."""
    st_losses = pytest.importorskip("sentence_transformers.losses")
    q, p, _ = _batch(batch=4, negatives=0, dim=6, seed=5)
    tau = 0.05
    want = GTELoss(temperature=tau)(q, p, None).item()

    class Fixed(torch.nn.Module):  # a "model" that returns the given embeddings for each input
        def forward(self, features):
            return {"sentence_embedding": features["x"]}

    directions = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
    mnrl = st_losses.MultipleNegativesRankingLoss(Fixed(), scale=1 / tau, directions=directions, partition_mode="joint")
    got = mnrl([{"x": q}, {"x": p}], labels=None).item()
    assert want == pytest.approx(got, rel=1e-5)


def test_gte_single_pair_is_zero_and_bounds_infonce():
    q, p, n = _batch(batch=1, negatives=0)
    assert GTELoss()(q, p, None).item() == pytest.approx(math.log(2), abs=1e-6)  # the positive counts twice
    q, p, n = _batch()
    # A larger partition function can only raise the loss.
    assert GTELoss(temperature=0.1)(q, p, n) > InfoNCELoss(temperature=0.1)(q, p, n)


# ----------------------------------------------------------------------------------------- AnglE


def test_cosent_hand_computed():
    predicted = torch.tensor([0.2, 0.9])
    labels = torch.tensor([1.0, 0.0])  # pair 0 should score higher but scores lower
    loss = cosent_loss(predicted, labels, scale=2.0)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(2.0 * (0.9 - 0.2))), rel=1e-6)
    assert cosent_loss(predicted, torch.tensor([1.0, 1.0])).item() == pytest.approx(0.0, abs=1e-7)


def test_angle_similarity_known_values():
    x = torch.tensor([[1.0, 0.0, 0.0, 0.0]])  # complex (1, 0)
    assert angle_similarity(x, x).item() == pytest.approx(1.0)
    # w = i * z: 90 degrees apart in the complex plane, cosine of the real vectors is 0.
    z = torch.tensor([[1.0, 2.0, 0.5, -1.0]])
    w = torch.tensor([[-0.5, 1.0, 1.0, 2.0]])  # i*(a + ib) = -b + ia
    assert F.cosine_similarity(z, w).item() == pytest.approx(0.0, abs=1e-6)
    assert angle_similarity(z, w).item() == pytest.approx(1.0, abs=1e-6)  # |cos 90° + sin 90°|
    odd = torch.randn(3, 5)
    assert angle_similarity(odd, odd).allclose(torch.ones(3))


def test_angle_loss_is_finite_and_decreases_when_pairs_align():
    gen = torch.Generator().manual_seed(0)
    text1 = torch.randn(6, 16, generator=gen)
    text2 = torch.randn(6, 16, generator=gen)
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    loss_fn = AnglELoss()
    before = loss_fn(text1, text2, scores)
    assert torch.isfinite(before)
    aligned = text2.clone()
    aligned[scores == 1] = text1[scores == 1] + 0.01 * torch.randn(3, 16, generator=gen)
    after = loss_fn(text1, aligned, scores)
    assert torch.isfinite(after) and after < before


def test_angle_loss_training_steps_reduce_it():
    gen = torch.Generator().manual_seed(1)
    text1 = torch.randn(8, 12, generator=gen)
    text2 = torch.randn(8, 12, generator=gen).requires_grad_(True)
    scores = torch.linspace(0, 5, 8)
    loss_fn = AnglELoss(positive_threshold=4.0)
    opt = torch.optim.SGD([text2], lr=0.5)
    first = loss_fn(text1, text2, scores).item()
    for _ in range(30):
        opt.zero_grad()
        loss = loss_fn(text1, text2, scores)
        loss.backward()
        opt.step()
    assert loss_fn(text1, text2, scores).item() < first


def test_angle_terms_can_be_isolated():
    text1, text2, _ = _batch(batch=4, negatives=0, dim=6)
    scores = torch.tensor([3.0, 1.0, 2.0, 0.0])
    only_cos = AnglELoss(ibn_weight=0, angle_weight=0, cosine_scale=5.0)(text1, text2, scores)
    cosines = F.cosine_similarity(text1, text2)
    assert only_cos.item() == pytest.approx(cosent_loss(cosines, scores, 5.0).item())
    no_positives = AnglELoss(cosine_weight=0, angle_weight=0, positive_threshold=10.0)
    x = text1.clone().requires_grad_(True)
    zero = no_positives(x, text2, scores)
    assert zero.item() == 0.0
    zero.backward()  # still connected to the graph


# ------------------------------------------------------------------------------------ Matryoshka


def test_matryoshka_is_weighted_sum_of_truncated_losses():
    q, p, n = _batch(dim=8)
    inner = InfoNCELoss(temperature=0.1)
    wrapped = MatryoshkaLoss(inner, dims=[8, 4, 2], weights=[1.0, 0.5, 0.25])
    expected = (
        inner(q, p, n) + 0.5 * inner(q[:, :4], p[:, :4], n[..., :4]) + 0.25 * inner(q[:, :2], p[:, :2], n[..., :2])
    )
    assert wrapped(q, p, n).item() == pytest.approx(expected.item(), rel=1e-6)


def test_matryoshka_wraps_angle_and_passes_scores_through():
    text1, text2, _ = _batch(batch=4, negatives=0, dim=8)
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    inner = AnglELoss()
    wrapped = MatryoshkaLoss(inner, dims=[8, 4])
    expected = inner(text1, text2, scores) + inner(text1[:, :4], text2[:, :4], scores)
    assert wrapped(text1, text2, scores).item() == pytest.approx(expected.item(), rel=1e-6)


def test_matryoshka_rejects_bad_configuration():
    with pytest.raises(ValueError):
        MatryoshkaLoss(InfoNCELoss(), dims=[8, 4], weights=[1.0])
    with pytest.raises(ValueError):
        MatryoshkaLoss(InfoNCELoss(), dims=[16])(*_batch(dim=8))


# -------------------------------------------------------------------------------------- registry


def test_build_loss_registry():
    assert available_losses() == [
        "angle",
        "distill_kl",
        "gte",
        "infonce",
        "listwise_softmax",
        "margin_mse",
        "matryoshka",
        "matryoshka_2d",
        "pointwise_bce",
        "triplet",
    ]
    loss = build_loss("InfoNCE", temperature=0.05, in_batch_negatives=False)
    assert isinstance(loss, InfoNCELoss) and loss.temperature == 0.05 and not loss.in_batch_negatives
    assert isinstance(build_loss("info-nce"), InfoNCELoss)
    mrl = build_loss("matryoshka", inner="gte", dims=[8, 4], inner_kwargs={"temperature": 0.1})
    assert isinstance(mrl, MatryoshkaLoss) and isinstance(mrl.loss, GTELoss) and mrl.loss.temperature == 0.1
    assert isinstance(build_loss("mrl", inner=TripletLoss(), dims=[4]).loss, TripletLoss)
    with pytest.raises(KeyError):
        build_loss("nope")


def test_each_loss_declares_the_shared_options_its_class_takes():
    """A ``LossSpec`` declares which of the trainer's shared settings its loss takes; the declaration names
    real parameters, and leaves out none of the shared ones the class has (so it cannot drift)."""
    import inspect

    from lmembed.training.losses import LOSSES, SHARED_OPTIONS

    for name, spec in LOSSES.items():
        params = set(inspect.signature(spec.factory).parameters)
        assert spec.takes == SHARED_OPTIONS & params, name
    assert LOSSES["infonce"].takes == SHARED_OPTIONS and LOSSES["triplet"].takes == frozenset()
    assert LOSSES["angle"].not_contrastive and not LOSSES["gte"].not_contrastive


def test_loss_names_have_one_spelling_rule():
    from lmembed.training.loss_names import canonical_loss_name
    from lmembed.training.losses import loss_spec

    assert canonical_loss_name(" Info-NCE ") == "infonce" and canonical_loss_name("MRL") == "matryoshka"
    assert loss_spec("improved-contrastive").factory is GTELoss


def test_bad_loss_settings_are_user_errors_naming_the_setting():
    from lmembed.errors import ConfigError, UnknownNameError

    with pytest.raises(ConfigError, match="has no option colour; it takes margin, distance"):
        build_loss("triplet", colour="red")
    with pytest.raises(UnknownNameError, match="unknown loss 'nope'; available: angle, distill_kl, gte"):
        build_loss("nope")
    with pytest.raises(ConfigError, match="temperature must be positive"):
        build_loss("gte", temperature=0)
    with pytest.raises(ConfigError, match="dims must be positive"):
        build_loss("matryoshka", inner="infonce", dims=[0])


# ------------------------------------------------------------------------------- copies of a positive in a batch


def test_copies_of_a_rows_positive_are_left_out_of_its_negatives():
    """Two queries sharing a document, or a row met twice at an epoch's turn, put the same text in the batch twice:
    each copy was the other row's negative (its loss could not fall below ln 2, and the gradient pushed the query
    away from its own document). The sampler marks the copies on the global batch; InfoNCE (plain, symmetric and
    under Matryoshka) leaves them out, which equals the loss with those columns deleted."""
    from lmembed.training.losses import MatryoshkaLoss, reads_false_negatives
    from lmembed.training.rows import MixtureSampler, TrainDataset, TrainExample

    examples = [TrainExample("q1", ("shared doc",), ("n1",)), TrainExample("q2", ("shared doc",), ("n2",))]
    examples += [TrainExample("q3", ("other doc",), ("shared doc",))]
    sampler = MixtureSampler([TrainDataset("d", examples, [])], batch_size=3, num_negatives=1, seed=0)
    batch = sampler.batch(0)
    documents = batch.positives + batch.flat_negatives
    marks = batch.false_negatives
    assert marks is not None
    for row, positive in enumerate(batch.positives):
        want = [c != row and text == positive for c, text in enumerate(documents)]
        assert marks[row].tolist() == want
    assert marks.sum() == 4  # q1 and q2: the other's positive and q3's negative; q3: none
    assert batch.shard(1, 3).false_negatives.tolist() == [marks[1].tolist()]

    q, p, n = _batch(batch=3, negatives=1, dim=6, seed=7)
    mask = torch.from_numpy(marks)
    for loss in (InfoNCELoss(temperature=0.1), MatryoshkaLoss(InfoNCELoss(temperature=0.1), dims=[6])):
        assert reads_false_negatives(loss)
        got = loss(q, p, n, false_negatives=mask).item()
        docs = torch.cat([p, n.reshape(-1, 6)])
        want = 0.0
        for i in range(3):
            keep = [c for c in range(docs.size(0)) if not marks[i, c]]
            logits = (F.normalize(q[i], dim=0) @ F.normalize(docs[keep], dim=1).T / 0.1).tolist()
            want += _ce(logits, keep.index(i)) / 3
        assert got == pytest.approx(want, rel=1e-5)
        assert loss(q, p, n).item() > got  # unmasked: the copies count against their rows
    assert not reads_false_negatives(InfoNCELoss(in_batch_negatives=False))
    symmetric = InfoNCELoss(temperature=0.1, symmetric=True)
    assert symmetric(q, p, n, false_negatives=mask).item() < symmetric(q, p, n).item()
