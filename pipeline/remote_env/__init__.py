"""DETACH Gymnasium mode: vector envs whose reset/step run on Celery workers.

from clusterenv.pipeline.remote_env import RemoteVectorEnv
envs = RemoteVectorEnv("CartPole-v1", 8, redis_url="redis://HOST:6379/0")

Stable-Baselines3: `from clusterenv.pipeline.remote_env.sb3 import RemoteSB3VecEnv` (not imported here, so
nothing in pipeline needs stable-baselines3).
"""

from clusterenv.pipeline.remote_env.group import PlacementError, RemoteEnvError, ShardTimeout
from clusterenv.pipeline.remote_env.messages import RemoteEnvOptions
from clusterenv.pipeline.remote_env.vector_env import RemoteEnv, RemoteVectorEnv

__all__ = [
    "PlacementError",
    "RemoteEnv",
    "RemoteEnvError",
    "RemoteEnvOptions",
    "RemoteVectorEnv",
    "ShardTimeout",
]
