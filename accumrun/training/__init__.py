"""Training: everything built from a config, resolved and frozen (:mod:`.setup`), the run's folder, files and
status (:mod:`.run`), the Trainer and its epoch loop (:mod:`.loop`), both put together by :mod:`.runner`;
``subdivisions: auto`` (:mod:`.autosub`, :mod:`.probe`), devices and hosts (:mod:`.distribute`), checkpoints
(:mod:`.checkpoints`), graceful stops (:mod:`.signals`), what a run records (:mod:`.log`, :mod:`.tensorboard`)
and prints (:mod:`.console`)."""
