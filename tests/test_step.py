"""The accumulation step proves numbers: subdivided training equals full-batch training."""

from __future__ import annotations

import functools
import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from accumrun.core.losses import sparse_categorical_crossentropy
from accumrun.core.step import make_gradient_fn, make_train_step
from accumrun.core.sub_batches import sub_batch_loops, sub_batch_sizes
from accumrun.data.feeder import Feeder
from accumrun.data.source import ArraySource
from accumrun.kinds import Feed
from tests.helpers import dense_model, make_data, max_difference

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.2, momentum=0.5),
    "adam": lambda: keras.optimizers.Adam(0.02),
}


def train_weights(
    subdivisions: int,
    batch_size: int,
    samples: int = 23,
    optimizer: str = "adam",
    epochs: int = 2,
    regularized: bool = False,
    make_optimizer=None,
    jit_compile: bool = False,
) -> tuple[list[np.ndarray], keras.optimizers.Optimizer, object]:
    """Train from fixed weights over fixed batches; return the final weights, optimizer and step."""
    model = dense_model(regularized=regularized)
    opt = make_optimizer() if make_optimizer else OPTIMIZERS[optimizer]()
    step = make_train_step(model, sparse_categorical_crossentropy, opt, subdivisions, jit_compile=jit_compile)
    x, y = make_data(samples)
    for _ in range(epochs):
        for start in range(0, samples, batch_size):
            step(tf.constant(x[start : start + batch_size]), tf.constant(y[start : start + batch_size]))
    return [v.numpy() for v in model.trainable_variables], opt, step


def shared_training(
    subdivisions: int, batch_size: int, optimizer: str = "adam", epochs: int = 2, regularized: bool = False
) -> tuple[tuple[np.ndarray, ...], int]:
    """The final weights (read only) and the optimizer's update count of :func:`train_weights` on 23 samples,
    trained once per module for every test that reads them."""
    return _shared_training(subdivisions, batch_size, optimizer, epochs, regularized)


@functools.cache  # keyed on every argument given positionally, so that a default and its value are one run
def _shared_training(
    subdivisions: int, batch_size: int, optimizer: str, epochs: int, regularized: bool
) -> tuple[tuple[np.ndarray, ...], int]:
    weights, opt, _ = train_weights(
        subdivisions, batch_size, optimizer=optimizer, epochs=epochs, regularized=regularized
    )
    for array in weights:
        array.flags.writeable = False
    return tuple(weights), int(opt.iterations.numpy())


def plain_weights(batch_size: int, optimizer: str = "adam", epochs: int = 2, regularized: bool = False) -> tuple:
    """The weights of plain training (one sub-batch), trained once per module (read only)."""
    return shared_training(1, batch_size, optimizer, epochs, regularized)[0]


# The optimizer sees only the accumulated gradient, so the cut and the optimizer are independent: each cut once.
# The full batches of 10 run the static loops (one sub-batch size at S=2 and S=10, two at S=4: 3-3-2-2), the last
# batch of 3 the dynamic loop (S=2 cuts it 2-1; S=4 and S=10 exceed it, so it runs as S=3 would). S=3 (4-3-3, then
# 1-1-1) is test_regularization_losses_count_once_per_batch's.
@pytest.mark.parametrize(("subdivisions", "optimizer"), [(2, "sgd"), (4, "adam"), (10, "sgd")])
def test_subdivided_training_equals_plain_training(optimizer: str, subdivisions: int) -> None:
    # 23 samples in batches of 10: the last batch has 3, so S=4 and S=10 also cut a batch smaller than S.
    reference = plain_weights(10, optimizer)
    weights, _ = shared_training(subdivisions, 10, optimizer)
    assert max_difference(reference, weights) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("subdivisions", [7, 23])
def test_full_batch_with_subdivisions_equals_full_batch(subdivisions: int) -> None:
    # 23 in 7 sub-batches of 3 and 4 (two static loops), and in 23 of one sample each.
    reference = plain_weights(23, epochs=5)
    weights, _, _ = train_weights(subdivisions, batch_size=23, epochs=5)
    assert max_difference(reference, weights) < 1e-5


def test_training_actually_moves_the_weights() -> None:
    # Guards the exactness tests against passing trivially on weights that never change.
    initial = [v.numpy() for v in dense_model().trainable_variables]
    trained, _ = shared_training(4, 10)  # the run that test_subdivided_training_equals_plain_training compares
    assert max_difference(initial, trained) > 1e-2


def test_accumulated_gradient_equals_the_full_batch_gradient() -> None:
    model = dense_model()
    x, y = make_data(10)
    with tf.GradientTape() as tape:
        mean_loss = tf.reduce_mean(sparse_categorical_crossentropy(y, model(x, training=True)))
    expected = tape.gradient(mean_loss, model.trainable_variables)

    accumulate = make_gradient_fn(model, sparse_categorical_crossentropy, 3)
    gradients, loss_sum, _ = accumulate(tf.constant(x), tf.constant(y))

    assert max_difference([g.numpy() for g in expected], [g.numpy() for g in gradients]) < 1e-6
    assert float(loss_sum) / 10 == pytest.approx(float(mean_loss), rel=1e-6)


def test_dividing_by_subdivisions_would_be_wrong_on_an_uneven_split() -> None:
    """The common recipe (mean of the S sub-batch means) differs from the true gradient when B=10, S=3."""
    model = dense_model()
    x, y = make_data(10)
    variables = model.trainable_variables
    means_of_parts = []
    for start, end in [(0, 3), (3, 6), (6, 10)]:
        with tf.GradientTape() as tape:
            part_loss = tf.reduce_mean(sparse_categorical_crossentropy(y[start:end], model(x[start:end])))
        means_of_parts.append(tape.gradient(part_loss, variables))
    naive = [np.mean([g[i].numpy() for g in means_of_parts], axis=0) for i in range(len(variables))]
    exact, _, _ = make_gradient_fn(model, sparse_categorical_crossentropy, 3)(tf.constant(x), tf.constant(y))
    assert max_difference(naive, [g.numpy() for g in exact]) > 1e-4


@pytest.mark.slow
def test_regularization_losses_count_once_per_batch() -> None:
    reference = plain_weights(10, regularized=True)
    weights, _, _ = train_weights(3, batch_size=10, regularized=True)
    assert max_difference(reference, weights) < 1e-5


def test_optimizer_steps_once_per_batch() -> None:
    # 23 samples, batch 10, 2 epochs: 3 batches per epoch (10, 10, 3) = 6 updates, not 6 x 4 sub-batches.
    _, updates = shared_training(4, 10)
    assert updates == 6


@pytest.mark.slow
def test_gradient_clipping_applies_to_the_batch_gradient() -> None:
    # Clipping each sub-batch's gradient separately would give a different update.
    def clipped() -> keras.optimizers.Optimizer:
        return keras.optimizers.SGD(0.5, global_clipnorm=0.05)

    # 20 samples: whole batches alone, one trace per run (the short batch's cut is the tests' above).
    reference, _, _ = train_weights(1, batch_size=10, samples=20, make_optimizer=clipped)
    weights, _, _ = train_weights(4, batch_size=10, samples=20, make_optimizer=clipped)
    assert max_difference(reference, weights) < 1e-5


def test_learning_rate_schedule_counts_batches() -> None:
    def scheduled() -> keras.optimizers.Optimizer:
        schedule = keras.optimizers.schedules.PiecewiseConstantDecay([5, 7], [0.1, 0.01, 0.001])
        return keras.optimizers.SGD(schedule)

    # 3 epochs of two whole batches of 10 (one trace): 6 batches put the schedule in its middle piece; counting
    # the 30 sub-batches would reach the last one.
    _, optimizer, _ = train_weights(5, batch_size=10, samples=20, epochs=3, make_optimizer=scheduled)
    assert int(optimizer.iterations.numpy()) == 6
    assert float(optimizer.learning_rate) == pytest.approx(0.01)


@pytest.mark.slow
def test_xla_compiled_sub_batches_give_the_same_training() -> None:
    # S=4 cuts the batches of 10 unevenly (3-3-2-2) and the last batch of 3 into fewer than S: one XLA compile
    # per batch shape is the test's cost, so one S covers both cuts.
    reference = plain_weights(10)
    weights, _, _ = train_weights(4, batch_size=10, jit_compile=True)
    assert max_difference(reference, weights) < 1e-5


def test_one_compiled_call_per_batch_and_no_python_per_sub_batch() -> None:
    """Over epochs ending in a short batch, the step traces twice and Python never runs per sub-batch."""
    model = dense_model()
    optimizer = OPTIMIZERS["adam"]()
    python_loss_calls = 0

    def counting_loss(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        nonlocal python_loss_calls
        python_loss_calls += 1  # Python runs this only while tracing; compiled calls do not come back here.
        return sparse_categorical_crossentropy(labels, logits)

    step = make_train_step(model, counting_loss, optimizer, 4)
    x, y = make_data(23)
    feeder = Feeder(ArraySource(x, y), [10, 10, 3], seed=0, shuffle=True)
    calls = 0
    traces = []
    for epoch in range(3):
        for x_batch, y_batch in feeder.epoch(epoch):
            step(x_batch, y_batch)
            calls += 1
        traces.append(step.compiled.experimental_get_tracing_count())
    # At most one trace for the full batches and one for the short batch, all in the first epoch.
    assert traces[0] <= 2 and traces == [traces[0]] * 3
    assert calls == int(optimizer.iterations.numpy()) == 9
    # The 9 calls ran 3 x (4 + 4 + 3) = 33 sub-batches; Python saw the loss only while tracing loop bodies: for
    # the full batches (static shape) one loop per sub-batch size (2 and 3 samples), for the short batch one.
    assert python_loss_calls == 3


def test_a_non_finite_batch_is_not_applied() -> None:
    model = dense_model()
    optimizer = OPTIMIZERS["adam"]()
    step = make_train_step(model, sparse_categorical_crossentropy, optimizer, 3)
    x, y = make_data(10)
    before = [v.numpy() for v in model.trainable_variables]
    poisoned = x.copy()
    poisoned[4, 0] = np.inf
    applied = step(tf.constant(poisoned), tf.constant(y)).applied
    assert not bool(applied) and int(optimizer.iterations.numpy()) == 0
    assert max_difference(before, [v.numpy() for v in model.trainable_variables]) == 0
    applied = step(tf.constant(x), tf.constant(y)).applied
    assert bool(applied) and int(optimizer.iterations.numpy()) == 1


def test_subdivisions_must_be_positive() -> None:
    x, y = make_data(10)
    accumulate = make_gradient_fn(dense_model(), sparse_categorical_crossentropy, 0)
    with pytest.raises(ValueError, match="subdivisions must be >= 1, got 0"):
        accumulate(tf.constant(x), tf.constant(y))


# --- streamed sub-batches: one compiled call each, one update per batch --------------------------------------


def train_streamed(subdivisions: int, batch_size: int, samples: int = 23, epochs: int = 2, regularized: bool = False):
    """As :func:`train_weights`, but each batch's sub-batches are fed one call at a time."""
    model = dense_model(regularized=regularized)
    optimizer = OPTIMIZERS["adam"]()
    step = make_train_step(model, sparse_categorical_crossentropy, optimizer, subdivisions, feed=Feed.SUB_BATCH)
    x, y = make_data(samples)
    losses = []
    for _ in range(epochs):
        for start in range(0, samples, batch_size):
            n = min(batch_size, samples - start)
            offsets = np.cumsum([start, *sub_batch_sizes(n, subdivisions)])
            chunks = [(tf.constant(x[a:b]), tf.constant(y[a:b])) for a, b in itertools.pairwise(offsets)]
            result = step.train_batch(iter(chunks), n)
            assert bool(result.applied)
            losses.append(float(result.loss_sum))
    return [v.numpy() for v in model.trainable_variables], optimizer, losses


@pytest.mark.slow
@pytest.mark.parametrize(("subdivisions", "regularized"), [(1, False), (3, True), (4, True)])
def test_streamed_sub_batches_equal_the_whole_batch(subdivisions: int, regularized: bool) -> None:
    # Batches of 10, 10 and 3 cut 3 or 4 ways: uneven sub-batches, and a last batch smaller than S. The
    # regularization is added by each sub-batch, weighted by its samples, so it is checked where the sub-batches
    # are several and uneven; S=1 streams each batch as one chunk.
    reference = plain_weights(10, regularized=regularized)
    weights, optimizer, losses = train_streamed(subdivisions, batch_size=10, regularized=regularized)
    assert max_difference(reference, weights) < 1e-5
    assert int(optimizer.iterations.numpy()) == 6  # one update per batch, not per sub-batch
    model = dense_model(regularized=regularized)
    x, y = make_data(23)
    first = sparse_categorical_crossentropy(tf.constant(y[:10]), model(tf.constant(x[:10]))).numpy().sum()
    # The logged loss is the objective: each of the batch's 10 samples carries the regularization.
    regularization = float(sum(model.losses)) if regularized else 0.0
    assert regularization > 0 or not regularized
    assert losses[0] == pytest.approx(float(first) + 10 * regularization, rel=1e-5)


def test_a_streamed_batch_with_a_non_finite_sub_batch_is_skipped_and_its_metrics_put_back() -> None:
    from accumrun.core.losses import Metric, Objective

    model = dense_model()
    optimizer = OPTIMIZERS["adam"]()
    accuracy = Metric("accuracy", keras.metrics.SparseCategoricalAccuracy, sparse=True)
    metrics = Objective(sparse_categorical_crossentropy, metrics=(accuracy,)).new_metrics()
    assert metrics.variables
    step = make_train_step(model, sparse_categorical_crossentropy, optimizer, 2, metrics=metrics, feed=Feed.SUB_BATCH)
    x, y = make_data(10)

    def halves(x: np.ndarray) -> list[tuple[tf.Tensor, tf.Tensor]]:
        return [(tf.constant(x[:5]), tf.constant(y[:5])), (tf.constant(x[5:]), tf.constant(y[5:]))]

    step.train_batch(halves(x), 10)
    counted = [v.numpy().copy() for v in metrics.variables]
    before = [v.numpy() for v in model.trainable_variables]
    poisoned = x.copy()
    poisoned[7, 0] = np.nan
    applied = step.train_batch(halves(poisoned), 10).applied
    assert not bool(applied) and int(optimizer.iterations.numpy()) == 1
    assert max_difference(before, [v.numpy() for v in model.trainable_variables]) == 0
    for kept, variable in zip(counted, metrics.variables, strict=True):
        np.testing.assert_array_equal(kept, variable.numpy())
    with pytest.raises(ValueError, match="a streamed batch needs at least one sub-batch"):
        step.train_batch([], 10)


@pytest.mark.slow
@pytest.mark.parametrize(("batch", "subdivisions"), [(10, 3), (10, 4), (3, 5), (7, 1)])
def test_the_static_and_the_dynamic_cut_take_the_rows_of_the_rule(batch: int, subdivisions: int) -> None:
    """Whether the batch's size is known at tracing or not, the sub-batches are the rule's rows, each once."""
    x = tf.reshape(tf.range(batch * 2), (batch, 2))
    y = tf.range(batch)
    sizes = sub_batch_sizes(batch, subdivisions)
    expected = [(int(start), int(start) + size) for start, size in zip(np.cumsum([0, *sizes[:-1]]), sizes, strict=True)]

    def rows(x: tf.Tensor, y: tf.Tensor, static: bool) -> tf.Tensor:
        found = tf.TensorArray(tf.int32, size=0, dynamic_size=True)
        for loop in sub_batch_loops(x, y, subdivisions):
            assert loop.static == static
            for i in loop.indices:
                x_sub, y_sub, first_row = loop.take(i)
                tf.debugging.assert_equal(x_sub[:, 0], 2 * y_sub)
                found = found.write(found.size(), tf.stack([first_row, first_row + tf.shape(y_sub)[0]]))
        return found.stack()

    static = tf.function(lambda x, y: rows(x, y, static=True))(x, y)
    spec = [tf.TensorSpec([None, 2], tf.int32), tf.TensorSpec([None], tf.int32)]
    dynamic = tf.function(lambda x, y: rows(x, y, static=False), input_signature=spec)(x, y)
    assert sorted(map(tuple, static.numpy().tolist())) == expected
    assert [tuple(pair) for pair in dynamic.numpy().tolist()] == expected
