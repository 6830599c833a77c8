"""The run: wiring, the loop, ingest, publishing, evaluation, accounting and what the run reports."""
