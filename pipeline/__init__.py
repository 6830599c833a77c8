"""Everything between workers and learner; never imports `learner`.

Shared pieces here (keys, codec, connect, task arguments, the numpy policy, role interfaces); one
subpackage per job: `cluster` (registry, Celery client, embedded stack), `chunks` (the chunk path),
`sync` (weights and APS), `remote_env` (the DETACH Gymnasium env).
"""
