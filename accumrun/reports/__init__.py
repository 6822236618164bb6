"""What is done with runs once they have run: a finished run as the next three read it (:mod:`.finished`),
scoring it (:mod:`.evaluate`), predicting new inputs (:mod:`.predict`), exporting a SavedModel (:mod:`.export`),
comparing subdivision counts (:mod:`.compare`), loss curves (:mod:`.plot`) and the memory estimate of
``check --memory`` (:mod:`.memory`)."""
