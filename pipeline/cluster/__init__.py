"""The cluster: who is alive, each run's marks and status, the Celery client, the embedded stack."""
