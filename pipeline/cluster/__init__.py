"""The cluster: who is alive (worker registry, heartbeats), the Celery client, the embedded stack."""
