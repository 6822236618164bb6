"""Training: the setup (:mod:`.setup`), the Run (:mod:`.run_folder`), the Trainer's loop (:mod:`.loop`) and its hooks
(:mod:`.hooks`), put together (:mod:`.trainer_assembly`) and run by :mod:`.runner`."""
