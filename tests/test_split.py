"""accumrun.split: how a batch is cut into sub-batches, and the one-line descriptions of the plan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accumrun.core.sub_batches import (
    describe_batch,
    describe_plan,
    effective_subdivisions,
    epoch_batches,
    replica_sizes,
    replica_sub_batch_sizes,
    sub_batch_sizes,
)


@pytest.mark.parametrize(
    ("batch", "subdivisions", "sizes"),
    [
        (10, 3, [3, 3, 4]),
        (10, 4, [2, 3, 2, 3]),
        (3, 5, [1, 1, 1]),
        (10, 1, [10]),
        (10, 10, [1] * 10),
        (64, 4, [16, 16, 16, 16]),
        (17, 4, [4, 4, 4, 5]),
        (1, 4, [1]),
    ],
)
def test_sub_batch_sizes_examples(batch: int, subdivisions: int, sizes: list[int]) -> None:
    assert sub_batch_sizes(batch, subdivisions) == sizes


@pytest.mark.parametrize(
    ("batch", "subdivisions", "effective"), [(10, 3, 3), (3, 5, 3), (10, 10, 10), (7, 1, 1), (5, 0, 1)]
)
def test_effective_subdivisions(batch: int, subdivisions: int, effective: int) -> None:
    assert effective_subdivisions(batch, subdivisions) == effective


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5000).flatmap(lambda b: st.tuples(st.just(b), st.integers(1, b))))
def test_sub_batch_sizes_partition_the_batch(case: tuple[int, int]) -> None:
    batch, subdivisions = case
    sizes = sub_batch_sizes(batch, subdivisions)
    assert sum(sizes) == batch
    assert len(sizes) == subdivisions
    assert min(sizes) >= 1
    assert max(sizes) - min(sizes) <= 1
    # The documented rule: sub-batch i holds samples [i*n//s, (i+1)*n//s).
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    assert starts.tolist() == [i * batch // subdivisions for i in range(subdivisions)]


@settings(deadline=None)
@given(st.integers(1, 500), st.integers(1, 100))
def test_a_short_batch_is_cut_into_single_samples(batch: int, extra: int) -> None:
    assert sub_batch_sizes(batch, batch + extra) == [1] * batch


@pytest.mark.parametrize(
    ("batch", "subdivisions", "text"),
    [
        (10, 3, "batch 10 = 3 sub-batches x 3-4 samples"),
        (256, 8, "batch 256 = 8 sub-batches x 32 samples"),
        (10, 1, "batch 10 = 1 sub-batch x 10 samples"),
        (1024, 3, "batch 1,024 = 3 sub-batches x 341-342 samples"),
    ],
)
def test_describe_batch(batch: int, subdivisions: int, text: str) -> None:
    assert describe_batch(batch, subdivisions) == text


@pytest.mark.parametrize(
    ("train_size", "batch_size", "drop_remainder", "result"),
    [
        (1617, 64, False, (26, 17)),
        (1617, 64, True, (25, 64)),
        (1024, 256, False, (4, 256)),
        (1024, 256, True, (4, 256)),
        (10, 10, False, (1, 10)),
        (5, 10, False, (1, 5)),
    ],
)
def test_epoch_batches(train_size: int, batch_size: int, drop_remainder: bool, result: tuple[int, int]) -> None:
    assert epoch_batches(train_size, batch_size, drop_remainder) == result


def test_describe_plan_names_the_short_last_batch() -> None:
    assert (
        describe_plan(1617, 64, 4, False)
        == "batch 64 = 4 sub-batches x 16 samples; 26 updates per epoch (last batch 17 = 4 sub-batches x 4-5 samples)"
    )


def test_describe_plan_with_drop_remainder_counts_the_dropped_samples() -> None:
    assert (
        describe_plan(1617, 64, 4, True)
        == "batch 64 = 4 sub-batches x 16 samples; 25 updates per epoch (17 samples dropped each epoch)"
    )


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_describe_plan_with_exact_division_has_no_remark(drop_remainder: bool) -> None:
    assert describe_plan(1024, 256, 8, drop_remainder) == "batch 256 = 8 sub-batches x 32 samples; 4 updates per epoch"


def test_describe_plan_singular_update() -> None:
    assert describe_plan(10, 10, 1, False) == "batch 10 = 1 sub-batch x 10 samples; 1 update per epoch"


def test_describe_plan_short_last_batch_with_even_sub_batches() -> None:
    assert (
        describe_plan(26, 10, 3, False)
        == "batch 10 = 3 sub-batches x 3-4 samples; 3 updates per epoch (last batch 6 = 3 sub-batches x 2 samples)"
    )


def test_describe_plan_thousands_separators_in_updates() -> None:
    assert describe_plan(2048 * 1000, 2, 1, False) == "batch 2 = 1 sub-batch x 2 samples; 1,024,000 updates per epoch"


def _least_squares_mean_gradient(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Mean over samples of the gradient of 0.5 * (x . w - y)^2 with respect to w."""
    return x.T @ (x @ w - y) / len(x)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 300).flatmap(lambda b: st.tuples(st.just(b), st.integers(1, b + 5))),
    st.integers(1, 8),
    st.integers(0, 2**32 - 1),
)
def test_weighted_sub_batch_gradients_equal_the_full_batch_gradient(
    case: tuple[int, int], features: int, seed: int
) -> None:
    batch, subdivisions = case
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, features))
    y = rng.normal(size=batch)
    w = rng.normal(size=features)

    full = _least_squares_mean_gradient(x, y, w)
    sizes = sub_batch_sizes(batch, subdivisions)
    accumulated = np.zeros(features)
    start = 0
    for size in sizes:
        part = slice(start, start + size)
        accumulated += (size / batch) * _least_squares_mean_gradient(x[part], y[part], w)
        start += size
    assert start == batch
    assert np.allclose(accumulated, full, rtol=1e-10, atol=1e-12)


def test_unweighted_mean_of_uneven_sub_batches_differs_from_the_full_batch(rng: np.random.Generator) -> None:
    # Why the weights matter: with sizes [3, 3, 4] the plain mean of sub-batch means is not the batch mean.
    x = rng.normal(size=(10, 2))
    y = rng.normal(size=10)
    w = rng.normal(size=2)
    sizes = sub_batch_sizes(10, 3)
    bounds = np.cumsum([0, *sizes])
    means = [_least_squares_mean_gradient(x[a:b], y[a:b], w) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    full = _least_squares_mean_gradient(x, y, w)
    assert not np.allclose(np.mean(means, axis=0), full, rtol=1e-10)
    assert np.allclose(sum(s / 10 * m for s, m in zip(sizes, means, strict=True)), full, rtol=1e-10)


@pytest.mark.parametrize(
    ("batch", "replicas", "sizes"),
    [(64, 2, [32, 32]), (9, 2, [4, 5]), (10, 3, [3, 3, 4]), (1, 2, [0, 1]), (3, 4, [0, 1, 1, 1]), (7, 1, [7])],
)
def test_replica_sizes_examples(batch: int, replicas: int, sizes: list[int]) -> None:
    assert replica_sizes(batch, replicas) == sizes


@given(batch=st.integers(1, 500), replicas=st.integers(1, 16), subdivisions=st.integers(1, 40))
@settings(max_examples=200, deadline=None)
def test_replicas_and_their_sub_batches_cover_the_batch(batch: int, replicas: int, subdivisions: int) -> None:
    parts = replica_sizes(batch, replicas)
    assert sum(parts) == batch and max(parts) - min(parts) <= 1
    sizes = replica_sub_batch_sizes(batch, replicas, subdivisions)
    assert sum(sizes) == batch and min(sizes) >= 1


def test_plan_across_replicas_names_the_split_and_the_short_last_batch() -> None:
    assert describe_plan(1617, 64, 4, False, replicas=2) == (
        "batch 64 = 2 replicas x 32 samples, each in 4 sub-batches x 8 samples; 26 updates per epoch "
        "(last batch 17 = 2 replicas x 8-9 samples, each in 4 sub-batches x 2-3 samples)"
    )
    assert describe_plan(19, 9, 3, False, replicas=2) == (
        "batch 9 = 2 replicas x 4-5 samples, each in 3 sub-batches x 1-2 samples; 3 updates per epoch "
        "(last batch 1 = 2 replicas x 0-1 samples, each in 1 sub-batch x 1 sample)"
    )


def test_plan_on_one_replica_is_the_plain_plan() -> None:
    assert describe_plan(100, 10, 3, False, replicas=1) == describe_plan(100, 10, 3, False)
