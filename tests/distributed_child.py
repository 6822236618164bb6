"""Mirrored training on two logical CPUs, measured in a fresh interpreter for tests/test_distribute.py.

The CPU can only be split before TensorFlow creates its devices, which the test process has long done, so
``python -m tests.distributed_child OUT.json`` (from the repository root) does the measuring and writes the
numbers to OUT.json. First, before anything else touches TensorFlow, ``accumrun train`` on the digits config,
mirrored, from the command line (in this process: one TensorFlow start for everything); then, for each optimizer and
subdivision count, how far the mirrored run's final weights are from the single-device run's without subdivisions;
and, for several subdivision counts, the cross-replica reductions in the step's graph.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from click.testing import CliRunner

from accumrun import train
from accumrun.cli import main as command_line
from accumrun.config.schema import Config, DistributeConfig
from accumrun.core.batch_norm import BatchNormStatistics
from accumrun.core.losses import sparse_categorical_crossentropy
from accumrun.core.noise import GradientNoise
from accumrun.core.step import make_train_step
from accumrun.core.sub_batches import sub_batch_sizes
from accumrun.data.examples import write_corpus
from accumrun.kinds import BatchNormMode, RandomDraws
from accumrun.models.mlp import mlp
from accumrun.training import distribute
from accumrun.training.distribute import create_strategy
from tests.helpers import contiguous, reference_estimates, softmax_gradients

REPO = Path(__file__).resolve().parent.parent
REPLICAS = 2
# The command line's, kept by main() (importing TensorFlow above creates no devices yet).
STRATEGY: tf.distribute.Strategy

OPTIMIZERS = {
    "sgd": {"name": "sgd", "learning_rate": 0.2, "momentum": 0.5},
    "adam": {"name": "adam", "learning_rate": 0.02},
}
# Op types that sum across replicas: TensorFlow's collectives (CPU and GPU) and NCCL.
REDUCTION_OPS = {"CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3", "NcclAllReduce"}
LOOP_OPS = {"While", "StatelessWhile"}
BRANCH_OPS = {"If", "StatelessIf"}


def config(optimizer: str, subdivisions: int, strategy: str, class_weight: str | None = None) -> Config:
    """A BatchNorm-free MLP on 19 training samples in batches of 9: 9, 9 and a last batch of 1 (weighted by
    ``class_weight`` when given).

    Two replicas split a batch of 9 unevenly (4 and 5 samples) and the last batch into 0 and 1. Nothing is held out:
    the comparisons read the weights, and validation on replicas is the command line run's (one evaluation step
    less to trace in each run).
    """
    distribute = {"strategy": strategy, "logical_cpus": REPLICAS} if strategy == "mirrored" else {}
    return Config.model_validate(
        {
            "seed": 5,
            "data": {"name": "synthetic", "samples": 19, "shape": [6], "classes": 3, "validation_split": 0.0},
            "model": {"name": "mlp", "hidden": [16]},
            "training": {"epochs": 2, "batch_size": 9, "subdivisions": subdivisions, "class_weight": class_weight},
            "optimizer": OPTIMIZERS[optimizer],
            "output": {"tensorboard": False},
            "distribute": distribute,
        }
    )


def compare_weights(
    optimizer: str, subdivisions: tuple[int, ...], folder: Path, class_weight: str | None = None
) -> tuple[dict[int, dict[str, Any]], dict[int, list[np.ndarray]]]:
    """Train the config on one device without subdivisions, then on two replicas with each of ``subdivisions``;
    compare each mirrored run's final weights with the one device's. Also returns the mirrored runs' weights."""
    single = train(config(optimizer, 1, "none", class_weight), folder / "single", quiet=True)
    initial = [v.numpy() for v in _fresh_model().trainable_variables]
    results, weights = {}, {}
    for count in subdivisions:
        run = folder / f"mirrored-{count}"
        mirrored = train(config(optimizer, count, "mirrored", class_weight), run, quiet=True, strategy=STRATEGY)
        final = [v.numpy() for v in mirrored.model.trainable_variables]
        # Each replica holds its own copy of every variable; they must stay identical.
        copies = [STRATEGY.experimental_local_results(v.value) for v in mirrored.model.variables]
        last_row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
        results[count] = {
            "max_difference": _max_difference([v.numpy() for v in single.model.variables], mirrored.model.variables),
            "max_replica_difference": max(_max_difference([c[0]], [c[1]]) for c in copies),
            "moved": _max_difference(initial, final),
            "replicas": last_row["replicas"],
            "optimizer_steps": last_row["optimizer_steps"],
        }
        weights[count] = [v.numpy() for v in mirrored.model.variables]
    return results, weights


def compare_updates_per_call(folder: Path, one_per_call: list[np.ndarray]) -> dict[str, Any]:
    """Train adam with 3 sub-batches mirrored with 4 updates per call; compare the final weights with
    ``one_per_call``, the same run's with one."""
    settings = config("adam", 3, "mirrored")
    training = settings.training.model_copy(update={"updates_per_call": 4})
    settings = settings.model_copy(update={"training": training})
    result = train(settings, folder, quiet=True, strategy=STRATEGY)
    return {"max_difference": _max_difference(one_per_call, [v.numpy() for v in result.model.variables])}


def lbfgs_on_replicas(folder: Path) -> dict[str, Any]:
    """Full-batch L-BFGS, 6 iterations: on one device without subdivisions, and on two replicas with 3 sub-batches
    each (the replicas' gradients summed by Keras as for any optimizer); how far the final weights are apart."""
    runs = {}
    for strategy, subdivisions in (("none", 1), ("mirrored", 3)):
        settings = config("sgd", subdivisions, strategy).model_dump()
        settings["training"].update(epochs=6, batch_size="full")
        settings["optimizer"] = {"name": "lbfgs", "tolerance_grad": 0.0, "tolerance_change": 0.0}
        strategy_given = STRATEGY if strategy == "mirrored" else None
        runs[strategy] = train(Config.model_validate(settings), folder / strategy, quiet=True, strategy=strategy_given)
    last_row = runs["mirrored"].metrics[-1]
    return {
        "max_difference": _max_difference(runs["none"].model.get_weights(), runs["mirrored"].model.get_weights()),
        "replicas": last_row["replicas"],
        "optimizer_steps": last_row["optimizer_steps"],
    }


def _fresh_model() -> keras.Model:
    keras.utils.set_random_seed(5)
    return mlp((6,), 3, [16])


def _max_difference(a: list[Any], b: list[Any]) -> float:
    return max(float(np.max(np.abs(np.asarray(p) - np.asarray(q)))) for p, q in zip(a, b, strict=True))


def count_reductions(subdivisions: int) -> dict[str, int]:
    """Cross-replica reductions in the traced step: in all, inside loop bodies (where they would run once per
    sub-batch) and inside the branch that applies the update."""
    with STRATEGY.scope():
        model = mlp((6,), 3, [16])
        optimizer = keras.optimizers.Adam(0.01)
        step = make_train_step(model, sparse_categorical_crossentropy, optimizer, subdivisions, strategy=STRATEGY)
    graph = step.compiled.get_concrete_function(
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


def _input_bn_model() -> keras.Model:
    keras.utils.set_random_seed(7)
    inputs = keras.Input((6,))
    x = keras.layers.BatchNormalization(name="input_bn")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3)(x))


def batch_norm_across_replicas() -> dict[str, dict[str, float]]:
    """An input BatchNorm's moving statistics after 3 batches of 9 (4 + 5 samples per replica, each in 2
    sub-batches), in ``per_batch`` and ``sub_batch`` mode: how far replica 0's are from one device's (whole batches),
    and the replicas' from each other.

    One device without subdivisions is trained once, in ``per_batch`` mode: the reference of ``per_batch``, the mode
    whose replicas must match one device (``sub_batch``'s replicas are only compared with each other)."""
    rng = np.random.default_rng(3)
    data = [
        (tf.constant(rng.normal(2.0, 3.0, (9, 6)), tf.float32), tf.constant(rng.integers(3, size=9), tf.int32))
        for _ in range(3)
    ]
    one = _input_bn_model()
    step = make_train_step(
        one,
        sparse_categorical_crossentropy,
        keras.optimizers.SGD(0.1),
        1,
        batch_norm=BatchNormStatistics(one, BatchNormMode.PER_BATCH),
    )
    for x, y in data:
        step(x, y)
    reference = one.get_layer("input_bn")
    expected = np.concatenate([reference.moving_mean.numpy(), reference.moving_variance.numpy()])
    results = {}
    for mode in (BatchNormMode.PER_BATCH, BatchNormMode.SUB_BATCH):
        with STRATEGY.scope():
            model = _input_bn_model()
            optimizer = keras.optimizers.SGD(0.1)
        statistics = BatchNormStatistics(model, mode, STRATEGY)
        step = make_train_step(
            model, sparse_categorical_crossentropy, optimizer, 2, strategy=STRATEGY, batch_norm=statistics
        )
        for x, y in data:
            step(x, y)
        layer = model.get_layer("input_bn")
        copies = [
            np.concatenate([mean.numpy(), variance.numpy()])
            for mean, variance in zip(
                STRATEGY.experimental_local_results(layer.moving_mean.value),
                STRATEGY.experimental_local_results(layer.moving_variance.value),
                strict=True,
            )
        ]
        results[mode.value] = {
            "to_one_device": float(np.max(np.abs(copies[0] - expected))),
            "between_replicas": float(np.max(np.abs(copies[0] - copies[1]))),
            "moved": float(np.max(np.abs(expected - np.concatenate([np.zeros(6), np.ones(6)])))),
        }
    return results


def noise_on_replicas() -> dict[str, list[float]]:
    """The noise estimates of one batch of 10 on two replicas (5 samples each), each cut into 3 sub-batches, and
    the formulas' values from the same 6 sub-batches, of a linear softmax model's closed-form gradients."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(10, 6)).astype(np.float32)
    y = np.array([0, 0, 0, 1, 0, 0, 2, 0, 0, 0], np.int32)
    with STRATEGY.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(0.1)
    kernel, bias = (v.numpy().astype(np.float64) for v in model.trainable_variables)
    step = make_train_step(
        model, sparse_categorical_crossentropy, optimizer, 3, strategy=STRATEGY, observers=(GradientNoise(),)
    )
    measures = step(tf.constant(x), tf.constant(y)).measures.numpy()
    sub_batches = [rows for start in (0, 5) for rows in contiguous(sub_batch_sizes(5, 3), start)]
    expected = reference_estimates(softmax_gradients(kernel, bias, x, y), sub_batches)
    return {"measures": measures.tolist(), "expected": list(expected)}


def dropout_on_replicas(folder: Path) -> dict[str, float]:
    """An MLP with dropout 0.5: two replicas with 3 sub-batches each against one device without subdivisions (with
    per-sample draws), with per-sample draws and, as the control, per-sub-batch ones.

    The short last batch is dropped (two batches of 9 per epoch, 4 + 5 samples on the replicas): its 0 + 1 split is
    the weights comparisons' business, and each batch size traces the step once more in each of the three runs."""

    def trained(draws: RandomDraws, subdivisions: int, strategy: str) -> list[np.ndarray]:
        settings = config("sgd", subdivisions, strategy)
        model = settings.model.model_copy(update={"dropout": 0.5})
        training = settings.training.model_copy(update={"random_draws": draws, "drop_remainder": True})
        settings = settings.model_copy(update={"model": model, "training": training})
        on = STRATEGY if strategy == "mirrored" else None
        result = train(settings, folder / f"{draws}-{strategy}", quiet=True, strategy=on)
        return [v.numpy() for v in result.model.trainable_variables]

    one_device = trained(RandomDraws.PER_SAMPLE, 1, "none")
    return {draws.value: _max_difference(one_device, trained(draws, 3, "mirrored")) for draws in RandomDraws}


def language_model_on_replicas(folder: Path) -> dict[str, float]:
    """A causal transformer on a corpus whose windows have very different real lengths: two replicas with 3
    sub-batches each and bucketed padding (each batch grouped by length, and each replica's sub-batches cut to
    multiples of 4 tokens) against one device without either. Each replica's slice holds its own count of real
    tokens; both divide by the global batch's.

    The short last batch is dropped (15 batches of 9 windows): each batch size traces the transformer's step once
    more, on each replica; the short windows (each file's last) still fall in the batches kept."""
    corpus = write_corpus(folder / "corpus", 4, seed=4)
    runs = []
    for subdivisions, strategy, bucket in ((1, "none", None), (3, "mirrored", 4)):
        settings = Config.model_validate(
            {
                "seed": 1,
                "data": {
                    "name": "text_corpus",
                    "path": str(corpus),
                    "sequence_length": 16,
                    "validation_split": 0.0,
                    "bucket": bucket,
                },
                "model": {"name": "transformer", "layers": 1, "heads": 2, "width": 16},
                "training": {"epochs": 1, "batch_size": 9, "subdivisions": subdivisions, "drop_remainder": True},
                "optimizer": {"name": "sgd", "learning_rate": 0.5},
                "output": {"tensorboard": False},
                "distribute": {"strategy": strategy, "logical_cpus": REPLICAS} if strategy == "mirrored" else {},
            }
        )
        on = STRATEGY if strategy == "mirrored" else None
        result = train(settings, folder / f"{strategy}-{bucket}", quiet=True, strategy=on)
        runs.append([v.numpy() for v in result.model.trainable_variables])
    return {"max_difference": _max_difference(runs[0], runs[1])}


def train_digits_from_the_command_line(folder: Path) -> tuple[dict[str, Any], tf.distribute.Strategy]:
    """``accumrun train configs/digits.yaml`` mirrored on two logical CPUs for one epoch, run first in this fresh
    process (in it, as the CLI runs in its own): so it is the command that splits the CPU before TensorFlow creates
    its devices. Returns its exit code, output, last metrics row and whether it saved the model; and the strategy
    the command made, for the rest of this process (a second MirroredStrategy in one process would reuse the
    first one's collective keys)."""
    made = []

    def kept(config: DistributeConfig) -> tf.distribute.Strategy | None:
        made.append(create_strategy(config))
        return made[-1]

    run = folder / "digits"
    arguments = ["train", str(REPO / "configs" / "digits.yaml"), "--set", "distribute.strategy=mirrored"]
    arguments += ["--set", f"distribute.logical_cpus={REPLICAS}", "--epochs", "1", "--run-dir", str(run)]
    # The command imports create_strategy when it runs, from its module: the real one, watched.
    distribute.create_strategy = kept
    try:
        result = CliRunner().invoke(command_line, arguments, prog_name="accumrun")
    finally:
        distribute.create_strategy = create_strategy
    metrics = run / "metrics.jsonl"
    outcome = {
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "row": json.loads(metrics.read_text().splitlines()[-1]) if metrics.is_file() else None,
        "model_saved": (run / "model.keras").is_file(),
    }
    strategy = made[0] if made else None
    assert strategy is not None, outcome
    return outcome, strategy


def main(out: Path) -> None:
    global STRATEGY
    results: dict[str, Any] = {"weights": {}, "reductions": {}}
    with tempfile.TemporaryDirectory() as folder:
        results["command_line"], STRATEGY = train_digits_from_the_command_line(Path(folder))
    results["batch_norm"] = batch_norm_across_replicas()
    results["noise"] = noise_on_replicas()
    with tempfile.TemporaryDirectory() as folder:
        # S=1 mirrored checks the replicas alone; S=3 both together (adam too: its moments see the summed gradient).
        # The sgd runs weigh their samples by class (balanced): the weights are dealt out with the targets.
        for optimizer, counts, class_weight in (("sgd", (1, 3), "balanced"), ("adam", (3,), None)):
            compared, weights = compare_weights(optimizer, counts, Path(folder) / optimizer, class_weight)
            for count, result in compared.items():
                results["weights"][f"{optimizer}-{count}"] = result
        results["updates_per_call"] = compare_updates_per_call(Path(folder) / "calls", weights[3])
        results["dropout"] = dropout_on_replicas(Path(folder) / "dropout")
        results["language_model"] = language_model_on_replicas(Path(folder) / "language_model")
        results["lbfgs"] = lbfgs_on_replicas(Path(folder) / "lbfgs")
    for subdivisions in (1, 4):
        results["reductions"][str(subdivisions)] = count_reductions(subdivisions)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # The results are written: end without TensorFlow's teardown (2 to 3 s), as the accumrun command does.
    os._exit(0)
