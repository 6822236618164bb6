"""Full-batch L-BFGS, measured three ways, written to ``docs/benchmarks-lbfgs.md`` (and ``.json``)::

    python benchmarks/lbfgs.py [--out PATH] [--smoke]

1. The polish: a tanh MLP (8-32-32-1) on a smooth regression of 2,000 samples, after 200 full-batch Adam epochs.
   From there, 2,000 more Adam epochs (the run goes on, its moments kept) against 1,000 iterations of L-BFGS from
   the saved model (``model: {name: saved}``), each with its training loss and wall time.
2. Evaluations per iteration: L-BFGS on scikit-learn's breast-cancer logistic regression (C = 1) and the diabetes
   least squares, beside SciPy's L-BFGS-B on the same float64 objectives (its ``nfev`` over ``nit``).
3. The cost of one evaluation: one L-BFGS objective-and-gradient evaluation against one ``batch_size: full``
   update of SGD, on the MLP and data of 1 and on a larger one (20,000 samples, 8-256-256-1), with 1 and 4
   subdivisions.

Every run is in this process, through ``accumrun.train``; its wall time includes tracing the step.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from run import REPO, machine, publish_report  # benchmarks/run.py, beside this script
from scipy.optimize import minimize
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.linear_model import LogisticRegression

sys.path.insert(0, str(REPO))
from accumrun import train  # noqa: E402 - after the repository is on the path

SEED = 0


def write_csv(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    header = ",".join([*(f"f{i}" for i in range(x.shape[1])), "target"])
    rows = [",".join(str(v) for v in [*row.tolist(), target.item()]) for row, target in zip(x, y, strict=True)]
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def regression_csv(folder: Path, samples: int) -> Path:
    """A smooth regression of 8 features (``samples`` of them): a sum of products and sines, standardized, with a
    little noise."""
    rng = np.random.default_rng(SEED)
    x = rng.uniform(-1, 1, (samples, 8))
    y = np.sin(np.pi * x[:, 0] * x[:, 1]) + x[:, 2] ** 2 - 0.5 * x[:, 3] * x[:, 4] + 0.3 * np.cos(3 * x[:, 5])
    y = y + 0.05 * rng.standard_normal(samples)
    return write_csv(folder / f"regression-{samples}.csv", x, (y - y.mean()) / y.std())


def config(data: Path, model: dict[str, Any], optimizer: dict[str, Any], epochs: int, **training: Any) -> dict:
    task = "binary" if "cancer" in data.name else "regression"
    settings: dict[str, Any] = {
        "seed": SEED,
        "data": {"name": "csv", "path": str(data), "label": "target", "validation_split": 0.0, "task": task},
        "model": model,
        "training": {"epochs": epochs, "batch_size": "full", **training},
        "optimizer": optimizer,
        "output": {"tensorboard": False},
    }
    if task == "regression":
        settings["loss"] = {"name": "mean_squared_error"}
    return settings


def timed_train(settings: dict[str, Any], run_dir: Path) -> tuple[list[dict[str, Any]], float]:
    started = time.perf_counter()
    rows = train(settings, run_dir, quiet=True).metrics
    return rows, time.perf_counter() - started


def polish(folder: Path, data: Path, adam_more: int, lbfgs_iterations: int) -> dict[str, Any]:
    """200 Adam epochs; then Adam goes on for ``adam_more`` epochs, and L-BFGS polishes the 200-epoch model."""
    mlp = {"name": "mlp", "hidden": [32, 32], "activation": "tanh"}
    adam = {"name": "adam", "learning_rate": 0.01}
    start_rows, start_seconds = timed_train(config(data, mlp, adam, 200), folder / "adam-200")
    # One run of 200 + more epochs: its first 200 are those above (same seed), and Adam keeps its moments after.
    long_rows, long_seconds = timed_train(config(data, mlp, adam, 200 + adam_more), folder / "adam-long")
    saved = {"name": "saved", "path": str(folder / "adam-200" / "model.keras")}
    lbfgs = {"name": "lbfgs", "tolerance_grad": 1e-9, "tolerance_change": 0.0}
    lbfgs_rows, lbfgs_seconds = timed_train(config(data, saved, lbfgs, lbfgs_iterations), folder / "lbfgs")
    scipy_losses = scipy_polish(folder / "adam-200" / "model.keras", data, lbfgs_iterations)
    return {
        "scipy_loss_after": scipy_losses,
        "adam_200": {"loss": start_rows[-1]["loss"], "seconds": round(start_seconds, 1)},
        "adam_more": {
            "epochs": adam_more,
            "loss": long_rows[-1]["loss"],
            # The run's own epochs after the 200th, as it timed them (its start was timed above).
            "seconds": round(sum(row["seconds"] for row in long_rows[200:]), 1),
        },
        "lbfgs": {
            "iterations": len(lbfgs_rows),
            "evaluations": int(sum(row["evaluations"] for row in lbfgs_rows)),
            "loss": lbfgs_rows[-1]["loss"],
            "seconds": round(lbfgs_seconds, 1),
            "stopped": lbfgs_rows[-1].get("stopped"),
            "loss_after": {str(k): lbfgs_rows[k - 1]["loss"] for k in (10, 100, 300) if k <= len(lbfgs_rows)},
            # The first iteration below Adam's loss after its further epochs, and the seconds it had taken.
            "below_adam_at": next(
                (
                    {
                        "iteration": row["epoch"],
                        "seconds": round(sum(r["seconds"] for r in lbfgs_rows[: row["epoch"]]), 1),
                    }
                    for row in lbfgs_rows
                    if row["loss"] < long_rows[-1]["loss"]
                ),
                None,
            ),
        },
    }


def logistic_objective(x: np.ndarray, y: np.ndarray, c: float) -> Any:
    """The mean log-loss plus ``|w|^2 / (2 C N)`` (scikit-learn's objective over C N) and its gradient."""
    n = len(x)

    def value_and_gradient(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:-1], theta[-1]
        z = x @ w + b
        loss = np.mean(np.logaddexp(0, z) - y * z) + w @ w / (2 * c * n)
        residual = (1 / (1 + np.exp(-z)) - y) / n
        return loss, np.concatenate([x.T @ residual + w / (c * n), [residual.sum()]])

    return value_and_gradient


def squares_objective(x: np.ndarray, y: np.ndarray) -> Any:
    """The mean squared error of a linear model and its gradient."""
    n = len(x)

    def value_and_gradient(theta: np.ndarray) -> tuple[float, np.ndarray]:
        residual = x @ theta[:-1] + theta[-1] - y
        return float(residual @ residual / n), np.concatenate([2 * x.T @ residual / n, [2 * residual.sum() / n]])

    return value_and_gradient


def evaluations_per_iteration(folder: Path) -> dict[str, Any]:
    """accumrun's L-BFGS and SciPy's L-BFGS-B on the same two convex problems, to each one's convergence."""
    problems = {}
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    problems["logistic (breast cancer, C=1)"] = (x, y, logistic_objective(x, y, 1.0), 1 / (2 * len(x)))
    x, y = load_diabetes(return_X_y=True)
    x, y = (x - x.mean(0)) / x.std(0), (y - y.mean()) / y.std()
    problems["least squares (diabetes)"] = (x, y, squares_objective(x, y), 0.0)
    results = {}
    for name, (x, y, objective, l2) in problems.items():
        data = write_csv(folder / ("cancer.csv" if "cancer" in name else "diabetes.csv"), x, y)
        model = {"name": "mlp", "hidden": [], "l2": l2}
        rows, seconds = timed_train(config(data, model, {"name": "lbfgs"}, 500), folder / f"lbfgs-{len(results)}")
        scipy = minimize(objective, np.zeros(x.shape[1] + 1), jac=True, method="L-BFGS-B", options={"gtol": 1e-7})
        evaluations = int(sum(row["evaluations"] for row in rows))
        results[name] = {
            "accumrun": {
                "iterations": len(rows),
                "evaluations": evaluations,
                "per_iteration": round(evaluations / len(rows), 2),
                "stopped": rows[-1].get("stopped"),
                "seconds": round(seconds, 1),
            },
            "scipy": {
                "iterations": int(scipy.nit),
                "evaluations": int(scipy.nfev),
                "per_iteration": round(scipy.nfev / scipy.nit, 2),
            },
        }
    return results


def agreement(folder: Path) -> dict[str, Any]:
    """How close L-BFGS comes to scikit-learn's logistic regression (C = 1) after twice its iterations and after 300
    (plain, 5 subdivisions, class weights {0: 2.5}); and how far the iterates of 1 and 5 subdivisions are apart,
    iteration by iteration (from a checkpoint per iteration), over 60 iterations."""
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    data = write_csv(folder / "cancer.csv", x, y)
    model = {"name": "mlp", "hidden": [], "l2": 1 / (2 * len(x))}
    exhaustive = {"name": "lbfgs", "tolerance_grad": 0.0, "tolerance_change": 0.0}
    results: dict[str, Any] = {"scikit_learn": {}}
    for name, subdivisions, class_weight in (("S=1", 1, None), ("S=5", 5, None), ("S=5, class weights", 5, 2.5)):
        weights = {0: class_weight} if class_weight else None
        reference = LogisticRegression(C=1.0, tol=1e-10, max_iter=10_000, class_weight=weights).fit(x, y)
        training: dict[str, Any] = {"subdivisions": subdivisions}
        if class_weight:
            training["class_weight"] = {"0": class_weight}
        for iterations in (2 * int(reference.n_iter_[0]), 300):
            run_dir = folder / f"agree-{len(results['scikit_learn'])}"
            train(config(data, model, exhaustive, iterations, **training), run_dir, quiet=True)
            kernel, bias = _weights(run_dir)
            error = max(
                float(np.max(np.abs(kernel[:, 0] - reference.coef_[0]))), abs(bias[0] - reference.intercept_[0])
            )
            results["scikit_learn"][f"{name}, {iterations} iterations"] = float(f"{error:.3g}")
    apart = []
    every_iteration = {"checkpoint_every_updates": 1, "keep_checkpoints": 100}
    for subdivisions in (1, 5):
        settings = config(data, model, exhaustive, 60, subdivisions=subdivisions)
        settings["output"].update(every_iteration)
        train(settings, folder / f"iterates-{subdivisions}", quiet=True)
    for checkpoint in sorted((folder / "iterates-1" / "checkpoints").glob("ckpt-*.npz")):
        plain, subdivided = (np.load(folder / f"iterates-{s}" / "checkpoints" / checkpoint.name) for s in (1, 5))
        apart.append(max(float(np.max(np.abs(plain[k] - subdivided[k]))) for k in ("model/0", "model/1")))
    results["iterates_apart"] = [float(f"{value:.3g}") for value in apart]
    return results


def _weights(run_dir: Path) -> list[np.ndarray]:
    """The final model's kernel and bias, from its last checkpoint."""
    (checkpoint,) = sorted((run_dir / "checkpoints").glob("ckpt-*.npz"))[-1:]
    with np.load(checkpoint) as stored:
        return [stored["model/0"], stored["model/1"]]


def scipy_polish(model_path: Path, data: Path, iterations: int) -> dict[str, float]:
    """SciPy's L-BFGS-B (history 10) from the same Adam-trained weights, on the same float32 objective: the
    training loss after 100, 300 and ``iterations`` iterations."""
    import keras  # noqa: PLC0415 - after accumrun has set TensorFlow up
    import tensorflow as tf  # noqa: PLC0415

    model = keras.models.load_model(model_path)
    table = np.loadtxt(data, delimiter=",", skiprows=1, dtype=np.float32)
    features, targets = tf.constant(table[:, :-1]), tf.constant(table[:, -1:])
    variables = model.trainable_variables
    sizes = [int(np.prod(v.shape)) for v in variables]

    def value_and_gradient(theta: np.ndarray) -> tuple[float, np.ndarray]:
        for variable, part in zip(variables, np.split(theta.astype(np.float32), np.cumsum(sizes)[:-1]), strict=True):
            variable.assign(part.reshape(variable.shape))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(features, training=False) - targets))
        gradients = tape.gradient(loss, variables)
        return float(loss), np.concatenate([g.numpy().ravel() for g in gradients]).astype(np.float64)

    losses: dict[str, float] = {}

    def record(intermediate_result: Any) -> None:  # SciPy passes its OptimizeResult to a parameter of this name
        done = len(losses_seen) + 1
        losses_seen.append(intermediate_result.fun)
        if done in (100, 300, iterations):
            losses[str(done)] = float(intermediate_result.fun)

    losses_seen: list[float] = []
    start = np.concatenate([v.numpy().ravel() for v in variables]).astype(np.float64)
    options = {"maxiter": iterations, "maxcor": 10, "gtol": 0.0, "ftol": 0.0}
    minimize(value_and_gradient, start, jac=True, method="L-BFGS-B", options=options, callback=record)
    return losses


def evaluation_cost(folder: Path, workloads: dict[str, tuple[Path, list[int]]], iterations: int) -> dict[str, Any]:
    """Seconds per L-BFGS evaluation against seconds per full-batch SGD update, after each run's first epoch
    (which traces the step), with 1 and 4 subdivisions, for each workload (its data and hidden widths)."""
    results = {}
    for (name, (data, hidden)), subdivisions in itertools.product(workloads.items(), (1, 4)):
        mlp = {"name": "mlp", "hidden": hidden, "activation": "tanh"}
        lbfgs = {"name": "lbfgs", "tolerance_grad": 0.0, "tolerance_change": 0.0}
        rows, _ = timed_train(
            config(data, mlp, lbfgs, iterations, subdivisions=subdivisions), folder / f"cost-lbfgs-{len(results)}"
        )
        sgd = {"name": "sgd", "learning_rate": 0.1}
        sgd_rows, _ = timed_train(
            config(data, mlp, sgd, iterations, subdivisions=subdivisions), folder / f"cost-sgd-{len(results)}"
        )
        per_evaluation = sum(row["seconds"] for row in rows[1:]) / sum(row["evaluations"] for row in rows[1:])
        per_update = sum(row["seconds"] for row in sgd_rows[1:]) / len(sgd_rows[1:])
        results[f"{name}, S={subdivisions}"] = {
            "lbfgs_ms_per_evaluation": round(1000 * per_evaluation, 2),
            "sgd_ms_per_update": round(1000 * per_update, 2),
            "ratio": round(per_evaluation / per_update, 2),
        }
    return results


def render(figures: dict[str, Any]) -> list[str]:
    polished = figures["polish"]
    adam, more, lbfgs = polished["adam_200"], polished["adam_more"], polished["lbfgs"]
    agreement = figures["agreement"]
    apart = agreement["iterates_apart"]
    above = next((k for k, value in enumerate(apart) if value > 1e-6), None)
    lines = [
        "## Agreement with scikit-learn's logistic regression (breast cancer, standardized, C = 1)",
        "",
        "Largest difference from `LogisticRegression(C=1, tol=1e-10)` in the weights and bias (the issue asks 1e-5 "
        "within twice scikit-learn's iterations):",
        "",
        "| run | largest difference |",
        "|---|---|",
        *(f"| {run} | {error:.2g} |" for run, error in agreement["scikit_learn"].items()),
        "",
        "1 against 5 subdivisions, the largest difference in the weights after each iteration (the issue asks 1e-6 "
        f"at every one): at most {max(apart[:above] if above else apart):.2g} up to iteration "
        f"{above if above is not None else len(apart)}; "
        + (
            f"first above 1e-6 at iteration {above + 1}, at most {max(apart):.2g} (iteration "
            f"{apart.index(max(apart)) + 1}), and {apart[-1]:.2g} at iteration {len(apart)}: NOT met."
            if above is not None
            else "met."
        ),
        "",
        "## 1. Adam, then L-BFGS (the issue's target: L-BFGS below 2,000 more Adam epochs)",
        "",
        "| phase | training loss | wall time |",
        "|---|---|---|",
        f"| 200 Adam epochs (the start) | {adam['loss']:.4g} | {adam['seconds']} s |",
        f"| then {more['epochs']:,} more Adam epochs | {more['loss']:.4g} | {more['seconds']} s |",
        f"| or L-BFGS from the 200-epoch model: {lbfgs['iterations']} iterations, {lbfgs['evaluations']} evaluations "
        f"| {lbfgs['loss']:.4g} | {lbfgs['seconds']} s |",
        "",
        "L-BFGS's loss after "
        + ", ".join(f"{k} iterations {v:.4g}" for k, v in lbfgs["loss_after"].items())
        + f". It stopped: {lbfgs['stopped'] or 'at its last epoch'}. "
        + " SciPy's L-BFGS-B from the same weights: "
        + ", ".join(f"{k} iterations {v:.4g}" for k, v in polished["scipy_loss_after"].items())
        + ". "
        + (
            f"It went below Adam's {more['epochs']:,} further epochs at iteration {below['iteration']}, after "
            f"{below['seconds']} s of its epochs (Adam's took {more['seconds']} s): target met on the loss."
            if (below := lbfgs["below_adam_at"])
            else "It did not go below Adam's loss: target NOT met."
        ),
        "",
        "## 2. Full-batch evaluations per iteration, beside SciPy's L-BFGS-B (float64, its default tolerances but "
        "gtol 1e-7)",
        "",
        "| problem | accumrun: iterations, evaluations, per iteration | SciPy: the same |",
        "|---|---|---|",
    ]
    for name, result in figures["evaluations"].items():
        ours, theirs = result["accumrun"], result["scipy"]
        lines.append(
            f"| {name} | {ours['iterations']}, {ours['evaluations']}, {ours['per_iteration']} | "
            f"{theirs['iterations']}, {theirs['evaluations']}, {theirs['per_iteration']} |"
        )
    lines += [
        "",
        "accumrun's runs use the defaults (tolerance_grad 1e-7, tolerance_change 1e-9) and stop on their own: "
        + "; ".join(f"{name}: {r['accumrun']['stopped']}" for name, r in figures["evaluations"].items())
        + ".",
        "",
        "## 3. One evaluation against one full-batch SGD update (tanh MLPs, after each run's first epoch)",
        "",
        "| workload | L-BFGS, ms per evaluation | SGD, ms per update | ratio |",
        "|---|---|---|---|",
    ]
    for workload, result in figures["cost"].items():
        lines.append(
            f"| {workload} | {result['lbfgs_ms_per_evaluation']} | {result['sgd_ms_per_update']} | {result['ratio']} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks-lbfgs.md")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check that the script runs")
    args = parser.parse_args()
    info = machine()
    samples, adam_more, iterations = (200, 20, 10) if args.smoke else (2000, 2000, 1000)
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        data = regression_csv(folder, samples)
        large = (200, 2000) if args.smoke else (20_000, 20_000)
        workloads = {
            f"{samples:,} samples, 8-32-32-1": (data, [32, 32]),
            f"{large[1]:,} samples, 8-256-256-1": (regression_csv(folder, large[0]), [256, 256]),
        }
        figures = {
            "agreement": agreement(folder),
            "polish": polish(folder, data, adam_more, iterations),
            "evaluations": evaluations_per_iteration(folder),
            "cost": evaluation_cost(folder, workloads, 20 if args.smoke else 60),
        }
    command = "python benchmarks/lbfgs.py" + (" --smoke" if args.smoke else "")
    publish_report(
        args.out, title="Full-batch L-BFGS", command=command, info=info, figures=figures, body=render(figures)
    )


if __name__ == "__main__":
    main()
