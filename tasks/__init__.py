"""Celery app and worker tasks; `celery -A clusterenv.tasks worker` finds `clusterenv.tasks.app` here."""

import os

# Before numpy loads: a worker's matmuls are tiny, and OpenBLAS threads only fight the other
# workers for cores (bench/overhead.py: worker CPU per 16×64 chunk fell from 49 to 28 ms).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from clusterenv.tasks.app import app  # noqa: E402

__all__ = ["app"]
