"""The one Redis key schema and stream field names; nothing else spells a key."""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "clusterenv"

# Worker heartbeats are per broker, not per run: any worker serves any run.
WORKER_HEARTBEAT_PATTERN = f"{PREFIX}:worker:*"

# Celery's queues (Redis lists of those names). Collection (and the remote env's shards) go to
# Celery's default queue, evaluation to its own. Every worker takes from both; one started with
# `-Q clusterenv:eval` only evaluates, so an evaluation never takes a worker away from collection.
COLLECT_QUEUE = "celery"
EVAL_QUEUE = f"{PREFIX}:eval"

# Each run's learner status (`clusterenv status` finds them all).
RUN_STATUS_PATTERN = f"{PREFIX}:run:*:status"

# How long a run's keys outlive it (its stop key and stream, its status, evaluation results
# nobody read): late chunks still see `stop`, `clusterenv status` still shows the end state.
RUN_KEYS_TTL_S = 3600

# Stream entry fields: a JSON header plus one raw-bytes field per array.
FIELD_HEADER = b"header"
ARRAY_FIELD_PREFIX = b"a:"


def worker_heartbeat(hostname: str) -> str:
    return f"{PREFIX}:worker:{hostname}"


@dataclass(frozen=True)
class RunKeys:
    """All keys of one run, under `clusterenv:run:{run_id}:`."""

    run_id: str

    @property
    def base(self) -> str:
        return f"{PREFIX}:run:{self.run_id}"

    @property
    def stream(self) -> str:
        """Redis Stream of transition chunks, worker → learner."""
        return f"{self.base}:chunks"

    @property
    def group(self) -> str:
        """Consumer group the learner reads the stream with."""
        return "learner"

    @property
    def weights_latest(self) -> str:
        """Latest published weight version (an integer)."""
        return f"{self.base}:weights:latest"

    def weights(self, version: int) -> str:
        """Safetensors bytes of one weight version (expires)."""
        return f"{self.base}:weights:{version}"

    def probe(self, version: int) -> str:
        """Learner outputs on the reference states for one version (expires)."""
        return f"{self.base}:probe:{version}"

    def reference(self, ref_version: int) -> str:
        """A versioned batch of reference states the probes are computed on."""
        return f"{self.base}:reference:{ref_version}"

    @property
    def actor_counter(self) -> str:
        """INCR counter that gives each worker process a distinct actor index (seeds)."""
        return f"{self.base}:actors"

    @property
    def actor_slots(self) -> str:
        """Hash slot → the worker process ("hostname:pid") holding that slot of the run's
        exploration ladder (pipeline/chunks/slots.py)."""
        return f"{self.base}:actor-slots"

    @property
    def eval_results(self) -> str:
        """List of JSON eval results, worker RPUSH → learner LPOP."""
        return f"{self.base}:evals"

    @property
    def eval_takers(self) -> str:
        """Hash "{eval id}:{part}" → the registry name of the worker that took that evaluation
        part, so the learner gives the evaluation up as soon as that worker's heartbeat lapses."""
        return f"{self.base}:eval-takers"

    @property
    def chunk_takers(self) -> str:
        """Hash chunk id → the registry name of the worker that received its collect_chunk task,
        so the learner writes a dead worker's chunks off as soon as its heartbeat lapses."""
        return f"{self.base}:chunk-takers"

    @property
    def status(self) -> str:
        """JSON progress of the learner (steps, eval, version, state), refreshed every few seconds."""
        return f"{self.base}:status"

    @property
    def marker(self) -> str:
        """Written by the learner when the run starts and only then (and after a recovery): a
        broker that no longer has it lost the run's keys, whatever the learner re-wrote since."""
        return f"{self.base}:marker"

    @property
    def stop(self) -> str:
        """Set when the run ends, so workers drop its cached envs and late chunks stop."""
        return f"{self.base}:stopped"


# --- Remote Gymnasium env (DETACH mode): shards hosted on workers, stepped over Redis lists ---


def remote_env_client(session: str) -> str:
    """Liveness of one remote vector env's client process (TTL); shards exit when it lapses."""
    return f"{PREFIX}:renv:{session}:client"


def remote_env_replies(session: str) -> str:
    """The one list all shards of a remote vector env RPUSH their replies to (client BLMPOPs it)."""
    return f"{PREFIX}:renv:{session}:replies"


@dataclass(frozen=True)
class ShardKeys:
    """Keys of one env shard, under `clusterenv:renv:{session}:shard:{shard}:`.

    A re-placed shard gets a new shard number, so a late or zombie shard never reads the
    requests meant for its replacement.
    """

    session: str
    shard: int

    @property
    def base(self) -> str:
        return f"{PREFIX}:renv:{self.session}:shard:{self.shard}"

    @property
    def requests(self) -> str:
        """List of packed requests, client RPUSH → shard BLPOP."""
        return f"{self.base}:req"

    @property
    def heartbeat(self) -> str:
        """Set with a TTL by the shard while it lives; the client deletes it to disown a shard."""
        return f"{self.base}:hb"
