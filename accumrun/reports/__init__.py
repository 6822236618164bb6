"""What accumrun reports about runs: compare (:mod:`.compare`), loss curves (:mod:`.plot`) and the memory
estimate of ``check --memory`` (:mod:`.memory`)."""
