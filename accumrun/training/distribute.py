"""Which devices and hosts a run uses: the ``distribute:`` section turned into a ``tf.distribute`` strategy.

``none`` trains on one device without ``tf.distribute``. ``mirrored`` replicates the model on the local GPUs (or
on ``logical_cpus`` slices of the CPU, to try it without GPUs); ``multi_worker`` on the devices of several hosts,
whose cluster the standard ``TF_CONFIG`` environment variable describes. Logical devices and the multi-worker
runtime must be set up before TensorFlow creates its devices, so :func:`create_strategy` is called first thing
(the command line does so before anything else touches TensorFlow), once per process, and the strategy is
passed down as a value.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import tensorflow as tf

from accumrun.config.schema import DistributeConfig
from accumrun.errors import ConfigError


def create_strategy(config: DistributeConfig) -> tf.distribute.Strategy | None:
    """The strategy that ``config`` asks for, or None for one device.

    Raises:
        ConfigError: ``multi_worker`` without a usable ``TF_CONFIG``, or ``logical_cpus`` asked for after
            TensorFlow has created its devices.
    """
    name = config.strategy
    if name == "auto":
        # Physical devices can be listed without creating the runtime's devices.
        name = "mirrored" if len(tf.config.list_physical_devices("GPU")) > 1 else "none"
    if name == "none":
        return None
    if name == "multi_worker":
        read_cluster()
        return tf.distribute.MultiWorkerMirroredStrategy()
    devices = _split_cpu(config.logical_cpus) if config.logical_cpus else None
    return tf.distribute.MirroredStrategy(devices)


def _split_cpu(count: int) -> list[str]:
    """Split the host CPU into ``count`` logical devices; return their names."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
    except RuntimeError:
        # TensorFlow created its devices already. A split made earlier in this process is as good as a new one.
        if len(tf.config.list_logical_devices("CPU")) != count:
            raise ConfigError(
                "distribute.logical_cpus",
                "must be set before TensorFlow creates its devices (the accumrun command does so; in Python, call "
                "accumrun.training.distribute.create_strategy before anything else uses TensorFlow)",
                count,
            ) from None
    return [device.name for device in tf.config.list_logical_devices("CPU")]


def read_cluster() -> dict[str, Any]:
    """The parsed ``TF_CONFIG`` of a multi-worker run, checked for the fields that TensorFlow needs.

    Raises:
        ConfigError: it is not set, not JSON, or its ``task`` is not one of its ``cluster``'s workers.
    """
    text = os.environ.get("TF_CONFIG", "").strip()
    if not text:
        raise ConfigError(
            "distribute.strategy",
            "multi_worker reads the cluster from the TF_CONFIG environment variable, which is not set "
            "(see the README, 'Several hosts')",
            "multi_worker",
        )
    try:
        spec = json.loads(text)
    except ValueError as error:
        raise ConfigError("TF_CONFIG", f"is not valid JSON: {error}") from None
    cluster = spec.get("cluster") if isinstance(spec, dict) else None
    task = spec.get("task") if isinstance(spec, dict) else None
    if not isinstance(cluster, dict) or not all(isinstance(hosts, list) and hosts for hosts in cluster.values()):
        raise ConfigError("TF_CONFIG", 'needs "cluster": {"worker": ["host:port", ...]}', text)
    if set(cluster) - {"chief", "worker"}:
        raise ConfigError("TF_CONFIG", "multi_worker training uses only 'chief' and 'worker' jobs", sorted(cluster))
    task_type = task.get("type") if isinstance(task, dict) else None
    index = task.get("index") if isinstance(task, dict) else None
    if task_type not in cluster or not isinstance(index, int) or not 0 <= index < len(cluster[task_type]):
        raise ConfigError(
            "TF_CONFIG", 'needs "task": {"type": "worker", "index": i} naming one of the cluster\'s hosts', task
        )
    return spec


def is_chief(strategy: tf.distribute.Strategy | None) -> bool:
    """Whether this process writes the run: always, except on a multi-worker run's workers other than the chief
    (the ``chief`` task, or worker 0 when the cluster has no chief)."""
    resolver = strategy.cluster_resolver if strategy is not None else None
    if resolver is None or not resolver.cluster_spec().jobs:
        return True
    if resolver.task_type == "chief":
        return True
    return resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in resolver.cluster_spec().jobs


def strategy_scope(strategy: tf.distribute.Strategy | None) -> contextlib.AbstractContextManager:
    """The scope to create the model and the optimizer in, so that their variables live on every replica."""
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def describe_strategy(strategy: tf.distribute.Strategy) -> str:
    """A one-line description such as ``mirrored: 2 replicas on CPU:0, CPU:1``."""
    replicas = strategy.num_replicas_in_sync
    devices = ", ".join(_short_device(name) for name in strategy.extended.worker_devices)
    resolver = strategy.cluster_resolver
    if resolver is None or not resolver.cluster_spec().jobs:
        return f"mirrored: {replicas} replica{'s' if replicas != 1 else ''} on {devices}"
    jobs = resolver.cluster_spec().as_dict()
    workers = len(jobs.get("chief", [])) + len(jobs.get("worker", []))
    role = "the chief, writes the run" if is_chief(strategy) else "writes nothing"
    return (
        f"multi_worker: {replicas} replicas on {workers} workers; this is {resolver.task_type} {resolver.task_id} "
        f"({role}) with {devices}"
    )


def _short_device(name: str) -> str:
    """``/job:worker/replica:0/task:1/device:GPU:0`` -> ``GPU:0``."""
    return name.rsplit("device:", 1)[-1]
