"""The small JSON arguments of Celery tasks: dataclasses checked field by field on both ends."""

from __future__ import annotations

import copy
import functools
import math
import types
import typing
from dataclasses import fields
from typing import Any, Self


class TaskArgsError(ValueError):
    """Task arguments that do not fit their dataclass; the message names the field."""


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _fits(value: Any, hint: Any) -> bool:
    """Does a decoded JSON value fit the annotation `hint`? bool is never an int or a float here,
    and a float is finite."""
    origin = typing.get_origin(hint)
    if origin is types.UnionType or origin is typing.Union:
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is Any:  # any JSON, but no NaN or Infinity anywhere in it (env kwargs, say)
        if isinstance(value, float):
            return math.isfinite(value)
        if isinstance(value, list):
            return all(_fits(v, Any) for v in value)
        if isinstance(value, dict):
            return all(_fits(v, Any) for v in value.values())
        return True
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # Python's JSON reads NaN and Infinity; no argument means them
        return (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if origin is dict:
        key, item = typing.get_args(hint) or (str, Any)
        return isinstance(value, dict) and all(
            _fits(k, key) and _fits(v, item) for k, v in value.items()
        )
    raise TypeError(f"task argument annotation {hint!r} is not a JSON type")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's field annotations, resolved once: `get_type_hints` re-evaluates the string
    annotations on every call, ~0.08 ms a task (a py-spy profile of a worker, 8 x 32 chunks)."""
    return typing.get_type_hints(cls)


class TaskArgs:
    """Base of dataclass task arguments: `to_json` out; `from_json` checks names and types, then
    `check`s. A field may itself be TaskArgs (a nested JSON object, e.g. ChunkRequest.behaviour):
    it is written with its own `to_json` and read with its own `from_json`."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: _json_of(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, data: Any, name: str | None = None) -> Self:
        """The arguments in `data`; TaskArgsError naming the first field that does not fit.
        `name` is what messages call them: the class's name, or a nested value's field path."""
        nested = name is not None
        name = name or cls.__name__
        if not isinstance(data, dict):
            raise TaskArgsError(f"{name}: expected a JSON object, got {_type_name(data)}")
        known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
        unknown = set(data) - set(known)
        if unknown:
            raise TaskArgsError(f"unknown {name} fields: {', '.join(sorted(unknown))}")
        hints = _hints(cls)
        values = {}
        for key, value in data.items():
            hint = hints[key]
            if isinstance(hint, type) and issubclass(hint, TaskArgs):
                values[key] = hint.from_json(value, f"{name}.{key}")
            elif _fits(value, hint):
                values[key] = value
            else:
                raise TaskArgsError(
                    f"{name}.{key} must be {_describe(hint)}, got {_type_name(value)} {value!r}"
                )
        try:
            args = cls(**values)
        except TypeError as exc:  # a required field is missing
            raise TaskArgsError(f"{name}: {exc}") from None
        try:
            args.check()
        except TaskArgsError as exc:
            if not nested:
                raise
            raise TaskArgsError(f"{name}: {exc}") from None
        return args

    def check(self) -> None:
        """Raise TaskArgsError naming what is wrong with these (well-typed) arguments."""


def _json_of(value: Any) -> Any:
    """A field's JSON form: nested arguments by their own `to_json`, anything else a deep copy."""
    return value.to_json() if isinstance(value, TaskArgs) else copy.deepcopy(value)


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is types.UnionType or origin is typing.Union:
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    if hint is type(None):
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a finite number", str: "a string"}
    if hint in names:
        return names[hint]
    if origin is list:
        return f"a list of {_describe(typing.get_args(hint)[0]).split(' ', 1)[-1]}s"
    if origin is dict:
        return "a JSON object"
    return str(hint)
