"""Data: the sources (:mod:`.registry`), a source's arrays checked and split (:mod:`.dataset`), the feeder that
turns them into batches on the device (:mod:`.feeder`), and downloads (:mod:`.download`)."""
