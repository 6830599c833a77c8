"""`clusterenv.host_shard`: host one remote-env shard for as long as its client wants it."""

from __future__ import annotations

from typing import Any

from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.remote_env.messages import HOST_SHARD_TASK, ShardSpec
from clusterenv.pipeline.remote_env.shard import Shard
from clusterenv.tasks.app import app


# acks_late=False on purpose: with the global acks_late=True a prefork worker whose child dies
# requeues the child's task, and with CLUSTERENV_REDELIVER=1 the Redis transport redelivers this
# hours-long task after visibility_timeout (60 s) while it still runs: either would start a
# duplicate shard. A worker lost mid-shard is noticed by the client (heartbeat) instead.
@app.task(bind=True, name=HOST_SHARD_TASK, acks_late=False)
def host_shard(self, **spec: Any) -> dict[str, Any]:
    shard_spec = ShardSpec.from_json(spec)
    worker = self.request.hostname or "worker"
    return Shard(connect(app.conf.broker_url, blocking=True), shard_spec, worker).serve()
