"""The core: how a batch is cut (:mod:`.split`), the per-sample losses (:mod:`.losses`) and the accumulation
step (:mod:`.step`). It knows nothing of YAML, files or the command line."""
