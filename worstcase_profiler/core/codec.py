"""Plain-data encoding of the core's frozen dataclasses (core/types.py), for the sweep cache and
for what crosses vLLM's RPC between the API server and the workers (the serving validation).

encode(value) gives JSON-ready dicts, lists and scalars; decode(cls, data) rebuilds the frozen
value from them by the dataclass's own type hints, so a cache entry never goes through the
report schema. Unknown keys are rejected (ValueError): a file written by another layout is a
miss, not a half-filled value.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import lru_cache
from typing import Any


def encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    return value


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def decode(tp: Any, data: Any) -> Any:
    """Rebuild a value of type `tp` (a core dataclass, tuple[X, ...], X | None, a scalar)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        last: Exception | None = None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return decode(arg, data)
            except (TypeError, ValueError) as e:
                last = e
        raise ValueError(f"{data!r} matches none of {tp}: {last}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(data, list):
            raise ValueError(f"expected a list for {tp}, got {type(data).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v) for v in data)
        return tuple(decode(a, v) for a, v in zip(args, data, strict=True))
    if origin is typing.Literal:
        if data not in typing.get_args(tp):
            raise ValueError(f"{data!r} is not one of {typing.get_args(tp)}")
        return data
    if origin is dict or tp is dict:
        if not isinstance(data, dict):
            raise ValueError(f"expected an object for {tp}")
        return dict(data)
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise ValueError(f"expected an object for {tp.__name__}")
        hints = _hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown field(s) for {tp.__name__}: {sorted(unknown)}")
        return tp(**{k: decode(hints[k], v) for k, v in data.items()})
    if tp is Any:
        return data
    if tp is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if isinstance(tp, type) and not isinstance(data, tp):
        raise ValueError(f"expected {tp.__name__}, got {type(data).__name__}")
    if tp is int and isinstance(data, bool):
        raise ValueError("expected int, got bool")
    return data
