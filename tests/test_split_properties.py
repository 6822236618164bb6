"""Properties of the sub-batch rule in accumrun.core.sub_batches, for every batch size and subdivision count hypothesis
draws.

The gradient properties use per-sample gradients of a linear model with squared loss, in float64 numpy, and cut
the batch exactly as the step does: sub-batch ``i`` of ``s`` holds samples ``[i*B//s, (i+1)*B//s)``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from accumrun.core.sub_batches import effective_subdivisions, part_bounds, starts_by_size, sub_batch_sizes

PROPERTY = settings(max_examples=200, deadline=None)

batches = st.integers(1, 512)
# S from 1 up to B (what the config allows) and above B (a short last batch meets the configured count).
batch_and_any_subdivisions = batches.flatmap(lambda b: st.tuples(st.just(b), st.integers(1, 2 * b + 8)))
# B = q*S + r with 0 < r < S: the sizes are unequal (some q, some q + 1), built so, not filtered for.
uneven_batch_and_subdivisions = st.integers(2, 64).flatmap(
    lambda s: st.tuples(st.integers(1, 512 // s), st.integers(1, s - 1)).map(lambda qr: (qr[0] * s + qr[1], s))
)
seeds = st.integers(0, 2**32 - 1)


def step_bounds(batch: int, subdivisions: int) -> list[int]:
    """The sub-batch boundaries that the step slices at, written out independently of ``split``."""
    s = min(subdivisions, batch)
    return [i * batch // s for i in range(s + 1)]


def per_sample_gradients(seed: int, batch: int, features: int) -> np.ndarray:
    """Row ``k``: the gradient of ``0.5 * (x_k . w - y_k)**2`` with respect to ``w``, for random x, y and w."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, features))
    y = rng.normal(size=batch)
    w = rng.normal(size=features)
    return (x @ w - y)[:, None] * x


def sub_batch_means(gradients: np.ndarray, subdivisions: int) -> tuple[np.ndarray, np.ndarray]:
    """``(sizes, means)``: each sub-batch's sample count and mean gradient, cut at :func:`step_bounds`."""
    bounds = step_bounds(len(gradients), subdivisions)
    pairs = list(zip(bounds[:-1], bounds[1:], strict=True))
    return np.array([end - start for start, end in pairs]), np.stack([gradients[a:b].mean(axis=0) for a, b in pairs])


@PROPERTY
@given(batch_and_any_subdivisions)
def test_sizes_cover_the_batch_in_nearly_equal_nonempty_parts(case: tuple[int, int]) -> None:
    batch, subdivisions = case
    sizes = sub_batch_sizes(batch, subdivisions)
    assert sum(sizes) == batch
    assert min(sizes) >= 1
    assert len(sizes) == min(subdivisions, batch) == effective_subdivisions(batch, subdivisions)
    assert max(sizes) - min(sizes) <= 1


@PROPERTY
@given(batch_and_any_subdivisions)
def test_sizes_are_the_slices_the_step_takes(case: tuple[int, int]) -> None:
    batch, subdivisions = case
    assert np.cumsum([0, *sub_batch_sizes(batch, subdivisions)]).tolist() == step_bounds(batch, subdivisions)


@PROPERTY
@given(batch_and_any_subdivisions)
def test_the_starts_by_size_are_where_the_step_slices(case: tuple[int, int]) -> None:
    batch, subdivisions = case
    bounds = step_bounds(batch, subdivisions)
    pairs = list(zip(bounds[:-1], bounds[1:], strict=True))
    assert [part_bounds(i, batch, len(pairs)) for i in range(len(pairs))] == pairs
    groups = starts_by_size(batch, subdivisions)
    assert [size for size, _ in groups] == sorted({end - start for start, end in pairs})
    assert sorted((start, start + size) for size, starts in groups for start in starts) == pairs


@PROPERTY
@given(batches, st.integers(1, 100))
def test_more_subdivisions_than_samples_gives_one_sample_each(batch: int, extra: int) -> None:
    assert sub_batch_sizes(batch, batch + extra) == [1] * batch


@PROPERTY
@given(batches, st.integers(-100, 0))
def test_fewer_than_one_subdivision_is_clamped_to_the_whole_batch(batch: int, subdivisions: int) -> None:
    # The config and the step's cut refuse such counts; the size rule itself falls back to one sub-batch.
    assert sub_batch_sizes(batch, subdivisions) == [batch]


@PROPERTY
@given(batch_and_any_subdivisions, st.integers(1, 8), seeds)
def test_sample_weighted_mean_of_sub_batch_means_is_the_batch_mean_gradient(
    case: tuple[int, int], features: int, seed: int
) -> None:
    batch, subdivisions = case
    gradients = per_sample_gradients(seed, batch, features)
    sizes, means = sub_batch_means(gradients, subdivisions)
    assert sizes.tolist() == sub_batch_sizes(batch, subdivisions)
    weighted = (sizes / batch) @ means
    np.testing.assert_allclose(weighted, gradients.mean(axis=0), rtol=1e-10, atol=1e-12)


@PROPERTY
@given(uneven_batch_and_subdivisions, st.integers(1, 8), seeds)
def test_dividing_by_s_is_wrong_when_the_sizes_differ(case: tuple[int, int], features: int, seed: int) -> None:
    batch, subdivisions = case
    gradients = per_sample_gradients(seed, batch, features)
    sizes, means = sub_batch_means(gradients, subdivisions)
    assert len(set(sizes.tolist())) == 2
    full = gradients.mean(axis=0)
    naive = means.mean(axis=0)
    # The bias is sum_i (1/S - n_i/B) * m_i; its weights sum to zero, so it vanishes only if all m_i agree.
    bias = (1 / subdivisions - sizes / batch) @ means
    np.testing.assert_allclose(naive - full, bias, rtol=1e-9, atol=1e-12)
    assume(np.ptp(means, axis=0).max() > 1e-6)
    assert not np.allclose(naive, full, rtol=1e-9, atol=1e-12)
