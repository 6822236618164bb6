"""The config: the YAML schema (:mod:`.schema`) and loading it with overrides (:mod:`.loading`)."""
