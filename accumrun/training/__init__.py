"""Training: everything built from a config, resolved and frozen (:mod:`.setup`), the run's folder, files and
status (:mod:`.run`), the Trainer and its epoch loop (:mod:`.loop`), which calls hooks at named points (:mod:`.hooks`:
progress, the epoch log, TensorBoard, validation, the controls, checkpoints, signals, the non-finite policy), the
Trainer assembled (:mod:`.assembly`) and run with the Run by :mod:`.runner`;
``subdivisions: auto`` (:mod:`.autosub`, :mod:`.probe`), devices and hosts (:mod:`.distribute`), checkpoints
(:mod:`.checkpoints`), graceful stops (:mod:`.signals`), what a run records (:mod:`.log`, :mod:`.tensorboard`)
and prints (:mod:`.console`)."""
