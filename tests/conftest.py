"""pytest configuration: TensorFlow's C++ logging quieted for every test and subprocess, the host CPU split into
two logical devices and Grappler's graph rewrites off in every test process, the processes that tests start without
the test-only scikit-learn, shared fixtures, and the files in the order that keeps two processes busy to the end.

Helpers that tests import (configs, data files, the CLI in a subprocess) are in tests/helpers.py.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

AS_INSTALLED = Path(__file__).with_name("as_installed")
"""On the import path of every process that a test starts: there, Python runs its ``sitecustomize`` first, which
leaves out the test-only scikit-learn as a user's install does."""

REPLICAS = 2
"""The logical CPUs of every test process: the replicas of the session's mirrored strategy."""


def pytest_configure(config: pytest.Config) -> None:
    """Split the host CPU into :data:`REPLICAS` logical devices, as ``distribute.logical_cpus`` does, in every process
    that runs tests, before the test files are imported: only before TensorFlow creates its devices can it be done
    (any test may be the process's first to touch TensorFlow). Every op still runs on CPU:0 unless a strategy places
    it; both devices share the process's thread pools. Put :data:`AS_INSTALLED` on the import path of the processes
    that tests start. xdist's controller runs no test: it does neither."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    # Not in the controller: the workers that it starts run the tests that compare with scikit-learn.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(AS_INSTALLED), os.environ.get("PYTHONPATH")]))
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
    # Grappler's rewrites of each traced function cost more than they save on graphs this small (test_objective and
    # test_step took 54 s instead of 63 s without them). They must not change what a graph computes, so every number
    # a test compares holds either way; the tests that run accumrun in a process of its own run with them.
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, dict[str, Any]], Any]:
    """``trained(name, config)``: the run of ``config``, trained once per module under ``name`` for every test that
    compares to it (read only)."""
    from accumrun import train

    results: dict[str, Any] = {}

    def run(name: str, config: dict[str, Any]) -> Any:
        if name not in results:
            results[name] = train(config, tmp_path_factory.mktemp("run") / "run", quiet=True)
        return results[name]

    return run


@pytest.fixture(scope="session")
def mirrored_strategy() -> Any:
    """The process's one MirroredStrategy, over its two logical CPUs (made by accumrun, as a run with
    ``distribute.logical_cpus: 2`` makes it): a second one in the same process would reuse the first's collective
    keys, so every test of training on replicas shares this one."""
    from accumrun.config.schema import DistributeConfig
    from accumrun.training.distribute import create_strategy

    return create_strategy(DistributeConfig(strategy="mirrored", logical_cpus=REPLICAS))


@pytest.fixture
def recomputations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times each recomputed call ran while traced, one entry per call in the order they were made: 2 each,
    once forward and once again in the backward pass."""
    import tensorflow as tf

    from accumrun.core import recompute

    runs: list[int] = []
    recompute_grad = tf.recompute_grad

    def counting(f: Callable[..., Any]) -> Callable[..., Any]:
        index = len(runs)
        runs.append(0)

        def counted(*args: Any) -> Any:
            runs[index] += 1
            return f(*args)

        return recompute_grad(counted)

    monkeypatch.setattr(recompute.tf, "recompute_grad", counting)
    return runs


FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
"""Each test file's seconds in a whole run (setup, call and teardown of its tests), as ``--record-file-seconds``
last measured them."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-file-seconds",
        action="store_true",
        help=f"write each test file's seconds in this run to {FILE_SECONDS.name} (the order the files run in)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first, as ``tests/file_seconds.json`` measured them (a file not in it first of all): with
    ``-n 2 --dist loadfile --no-loadscope-reorder`` each process takes the next file when it is done, so the two
    finish close together instead of one waiting out a long file begun last. Within a file the order stays."""
    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
    items.sort(key=lambda item: -seconds.get(_file(item.nodeid), float("inf")))


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


_measured: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _measured[_file(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Only where the tests' reports arrive in whole: the main process (an xdist worker has a workerinput).
    if session.config.getoption("record_file_seconds") and not hasattr(session.config, "workerinput"):
        # A partial run (-k, a few files) updates its files and keeps the others' seconds.
        known = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
        known.update((name, round(value, 1)) for name, value in _measured.items())
        ordered = dict(sorted(known.items(), key=lambda kv: -kv[1]))
        FILE_SECONDS.write_text(json.dumps(ordered, indent=1) + "\n")
