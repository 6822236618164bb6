"""Training: everything built from a config (:mod:`.setup`), the run (:mod:`.runner`) and its epoch loop
(:mod:`.loop`), ``subdivisions: auto`` (:mod:`.autosub`, :mod:`.probe`), devices and hosts
(:mod:`.distribute`), checkpoints (:mod:`.checkpoints`), graceful stops (:mod:`.signals`) and what a run
prints (:mod:`.console`)."""
