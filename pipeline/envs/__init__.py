"""Envs by id, the one place workers, the learner (for spaces) and `clusterenv eval` make them."""

from clusterenv.pipeline.envs.make import FAMILIES, make_env

__all__ = ["FAMILIES", "make_env"]
