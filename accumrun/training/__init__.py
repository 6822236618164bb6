"""Training: the setup (:mod:`.setup`), the Run (:mod:`.run`), the Trainer's loop (:mod:`.loop`) and its hooks
(:mod:`.hooks`), put together (:mod:`.assembly`) and run by :mod:`.runner`."""
