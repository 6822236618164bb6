"""Training across replicas (tf.distribute) equals training on one device.

Mirrored training needs the CPU split into logical devices before TensorFlow creates its devices, and
multi-worker training needs one process per worker, so those runs happen in child processes; the numbers they
report are asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from accumrun.config.schema import DistributeConfig
from accumrun.errors import ConfigError
from accumrun.training.distribute import create_strategy

REPO = Path(__file__).resolve().parent.parent
REPLICAS = 2
# A guard against a hung child, not a speed limit: its ~85 s of CPU (~100 s before some of its runs dropped their
# short last batch) took over 400 s on 2 cores shared with 3 other TensorFlow test processes.
CHILD_TIMEOUT = 900


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The numbers of tests/distributed_child.py: the digits config trained mirrored from the command line, and
    mirrored runs on two logical CPUs against one device."""
    out = tmp_path_factory.mktemp("mirrored") / "results.json"
    child = subprocess.run(
        [sys.executable, "-m", "tests.distributed_child", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert child.returncode == 0, child.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.subprocess
def test_lbfgs_on_two_replicas_equals_one_device(mirrored: dict[str, Any]) -> None:
    # Six iterations; each evaluation's gradient is summed over the replicas as Keras sums any optimizer's.
    result = mirrored["lbfgs"]
    assert result["replicas"] == REPLICAS and result["optimizer_steps"] == 6
    assert result["max_difference"] < 1e-5


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize(("optimizer", "subdivisions"), [("sgd", 1), ("sgd", 3), ("adam", 3)])
def test_mirrored_on_two_logical_cpus_equals_one_device_without_subdivisions(
    mirrored: dict[str, Any], optimizer: str, subdivisions: int
) -> None:
    # 19 samples in batches of 9: the replicas split 9 as 4 + 5, and the last batch of 1 as 0 + 1.
    result = mirrored["weights"][f"{optimizer}-{subdivisions}"]
    assert result["replicas"] == REPLICAS and result["optimizer_steps"] == 6
    assert result["max_difference"] < 1e-5
    # Every replica's copy of the variables got the same update.
    assert result["max_replica_difference"] == 0
    # Guards against passing on weights that never moved.
    assert result["moved"] > 1e-2


@pytest.mark.slow
@pytest.mark.subprocess
def test_class_weighted_training_on_two_logical_cpus_equals_one_device(mirrored: dict[str, Any]) -> None:
    # The sgd runs weigh their samples by class (balanced): the weights travel with the targets into each
    # replica's slice (4 + 5 samples, then 0 + 1).
    result = mirrored["weights"]["sgd-3"]
    assert result["max_difference"] < 1e-5 and result["max_replica_difference"] == 0
    assert result["moved"] > 1e-2


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_noise_estimates_on_two_replicas_equal_the_formulas(mirrored: dict[str, Any]) -> None:
    # A batch of 10: 5 samples on each replica, each cut into sub-batches of 1, 2 and 2 (P = 6).
    sq_norm, trace, valid = mirrored["noise"]["measures"]
    expected_sq_norm, expected_trace = mirrored["noise"]["expected"]
    assert valid == 1.0
    assert sq_norm == pytest.approx(expected_sq_norm, rel=1e-5)
    assert trace == pytest.approx(expected_trace, rel=1e-5)


@pytest.mark.slow
@pytest.mark.subprocess
def test_several_updates_per_call_equal_one_per_call_on_replicas(mirrored: dict[str, Any]) -> None:
    # Batches of 9, 9 and 1: calls of two full batches, then the short one, every replica in step.
    assert mirrored["updates_per_call"]["max_difference"] <= 1e-6


@pytest.mark.slow
@pytest.mark.subprocess
def test_per_batch_statistics_are_those_of_the_global_batch_on_every_replica(mirrored: dict[str, Any]) -> None:
    per_batch, sub_batch = mirrored["batch_norm"]["per_batch"], mirrored["batch_norm"]["sub_batch"]
    assert per_batch["moved"] > 1e-2
    assert per_batch["to_one_device"] < 1e-5 and per_batch["between_replicas"] == 0.0
    # The control: each replica's own sub-batches move its own copy.
    assert sub_batch["between_replicas"] > 1e-3


@pytest.mark.slow
@pytest.mark.subprocess
def test_dropout_on_two_replicas_with_subdivisions_equals_one_device_without(mirrored: dict[str, Any]) -> None:
    # Each sample draws its mask by its row in the global batch, whichever replica and sub-batch holds it.
    assert mirrored["dropout"]["per_sample"] < 2e-5
    # The control: drawn per sub-batch (and per replica), the masks and so the run differ from the same one device's.
    assert mirrored["dropout"]["per_sub_batch"] > 1e-2


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_language_model_on_two_replicas_divides_by_the_global_batch_real_tokens(mirrored: dict[str, Any]) -> None:
    # Each replica's windows hold their own number of real tokens; both divide by the whole batch's count, with
    # bucketed padding (each batch grouped by length, then dealt out to the replicas, each cutting its own).
    assert mirrored["language_model"]["max_difference"] < 2e-5


@pytest.mark.slow
@pytest.mark.subprocess
def test_one_gradient_all_reduce_per_batch_whatever_the_subdivisions(mirrored: dict[str, Any]) -> None:
    """The traced step holds the same reductions for 1 and 4 sub-batches, and none inside the sub-batch loop.

    A reduction is one collective op per replica. Outside the update branch there is one (the loss sum and the
    non-finite flag, stacked); inside it, the optimizer's sum of the gradients.
    """
    one, four = mirrored["reductions"]["1"], mirrored["reductions"]["4"]
    assert one == four
    assert one["in_loops"] == 0
    assert one["total"] - one["in_branches"] == REPLICAS
    assert one["in_branches"] >= REPLICAS


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_digits_config_trains_mirrored_on_two_logical_cpus_from_the_command_line(mirrored: dict[str, Any]) -> None:
    # The child ran `accumrun train configs/digits.yaml --set distribute.strategy=mirrored --set
    # distribute.logical_cpus=2 --epochs 1` first, so the command itself split the CPU.
    result = mirrored["command_line"]
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
