"""Observation and action specs of chunks, derived from an env's spaces (no server)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from clusterenv.pipeline.chunks.stream import transition_specs
from clusterenv.pipeline.codec import ArraySpec
from clusterenv.pipeline.spaces import (
    BoxActions,
    DiscreteActions,
    SpaceSpecs,
    action_spec,
    obs_spec,
)

FRAMES = gym.spaces.Box(0, 255, (10, 10, 4), np.uint8)


@pytest.mark.parametrize(
    "space, spec",
    [
        (gym.spaces.Box(-1.0, 1.0, (4,), np.float32), ArraySpec("<f4", (4,))),
        (FRAMES, ArraySpec("|u1", (10, 10, 4))),
        (gym.spaces.Box(-1.0, 1.0, (2, 3), np.float64), ArraySpec("<f8", (2, 3))),
    ],
)
def test_an_observation_keeps_its_dtype_and_shape(space, spec):
    assert obs_spec(space) == spec


@pytest.mark.parametrize(
    "space, part",
    [
        (gym.spaces.Discrete(3), "chunks carry Box observations, not Discrete(3)"),
        (gym.spaces.Box(0, 1, (2,), np.longdouble), "cannot travel in a chunk"),
    ],
)
def test_observations_chunks_cannot_carry_are_refused_by_name(space, part):
    with pytest.raises(ValueError, match=part.replace("(", r"\(").replace(")", r"\)")):
        obs_spec(space)


def test_a_discrete_action_is_an_int64_scalar_in_its_range():
    spec = action_spec(gym.spaces.Discrete(3, start=-1))
    assert spec == DiscreteActions(3, start=-1) and spec.array == ArraySpec("<i8", ())
    assert spec.problem(np.array([-1, 0, 1])) is None
    assert spec.problem(np.array([], np.int64)) is None
    assert spec.problem(np.array([0, 2])) == "action outside [-1, 2)"
    assert spec.problem(np.array([-2])) == "action outside [-1, 2)"


def test_output_indices_map_to_the_spaces_actions():
    outputs = np.array([[0.0, 5.0, 1.0], [9.0, 0.0, 0.0]])
    assert DiscreteActions(3).greedy(outputs).tolist() == [1, 0]
    assert DiscreteActions(3, start=10).greedy(outputs).tolist() == [11, 10]
    index = np.array([2, 0])
    assert DiscreteActions(3).from_index(index) is index  # start 0: nothing to do per step


def test_a_box_action_is_float32_values_within_its_bounds():
    spec = action_spec(
        gym.spaces.Box(np.array([-2.0, 0.0]), np.array([2.0, 1.0]), dtype=np.float32)
    )
    assert isinstance(spec, BoxActions) and spec.array == ArraySpec("<f4", (2,)) and spec.dim == 2
    assert spec.problem(np.array([[-2.0, 0.0], [2.0, 1.0]], np.float32)) is None
    assert spec.problem(np.array([[0.0, np.nan]], np.float32)) == "action is NaN or infinite"
    assert spec.problem(np.array([[-np.inf, 0.5]], np.float32)) == "action is NaN or infinite"
    assert (
        spec.problem(np.array([[0.0, 1.01]], np.float32))
        == "action outside the Box bounds [-2.0, 2.0]"
    )
    assert spec.problem(np.array([[-2.5, 0.5]], np.float32)).startswith("action outside")


def test_a_box_policys_values_in_minus_one_one_scale_to_the_bounds_and_never_past_them():
    spec = action_spec(
        gym.spaces.Box(np.array([-2.0, 0.0]), np.array([2.0, 1.0]), dtype=np.float32)
    )
    out = spec.from_index(np.array([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0], [1.0 + 1e-9, 0.5]]))
    assert out.dtype == np.float32 and out.shape == (4, 2)
    np.testing.assert_array_equal(out[:3], [[-2.0, 0.0], [0.0, 0.5], [2.0, 1.0]])
    assert spec.problem(out) is None  # rounding never steps over a bound
    # Greedy: the squashed mean (the first `dim` outputs; the log-stds follow).
    greedy = spec.greedy(np.array([[0.0, 100.0, -3.0, 5.0]]))
    np.testing.assert_allclose(greedy, [[0.0, 1.0]])


@pytest.mark.parametrize(
    "space, part",
    [
        (
            gym.spaces.MultiDiscrete([2, 3]),
            "chunks carry Discrete or Box actions, not MultiDiscrete",
        ),
        (gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), "with finite bounds"),
        (gym.spaces.Box(0, 5, (2,), np.int64), "float Box actions"),
    ],
)
def test_actions_chunks_cannot_carry_are_refused_by_name(space, part):
    with pytest.raises(ValueError, match=part):
        action_spec(space)


def test_transition_specs_follow_the_spaces():
    specs = transition_specs(SpaceSpecs.of(FRAMES, gym.spaces.Discrete(6)))
    assert specs["obs"] == specs["next_obs"] == ArraySpec("|u1", (10, 10, 4))
    assert specs["action"] == ArraySpec("<i8", ())
