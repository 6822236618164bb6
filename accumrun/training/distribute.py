"""Which devices and hosts a run uses: the ``distribute:`` section turned into a ``tf.distribute`` strategy.

Logical devices and the multi-worker runtime must be set up before TensorFlow creates its devices, so
:func:`create_strategy` is called first thing, once per process, and the strategy is passed down as a value.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import tensorflow as tf

from accumrun.config.schema import DistributeConfig
from accumrun.errors import ConfigError
from accumrun.kinds import Cluster, Strategy


def create_strategy(config: DistributeConfig) -> tf.distribute.Strategy | None:
    """The strategy that ``config`` asks for, or None for one device; ``auto`` is ``mirrored`` on a host with
    several GPUs, else ``none``. ConfigError: no usable cluster, or ``logical_cpus`` after TensorFlow started."""
    strategy = config.strategy
    if strategy == "auto":
        # Physical devices can be listed without creating the runtime's devices.
        strategy = Strategy.MIRRORED if len(tf.config.list_physical_devices("GPU")) > 1 else Strategy.NONE
    if strategy is Strategy.NONE:
        return None
    if strategy is Strategy.MULTI_WORKER:
        resolver = cluster_resolver(config.cluster)
        # Collectives give up on a worker that stops answering, instead of waiting for ever.
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=config.timeout_seconds)
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)
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


def cluster_resolver(cluster: Cluster | Literal["auto"]) -> tf.distribute.cluster_resolver.ClusterResolver:
    """The cluster of a multi-worker run, from where ``cluster`` says: ``auto`` is ``tf_config`` when ``TF_CONFIG``
    is set, else ``slurm`` in a Slurm task. ConfigError: ``auto`` finds neither, or what is there is malformed."""
    if cluster == "auto":
        if os.environ.get("TF_CONFIG", "").strip():
            cluster = Cluster.TF_CONFIG
        elif "SLURM_PROCID" in os.environ:
            cluster = Cluster.SLURM
        else:
            raise ConfigError(
                "distribute.cluster",
                "multi_worker needs a cluster: set TF_CONFIG, run as a Slurm task (srun), or start local workers "
                "with accumrun launch --workers N",
                "auto",
            )
    if cluster is Cluster.TF_CONFIG:
        read_cluster()
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return slurm_resolver()


class _CpuSlurmClusterResolver(tf.distribute.cluster_resolver.SlurmClusterResolver):
    """Slurm's resolver for nodes without GPUs. TensorFlow's lists a task only beside a GPU of its own, so this one
    has placeholder GPUs, sets no ``CUDA_VISIBLE_DEVICES`` and reports no accelerators: each replica is on a CPU."""

    def __init__(self) -> None:
        super().__init__(gpus_per_node=1024, gpus_per_task=1, auto_set_gpu=False)

    def num_accelerators(self, task_type: Any = None, task_id: Any = None, config_proto: Any = None) -> dict[str, int]:
        return {}


def slurm_resolver() -> tf.distribute.cluster_resolver.SlurmClusterResolver:
    """The cluster of this Slurm job step: one worker per task, ports from 8888 on each node, each task its share
    of a node's GPUs (a node where ``nvidia-smi`` does not run is CPU-only); ConfigError if malformed."""
    try:
        try:
            resolver: tf.distribute.cluster_resolver.SlurmClusterResolver = (
                tf.distribute.cluster_resolver.SlurmClusterResolver()
            )
        except (RuntimeError, OSError) as error:
            if "nvidia-smi" not in str(error) and not isinstance(error, OSError):
                raise
            resolver = _CpuSlurmClusterResolver()
        resolver.cluster_spec()  # sets the task type and index (and the task's GPUs)
    except (RuntimeError, ValueError, KeyError) as error:
        raise ConfigError("distribute.cluster", f"slurm: cannot read the job step's cluster: {error}") from None
    return resolver


def read_cluster() -> dict[str, Any]:
    """The parsed ``TF_CONFIG`` of a multi-worker run, checked for the fields TensorFlow needs (else ConfigError)."""
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


def _cluster(strategy: tf.distribute.Strategy | None) -> tf.distribute.cluster_resolver.ClusterResolver | None:
    """The cluster resolver of a multi-worker run, or None on one host."""
    resolver = strategy.cluster_resolver if strategy is not None else None
    return resolver if resolver is not None and resolver.cluster_spec().jobs else None


def is_chief(strategy: tf.distribute.Strategy | None) -> bool:
    """Whether this process writes the run: always, except on a multi-worker run's workers other than the chief
    (the ``chief`` task, or worker 0 when the cluster has no chief)."""
    resolver = _cluster(strategy)
    if resolver is None or resolver.task_type == "chief":
        return True
    return resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in resolver.cluster_spec().jobs


class Agreed(NamedTuple):
    """What every worker does after a call: stop (for this signal), the next call's size, and checkpoint now."""

    signal_number: int | None
    call_size: int
    checkpoint: bool


Agreement = Callable[[Agreed], Agreed]
"""``agree(local) -> agreed``: this worker's view after a call, made the same on every worker."""


def agreement(strategy: tf.distribute.Strategy | None) -> Agreement:
    """What every worker of a multi-worker run agrees on after each call, by one small all-reduce: the stop that any
    worker was asked for (SIGTERM before SIGINT), so that all stop at the same batch; the chief's next call size and
    decision to checkpoint (``updates_per_call: auto`` and ``checkpoint_every`` go by each worker's own clock, and
    workers that differed would wait on each other's collectives forever: a checkpoint reads the metrics, which sums
    them across the workers). Elsewhere, the local view."""
    if not task_addresses(strategy):
        return lambda local: local
    assert strategy is not None
    asked = (signal.SIGTERM, signal.SIGINT)
    chief = is_chief(strategy)

    @tf.function
    def totals(values: tf.Tensor) -> tf.Tensor:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(values)), axis=None)

    def agree(local: Agreed) -> Agreed:
        flags = [float(local.signal_number == each) for each in asked]
        chiefs = [float(local.call_size), float(local.checkpoint)] if chief else [0.0, 0.0]
        summed = totals(tf.constant([*flags, *chiefs], tf.float64)).numpy()
        stop = next((int(each) for each, total in zip(asked, summed[:2], strict=True) if total > 0), None)
        return Agreed(stop, int(summed[2]), bool(summed[3]))

    return agree


# What a collective raises when a peer is gone: the coordination service's missed heartbeats, or the timeout.
PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)


def lost_worker(error: Exception, strategy: tf.distribute.Strategy | None) -> str | None:
    """``worker 1 (host:port)``, the task that ``error`` says stopped answering (``a worker`` when it names none);
    None when ``error`` is not a lost peer of a multi-worker run."""
    tasks = task_addresses(strategy)
    if not tasks or not isinstance(error, PEER_ERRORS):
        return None
    resolver = _cluster(strategy)
    me = f"{resolver.task_type} {resolver.task_id}" if resolver is not None else ""
    named = re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)", str(error))
    lost = [f"{job} {index}" for job, index in dict.fromkeys(named) if f"{job} {index}" != me]
    return ", ".join(f"{task} ({tasks.get(task, '?')})" for task in lost) or "a worker"


def strategy_scope(strategy: tf.distribute.Strategy | None) -> contextlib.AbstractContextManager:
    """The scope to create the model and the optimizer in, so that their variables live on every replica."""
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def describe_strategy(strategy: tf.distribute.Strategy) -> str:
    """A one-line description such as ``mirrored: 2 replicas on CPU:0, CPU:1``."""
    replicas = strategy.num_replicas_in_sync
    # /job:worker/replica:0/task:1/device:GPU:0 -> GPU:0
    devices = ", ".join(name.rsplit("device:", 1)[-1] for name in strategy.extended.worker_devices)
    resolver = _cluster(strategy)
    if resolver is None:
        return f"mirrored: {replicas} replica{'s' if replicas != 1 else ''} on {devices}"
    jobs = resolver.cluster_spec().as_dict()
    workers = len(jobs.get("chief", [])) + len(jobs.get("worker", []))
    role = "the chief, writes the run" if is_chief(strategy) else "writes nothing"
    source = "Slurm" if isinstance(resolver, tf.distribute.cluster_resolver.SlurmClusterResolver) else "TF_CONFIG"
    chief = "chief" if "chief" in jobs else "worker"
    return (
        f"multi_worker: {replicas} replicas on {workers} workers (cluster from {source}; chief {chief} 0 at "
        f"{jobs[chief][0]}); this is {resolver.task_type} {resolver.task_id} ({role}) with {devices}"
    )


def task_addresses(strategy: tf.distribute.Strategy | None) -> dict[str, str]:
    """Every task of a multi-worker cluster by name (``worker 1``) and address; empty on one host."""
    resolver = _cluster(strategy)
    jobs = resolver.cluster_spec().as_dict() if resolver is not None else {}
    return {f"{job} {index}": address for job, hosts in jobs.items() for index, address in enumerate(hosts)}
