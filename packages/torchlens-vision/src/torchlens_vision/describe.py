"""JSON-safe descriptions of transforms and image processors for the provenance record."""

from __future__ import annotations

import enum
from typing import Any

_MAX_REPR = 2000


def jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy: containers recurse, enums give their name, anything else its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if depth > 4:
        return repr(value)[:200]
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, depth + 1) for v in value]
    return repr(value)[:200]


def class_name(obj: Any) -> str:
    """``module.QualName`` of an object's class (of the function itself for functions)."""
    cls = obj if isinstance(obj, type) else type(obj)
    if callable(obj) and hasattr(obj, "__qualname__") and not isinstance(obj, type) \
            and type(obj).__name__ in ("function", "method", "builtin_function_or_method"):
        return f"{getattr(obj, '__module__', '')}.{obj.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _public_attrs(obj: Any) -> dict[str, Any]:
    attrs = getattr(obj, "__dict__", {})
    return {k: jsonable(v) for k, v in attrs.items()
            if not k.startswith("_") and k != "training" and not callable(v)}


def describe_transform(obj: Any) -> dict[str, Any]:
    """Class, parameters and repr of a torchvision-style transform (Compose steps included)."""
    facts: dict[str, Any] = {"class": class_name(obj), "repr": repr(obj)[:_MAX_REPR]}
    steps = getattr(obj, "transforms", None)
    if isinstance(steps, (list, tuple)):
        facts["steps"] = [describe_transform(s) for s in steps]
    else:
        facts["params"] = _public_attrs(obj)
    return facts


def describe_processor(obj: Any) -> dict[str, Any]:
    """Class and ``to_dict()`` parameters of a Hugging Face image processor."""
    try:
        params = jsonable(obj.to_dict())
    except Exception:  # a processor that cannot serialize still gets its repr
        params = {}
    return {"class": class_name(obj), "params": params,
            "name_or_path": jsonable(getattr(obj, "name_or_path", None))}
