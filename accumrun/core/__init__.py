"""The core: how a batch is cut (:mod:`.sub_batches`), the per-sample losses (:mod:`.losses`), token ids' padding
(:mod:`.tokens`), the BatchNorm modes (:mod:`.batch_norm`), the random draws per sample (:mod:`.draws`,
:mod:`.seeds`) and the accumulation step (:mod:`.step`). It knows nothing of YAML, files or the command line, and
imports nothing of accumrun but :mod:`accumrun.kinds`."""
