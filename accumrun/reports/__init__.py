"""What is done with runs once they have run: scoring, predicting, generating, exporting, comparing subdivision
counts, loss curves, and the memory estimate of ``check --memory``."""
