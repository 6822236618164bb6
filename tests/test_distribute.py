"""Training across replicas (tf.distribute) equals training on one device.

The replicas are the two logical CPUs that tests/conftest.py splits the host CPU into, under the session's one
MirroredStrategy (``mirrored_strategy``), in this process: the replicated train step against the one-device step
without subdivisions, batch by batch, and L-BFGS's full batch through ``train`` to scikit-learn's solution; a
language model's bucketed windows on replicas are tests/test_lm.py's. Only the command line's run needs a fresh
process: there it is the command that splits the CPU.

The tolerances bound float32 sums taken in another order (each replica sums its own samples, the all-reduce adds
the two; Higham: a sum of n terms is within n * 2^-24 = n * 6e-8 of the sum of their magnitudes):
- weights, replicas against one device (1e-5): a gradient entry is the mean of n = 9 per-sample terms whose sizes
  average below 2 (inputs of unit scale, a softmax residual below 1, balanced class weights up to 2, dropout's scale
  2 with a residual through small weights), within 9 * 6e-8 * 2 = 1.1e-6 in either order. SGD at 0.2 with momentum
  0.5 moves a weight by at most 0.2 / (1 - 0.5) = 0.4 times that, 4.3e-7 per update; at most 6 updates, each carrying
  the earlier difference on by at most 1 + 0.4 * L (L, the gradient's Lipschitz constant, below 0.5 for this shallow
  model at its small weights: 1.2^6 < 3), give 6 * 4.3e-7 * 3 = 7.7e-6 in the worst case. Adam's steps are its
  rate, 0.02, times the gradient over its running root mean square, of the same relative error: far less. The
  dropout runs (4 updates, 1.2^4 < 2.1: 3.6e-6) are held to 2e-5;
- BatchNorm's moving statistics (1e-5): moments of 9 samples of second moment about 13, within 9 * 6e-8 * 13 = 7e-6,
  of which each of 3 updates takes 0.01: 2.1e-7;
- the noise estimates against float64 formulas: each squared norm of a (sub-)batch mean gradient is within 3.3e-6 of
  its value relative (from this data's gradients: 2 * n * 6e-8 * sum |mean| * mean |term|, over the squared norm, plus
  the 21 entries' squares' sum); tr(S) subtracts two such sums that cancel by a factor 1.5 (5.1e-6: 1e-5 holds it),
  and |G|^2 = |mean|^2 - tr(S) / B cancels by a factor 9.8 (4.8e-5: held to 1e-4).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.linear_model import LogisticRegression

from accumrun import train
from accumrun.config.schema import DistributeConfig
from accumrun.core.batch_norm import BatchNormStatistics
from accumrun.core.losses import Objective, sparse_categorical_crossentropy
from accumrun.core.noise import GradientNoise
from accumrun.core.seeds import LayerDraws
from accumrun.core.step import WholeBatchStep, make_train_step
from accumrun.core.sub_batches import sub_batch_sizes
from accumrun.core.targets import as_targets
from accumrun.core.updates import UpdateLoop
from accumrun.errors import ConfigError
from accumrun.kinds import BatchNormMode, RandomDraws
from accumrun.models.mlp import mlp
from accumrun.training.distribute import create_strategy
from tests.conftest import REPLICAS
from tests.helpers import contiguous, max_difference, reference_estimates, run_cli, softmax_gradients
from tests.test_lbfgs import amplified_rounding, logistic_terms, standardized_breast_cancer, table_config, write_csv

REPO = Path(__file__).resolve().parent.parent
# A guard against a hung command, not a speed limit: its ~15 s of CPU took over 300 s on 2 cores shared with a load
# of 17 (other TensorFlow processes).
CLI_TIMEOUT = 900

Strategy = tf.distribute.Strategy

# 19 samples of 6 features in 3 classes, in batches of 9, 9 and 1: two replicas split a batch of 9 unevenly (4 and
# 5 samples) and the last batch into 0 and 1.
_rng = np.random.default_rng(5)
X = _rng.normal(size=(19, 6)).astype(np.float32)
Y = _rng.integers(3, size=19).astype(np.int32)
# training.class_weight: balanced, one weight per sample: n / (classes x the class's count).
BALANCED = (len(Y) / (3 * np.bincount(Y, minlength=3)[Y])).astype(np.float32)
EPOCHS = 2
BATCHES = [(0, 9), (9, 18), (18, 19)] * EPOCHS
OPTIMIZERS = {"sgd": lambda: keras.optimizers.SGD(0.2, momentum=0.5), "adam": lambda: keras.optimizers.Adam(0.02)}
OBJECTIVE = Objective(sparse_categorical_crossentropy, outputs=3)


def scope(strategy: Strategy | None) -> contextlib.AbstractContextManager[Any]:
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def built(strategy: Strategy | None, optimizer: str, dropout: float = 0.0) -> tuple[keras.Model, Any]:
    """The MLP (16 hidden units, no BatchNorm) and its optimizer, seeded alike on one device and on replicas."""
    with scope(strategy):
        keras.utils.set_random_seed(5)
        return mlp((6,), 3, [16], dropout=dropout), OPTIMIZERS[optimizer]()


def stepped(
    strategy: Strategy | None,
    optimizer: str,
    subdivisions: int,
    *,
    weights: np.ndarray | None = None,
    batches: list[tuple[int, int]] = BATCHES,
    dropout: float = 0.0,
    draws: RandomDraws = RandomDraws.PER_SAMPLE,
) -> keras.Model:
    """The model after one step per batch of ``batches`` (rows of X), its samples weighted by ``weights``."""
    model, made = built(strategy, optimizer, dropout)
    step = make_train_step(
        model, OBJECTIVE, made, subdivisions, strategy=strategy, draws=LayerDraws(model, made.iterations, draws)
    )
    for start, stop in batches:
        step(tf.constant(X[start:stop]), as_targets(Y[start:stop], None if weights is None else weights[start:stop]))
    assert int(made.iterations.numpy()) == len(batches)
    return model


def local_copies(strategy: Strategy, model: keras.Model) -> list[tuple[np.ndarray, ...]]:
    """Each variable's copy on every replica."""
    return [tuple(c.numpy() for c in strategy.experimental_local_results(v.value)) for v in model.variables]


@pytest.fixture(scope="module")
def runs(mirrored_strategy: Strategy) -> Any:
    """``runs(optimizer, subdivisions)``: the model after the batches, on one device (``subdivisions`` 1) or on the
    replicas, each run once per module: sgd on class-weighted samples, adam on plain ones."""
    made: dict[tuple[str, int, bool], keras.Model] = {}

    def run(optimizer: str, subdivisions: int, replicated: bool = True) -> keras.Model:
        key = (optimizer, subdivisions, replicated)
        if key not in made:
            weights = BALANCED if optimizer == "sgd" else None
            strategy = mirrored_strategy if replicated else None
            made[key] = stepped(strategy, optimizer, subdivisions, weights=weights)
        return made[key]

    return run


@pytest.mark.slow
@pytest.mark.parametrize(("optimizer", "subdivisions"), [("sgd", 1), ("sgd", 3), ("adam", 3)])
def test_mirrored_on_two_logical_cpus_equals_one_device_without_subdivisions(
    mirrored_strategy: Strategy, runs: Any, optimizer: str, subdivisions: int
) -> None:
    # S=1 checks the replicas alone; S=3 both together (adam too: its moments see the summed gradient). The sgd runs
    # weigh their samples by class (balanced): the weights travel with the targets into each replica's slice (4 + 5
    # samples, then 0 + 1).
    model = runs(optimizer, subdivisions)
    assert max_difference(model.get_weights(), runs(optimizer, 1, replicated=False).get_weights()) < 1e-5
    # Every replica's copy of the variables got the same update.
    assert all(max_difference([a], [b]) == 0 for a, b in local_copies(mirrored_strategy, model))
    # Guards against passing on weights that never moved.
    assert max_difference(model.get_weights(), built(None, optimizer)[0].get_weights()) > 1e-2


@pytest.mark.slow
def test_several_updates_per_call_equal_one_per_call_on_replicas(mirrored_strategy: Strategy, runs: Any) -> None:
    # Adam with 3 sub-batches on the replicas: calls of two full batches, then the short one, every replica in step,
    # bit for bit the weights of one update per call (the test above's run).
    one_per_call = runs("adam", 3).get_weights()
    model, optimizer = built(mirrored_strategy, "adam")
    with mirrored_strategy.scope():
        metrics = OBJECTIVE.new_metrics()
    step = make_train_step(model, OBJECTIVE, optimizer, 3, strategy=mirrored_strategy, metrics=metrics)
    assert isinstance(step, WholeBatchStep)
    x, y = tf.constant(X), tf.constant(Y)
    loop = UpdateLoop(step, x, y, optimizer=optimizer, metrics=metrics, stop_on_nonfinite=True)
    for _ in range(EPOCHS):
        loop(np.arange(18).reshape(2, 9), np.array([True, False]), np.array([False, False]))
        loop(np.array([[18]]), np.array([False]), np.array([True]))
    assert int(optimizer.iterations.numpy()) == len(BATCHES)
    assert max_difference(model.get_weights(), one_per_call) == 0


@pytest.mark.slow
def test_dropout_on_two_replicas_with_subdivisions_equals_one_device_without(mirrored_strategy: Strategy) -> None:
    # Dropout 0.5, two batches of 9 per epoch (4 + 5 samples on the replicas, each in 3 sub-batches). Each sample
    # draws its mask by its row in the global batch, whichever replica and sub-batch holds it.
    full = BATCHES[:2] * EPOCHS
    one_device = stepped(None, "sgd", 1, batches=full, dropout=0.5).get_weights()
    per_sample = stepped(mirrored_strategy, "sgd", 3, batches=full, dropout=0.5)
    assert max_difference(per_sample.get_weights(), one_device) < 2e-5
    # The control: drawn per sub-batch (and per replica), the masks and so the run differ from the same one device's.
    per_sub_batch = stepped(mirrored_strategy, "sgd", 3, batches=full, dropout=0.5, draws=RandomDraws.PER_SUB_BATCH)
    assert max_difference(per_sub_batch.get_weights(), one_device) > 1e-2


def _input_bn_model() -> keras.Model:
    keras.utils.set_random_seed(7)
    inputs = keras.Input((6,))
    x = keras.layers.BatchNormalization(name="input_bn")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3)(x))


@pytest.mark.slow
def test_per_batch_statistics_are_those_of_the_global_batch_on_every_replica(mirrored_strategy: Strategy) -> None:
    """An input BatchNorm's moving statistics after 3 batches of 9 (4 + 5 samples per replica, each in 2
    sub-batches), in ``per_batch`` mode against one device's (whole batches); in ``sub_batch`` mode, the control,
    each replica's own sub-batches move its own copy."""
    rng = np.random.default_rng(3)
    data = [
        (tf.constant(rng.normal(2.0, 3.0, (9, 6)), tf.float32), tf.constant(rng.integers(3, size=9), tf.int32))
        for _ in range(3)
    ]
    one = _input_bn_model()
    statistics = BatchNormStatistics(one, BatchNormMode.PER_BATCH)
    step = make_train_step(one, sparse_categorical_crossentropy, keras.optimizers.SGD(0.1), 1, batch_norm=statistics)
    for x, y in data:
        step(x, y)
    reference = one.get_layer("input_bn")
    expected = np.concatenate([reference.moving_mean.numpy(), reference.moving_variance.numpy()])
    assert np.max(np.abs(expected - np.concatenate([np.zeros(6), np.ones(6)]))) > 1e-2
    copies = {}
    for mode in (BatchNormMode.PER_BATCH, BatchNormMode.SUB_BATCH):
        with mirrored_strategy.scope():
            model = _input_bn_model()
            optimizer = keras.optimizers.SGD(0.1)
        statistics = BatchNormStatistics(model, mode, mirrored_strategy)
        step = make_train_step(
            model, sparse_categorical_crossentropy, optimizer, 2, strategy=mirrored_strategy, batch_norm=statistics
        )
        for x, y in data:
            step(x, y)
        layer = model.get_layer("input_bn")
        means = mirrored_strategy.experimental_local_results(layer.moving_mean.value)
        variances = mirrored_strategy.experimental_local_results(layer.moving_variance.value)
        copies[mode] = [np.concatenate([m.numpy(), v.numpy()]) for m, v in zip(means, variances, strict=True)]
    per_batch, sub_batch = copies[BatchNormMode.PER_BATCH], copies[BatchNormMode.SUB_BATCH]
    assert np.max(np.abs(per_batch[0] - expected)) < 1e-5
    assert np.max(np.abs(per_batch[0] - per_batch[1])) == 0.0
    assert np.max(np.abs(sub_batch[0] - sub_batch[1])) > 1e-3


@pytest.mark.slow
def test_the_noise_estimates_on_two_replicas_equal_the_formulas(mirrored_strategy: Strategy) -> None:
    # A batch of 10: 5 samples on each replica, each cut into sub-batches of 1, 2 and 2 (P = 6); the formulas' values
    # from the same 6 sub-batches, of a linear softmax model's closed-form gradients.
    rng = np.random.default_rng(2)
    x = rng.normal(size=(10, 6)).astype(np.float32)
    y = np.array([0, 0, 0, 1, 0, 0, 2, 0, 0, 0], np.int32)
    with mirrored_strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(0.1)
    kernel, bias = (v.numpy().astype(np.float64) for v in model.trainable_variables)
    step = make_train_step(
        model, sparse_categorical_crossentropy, optimizer, 3, strategy=mirrored_strategy, observers=(GradientNoise(),)
    )
    sq_norm, trace, valid = step(tf.constant(x), tf.constant(y)).measures.numpy()
    sub_batches = [rows for start in (0, 5) for rows in contiguous(sub_batch_sizes(5, 3), start)]
    expected_sq_norm, expected_trace = reference_estimates(softmax_gradients(kernel, bias, x, y), sub_batches)
    assert valid == 1.0
    assert sq_norm == pytest.approx(expected_sq_norm, rel=1e-4)  # the bounds: top of the file
    assert trace == pytest.approx(expected_trace, rel=1e-5)


# Op types that sum across replicas: TensorFlow's collectives (CPU and GPU) and NCCL.
REDUCTION_OPS = {"CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3", "NcclAllReduce"}
LOOP_OPS = {"While", "StatelessWhile"}
BRANCH_OPS = {"If", "StatelessIf"}


def count_reductions(strategy: Strategy, subdivisions: int) -> dict[str, int]:
    """Cross-replica reductions in the traced step: in all, inside loop bodies (where they would run once per
    sub-batch) and inside the branch that applies the update."""
    with strategy.scope():
        model = mlp((6,), 3, [16])
        optimizer = keras.optimizers.Adam(0.01)
        step = make_train_step(model, sparse_categorical_crossentropy, optimizer, subdivisions, strategy=strategy)
    assert isinstance(step, WholeBatchStep)
    graph = step.compiled.get_concrete_function(  # type: ignore[attr-defined]
        tf.TensorSpec([None, 6], tf.float32), tf.TensorSpec([None], tf.int32)
    ).graph.as_graph_def()
    library = {function.signature.name: function for function in graph.library.function}
    counts = {"total": 0, "in_loops": 0, "in_branches": 0}
    for op, in_loop, in_branch in _ops(graph.node, library, in_loop=False, in_branch=False):
        if op in REDUCTION_OPS:
            counts["total"] += 1
            counts["in_loops"] += in_loop
            counts["in_branches"] += in_branch
    return counts


def _ops(nodes: Any, library: dict[str, Any], in_loop: bool, in_branch: bool) -> Iterator[tuple[str, bool, bool]]:
    """Every op reachable from ``nodes``, following function calls (loop bodies, branches, nested functions) as
    often as they are called, with whether it lies inside a loop and inside a branch."""
    for node in nodes:
        yield node.op, in_loop, in_branch
        for value in node.attr.values():
            names = [value.func.name] if value.HasField("func") else [f.name for f in value.list.func]
            for name in names:
                if name in library:
                    loop, branch = in_loop or node.op in LOOP_OPS, in_branch or node.op in BRANCH_OPS
                    yield from _ops(library[name].node_def, library, loop, branch)


@pytest.mark.slow
def test_one_gradient_all_reduce_per_batch_whatever_the_subdivisions(mirrored_strategy: Strategy) -> None:
    """The traced step holds the same reductions for 1 and 4 sub-batches, and none inside the sub-batch loop.

    A reduction is one collective op per replica. Outside the update branch there is one (the loss sum and the
    non-finite flag, stacked); inside it, the optimizer's sum of the gradients.
    """
    one, four = (count_reductions(mirrored_strategy, subdivisions) for subdivisions in (1, 4))
    assert one == four
    assert one["in_loops"] == 0
    assert one["total"] - one["in_branches"] == REPLICAS
    assert one["in_branches"] >= REPLICAS


MIRRORED = {"strategy": "mirrored", "logical_cpus": REPLICAS}


@pytest.mark.slow
def test_lbfgs_on_two_replicas_meets_scikit_learn(mirrored_strategy: Strategy, tmp_path: Path) -> None:
    # Full-batch L-BFGS on two replicas with 3 sub-batches each, each evaluation's gradient summed over the replicas
    # as Keras sums any optimizer's: the logistic regression of tests/test_lbfgs.py, to scikit-learn's solution
    # within the bound of float32's rounding amplified by the inverse Hessian there (the replicas' sums round in
    # another order, within the same bound).
    x, y = standardized_breast_cancer()
    reference = LogisticRegression(C=1.0, tol=1e-10, max_iter=10_000).fit(x, y)
    solution = np.concatenate([reference.coef_[0], reference.intercept_])
    tolerance = amplified_rounding(*logistic_terms(solution))
    config = table_config(
        write_csv(tmp_path / "cancer.csv", x, y),
        tmp_path / "run",
        task="binary",
        epochs=2 * int(reference.n_iter_[0]),
        l2=1 / (2 * len(x)),
        training={"subdivisions": 3},
        optimizer={"tolerance_grad": 0.0, "tolerance_change": 0.0},
        distribute=MIRRORED,
    )
    result = train(config, quiet=True, strategy=mirrored_strategy)
    kernel, bias = result.model.get_weights()
    np.testing.assert_allclose(np.concatenate([kernel[:, 0], bias]), solution, rtol=0, atol=tolerance)
    assert [row["replicas"] for row in result.metrics] == [REPLICAS] * len(result.metrics)
    assert [row["optimizer_steps"] for row in result.metrics] == list(range(1, len(result.metrics) + 1))


@pytest.fixture(scope="module")
def command_line(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``accumrun train configs/digits.yaml`` mirrored on two logical CPUs for one epoch, in a fresh process: there
    the command splits the CPU before TensorFlow creates its devices. Its exit code, output, last metrics row and
    whether it saved the model."""
    run = tmp_path_factory.mktemp("digits") / "run"
    arguments = ["train", str(REPO / "configs" / "digits.yaml"), "--set", "distribute.strategy=mirrored"]
    arguments += ["--set", f"distribute.logical_cpus={REPLICAS}", "--epochs", "1", "--run-dir", str(run)]
    result = run_cli(*arguments, cwd=REPO, timeout=CLI_TIMEOUT)
    metrics = run / "metrics.jsonl"
    return {
        "exit_code": result.returncode,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "row": json.loads(metrics.read_text().splitlines()[-1]) if metrics.is_file() else None,
        "model_saved": (run / "model.keras").is_file(),
    }


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_digits_config_trains_mirrored_on_two_logical_cpus_from_the_command_line(
    command_line: dict[str, Any],
) -> None:
    result = command_line
    assert result["exit_code"] == 0, result["stderr"]
    assert "distribute mirrored: 2 replicas on CPU:0, CPU:1" in result["stdout"]
    assert (
        "batch 64 = 2 replicas x 32 samples, each in 4 sub-batches x 8 samples; 26 updates per epoch"
        in result["stdout"]
    )
    row = result["row"]
    assert row["replicas"] == 2 and row["sub_batch_size"] == 8 and row["optimizer_steps"] == 26
    assert result["model_saved"]


def test_multi_worker_without_a_cluster_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    with pytest.raises(ConfigError, match=r"^distribute\.cluster: multi_worker needs a cluster: set TF_CONFIG, run as"):
        create_strategy(DistributeConfig(strategy="multi_worker"))
    with pytest.raises(ConfigError, match=r"TF_CONFIG environment variable, which is not set"):
        create_strategy(DistributeConfig(strategy="multi_worker", cluster="tf_config"))


@pytest.mark.parametrize(
    ("tf_config", "message"),
    [
        ("{not json", "TF_CONFIG: is not valid JSON"),
        ('{"task": {"type": "worker", "index": 0}}', 'TF_CONFIG: needs "cluster"'),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}', 'TF_CONFIG: needs "task"'),
        ('{"cluster": {"worker": ["a:1"], "ps": ["b:2"]}, "task": {"type": "worker", "index": 0}}', "only 'chief'"),
    ],
)
def test_a_bad_tf_config_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tf_config: str, message: str) -> None:
    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(ConfigError, match=message):
        create_strategy(DistributeConfig(strategy="multi_worker"))
