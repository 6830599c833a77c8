"""What a `celery worker --loglevel INFO` of clusterenv logs per chunk task, as patterns the tests
read: a task received, and a task succeeded with its JSON summary (the first chunk id and how many
of its chunks it wrote). A solo worker logs them as MainProcess, a prefork one's children as
ForkPoolWorker-N."""

from __future__ import annotations

import re

SUCCEEDED = re.compile(
    r"^\[(\S+ \S+): INFO/[\w-]+\] Task clusterenv\.collect_chunk\[[^\]]+\] succeeded in "
    r"[^:]+: (\{.*\})$",
    re.M,
)
RECEIVED = re.compile(r"Task clusterenv\.collect_chunk\[[^\]]+\] received")
