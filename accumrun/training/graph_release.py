"""What a finished run lets go of: the graphs its steps were traced in.

TensorFlow registers each ``tf.custom_gradient`` traced in a graph under a name of its own (``CustomGradient-N``) in
its global gradient registry, and never removes it. The registered closure holds tensors of the graph it was traced
in, so the registry keeps that whole graph alive (tensorflow#97697; Keras' ``clear_session`` leaves it too). Every
step traces some: ``ReplicaContext.all_reduce`` is one in graph mode, even on one device, and so are
``tf.recompute_grad`` under remat and the int8 layers' deferred backward pass. A process that trains more than once
(``accumrun.train`` in a loop, a notebook, the test suite) kept every earlier run's step graphs: 14 graphs and 16 MiB
a run of ``configs/digits.yaml``, 290 MiB a run of ``benchmarks/lora_memory.py``'s LoRA transformer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# Private: TensorFlow offers no public way to remove a registered gradient.
from tensorflow.python.framework import ops


@contextlib.contextmanager
def releasing_traced_graphs() -> Iterator[None]:
    """Inside, train as usual; on the way out (returned, stopped or failed), remove the custom gradients registered
    inside, so that the step graphs traced there can be freed once nothing else holds them.

    Those gradients are looked up only when a graph that holds their op is differentiated: a step is differentiated
    as it is traced, inside. A gradient that another thread registers meanwhile goes too, which is why this wraps a
    whole run and nothing finer."""
    registry = getattr(getattr(ops, "_gradient_registry", None), "_registry", None)
    if not isinstance(registry, dict):  # a TensorFlow that keeps it otherwise: nothing to remove here
        yield
        return
    before = set(registry)
    try:
        yield
    finally:
        for name in set(registry) - before:
            if name.startswith("CustomGradient-"):
                del registry[name]
