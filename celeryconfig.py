"""Celery settings for clusterenv; every value can be overridden from the environment.

Workers on any machine read the broker from CLUSTERENV_REDIS_URL:
    CLUSTERENV_REDIS_URL=redis://HOST:6379/0 celery -A clusterenv.tasks worker --loglevel=INFO
A password, ACL user and TLS options travel in that URL (docs/operations.md).

Settings only: literals and the environment. What follows from clusterenv's own names and the
broker URL (TLS verified for rediss://, the collection and evaluation queues, the evaluation
task's route) is set on the app once these are loaded (pipeline/cluster/celery_client.configure).
"""

import os

broker_url = os.environ.get("CLUSTERENV_REDIS_URL", "redis://127.0.0.1:6379/0")
# Results travel in task events (Flower shows them); nothing waits on a result backend.
task_ignore_result = True

# JSON only: no pickle on the wire, ever.
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
event_serializer = "json"


# A worker process that dies mid-task is the learner's to replace, not the broker's: it writes a
# chunk off after --lost-after-s (30 s) and dispatches another, and gives up an evaluation once
# the worker that took it stops beating. kombu's Redis transport can also redeliver it, by "ack
# emulation": each delivery is filed in an unacked hash and acked out of it, two broker round
# trips per task that were half of Celery's time between chunks (bench/overhead.py,
# docs/benchmarks.md). So that is off: a task is delivered at most once, except that a prefork
# worker whose child dies requeues the child's task at once (acks late + reject on worker lost;
# no round trip while all is well). CLUSTERENV_REDELIVER=1 turns it back on: an unacked task is
# redelivered after the visibility timeout (a worker looks for such tasks every 10 s).
def _flag(name: str, default: str) -> bool:
    value = os.environ.get(name, default)
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1
_visibility = int(os.environ.get("CLUSTERENV_VISIBILITY_TIMEOUT", "60"))
broker_transport_options = {
    "ack_emulation": _flag("CLUSTERENV_REDELIVER", "0"),
    # seconds, not the transport's default hour: a chunk takes milliseconds
    "visibility_timeout": _visibility,
}
broker_connection_retry_on_startup = True
# A task sent while the broker restarts waits for it (about half a minute), as the Redis clients
# of learner and workers do (pipeline/connect.py), instead of failing after Celery's 0.6 s.
task_publish_retry_policy = {
    "max_retries": 30,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 1.0,
}

# Task events are what Flower lists chunks from, but each costs the worker a publish: ~0.5 ms of
# CPU per task (bench/overhead.py, docs/journal.md). Off unless asked for, as in Celery itself:
# a running Flower turns them on in every worker (and again every 5 s for workers started later),
# `celery worker -E` keeps one worker's on, CLUSTERENV_TASK_EVENTS=1 every worker's and the
# learner's `task-sent` events too.
_task_events = _flag("CLUSTERENV_TASK_EVENTS", "0")
worker_send_task_events = _task_events
task_send_sent_event = _task_events
task_track_started = True

worker_hijack_root_logger = False
worker_concurrency = int(os.environ.get("CLUSTERENV_WORKER_CONCURRENCY", "0")) or None

# clusterenv's own worker settings (read by tasks/; Celery ignores names it does not know).
# A worker announces itself this often, and counts as gone once its key is this old.
clusterenv_heartbeat_every_s = float(os.environ.get("CLUSTERENV_HEARTBEAT_EVERY_S", "2"))
clusterenv_heartbeat_ttl_s = float(os.environ.get("CLUSTERENV_HEARTBEAT_TTL_S", "6"))
# Runs whose envs one worker process keeps alive at once; the least recently served is closed.
clusterenv_max_cached_runs = int(os.environ.get("CLUSTERENV_MAX_CACHED_RUNS", "2"))
