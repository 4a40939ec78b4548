"""Request validation against the same JSON Schemas that the OpenAPI description publishes.

Each operation declares the JSON Schema of its request body; `check` walks a parsed body through
it and raises `InputError` naming the first field at fault ("inputs[3].context must be a
string, got number"), so the 422 message, the validation and the published description can never
disagree. Only the part of JSON Schema the operations use is understood: type, properties,
required, additionalProperties, items, minItems, maxItems, minimum, maximum, oneOf. `check`
recurses only as deep as the schema, so a deeply nested value costs no more than a shallow one.

`check_text` finds the strings that JSON allows and Unicode does not: a lone surrogate
("\ud800" escaped in the body) cannot be tokenized, printed or encoded as UTF-8.
"""

from __future__ import annotations

import re
from typing import Any

_TYPES = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float), "boolean": bool}
_SURROGATE = re.compile("[\ud800-\udfff]")


class InputError(ValueError):
    """A request the server refuses: `status` (413 for limits, 422 for wrong content) and the field at fault."""

    def __init__(self, field: str, message: str, status: int = 422):
        super().__init__(f"{field} {message}")
        self.field, self.status = field, status


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    for name in ("object", "array", "string", "integer", "number"):
        if isinstance(value, _TYPES[name]):
            return name
    return type(value).__name__


def describe(schema: dict, plural: bool = False) -> str:
    """A short English name of what a schema accepts: 'a string or an array of strings'."""
    if "oneOf" in schema:
        return " or ".join(describe(s, plural) for s in schema["oneOf"])
    kind = schema.get("type", "value")
    if kind == "array":
        n = schema.get("minItems")
        size = f"{n} " if n is not None and n == schema.get("maxItems") else ""
        inner = describe(schema["items"], plural=True) if "items" in schema else "values"
        text = f"array{'s' if plural else ''} of {size}{inner}"
    else:
        text = kind + ("s" if plural else "")
    return text if plural else ("an " if text[0] in "aeiou" else "a ") + text


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False  # JSON true is not 1
    return isinstance(value, _TYPES[kind])


def check(value: Any, schema: dict, where: str = "body") -> None:
    """Raise InputError(field, message) at the first place `value` does not fit `schema`."""
    if "oneOf" in schema:
        for option in schema["oneOf"]:
            try:
                check(value, option, where)
                return
            except InputError:
                continue
        raise InputError(where, f"must be {describe(schema)}, got {json_type(value)}")
    kind = schema.get("type")
    if kind is not None and not _is(value, kind):
        raise InputError(where, f"must be {describe(schema)}, got {json_type(value)}")
    if kind == "object":
        props = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                raise InputError(f"{where}.{key}" if where != "body" else key, "is required")
        for key, item in value.items():
            field = f"{where}.{key}" if where != "body" else key
            if key in props:
                check(item, props[key], field)
            elif schema.get("additionalProperties") is False:
                raise InputError(field, f"is not a known field (expected {', '.join(sorted(props))})")
    elif kind == "array":
        if len(value) < schema.get("minItems", 0):
            raise InputError(where, f"needs at least {schema['minItems']} item(s), got {len(value)}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise InputError(where, f"takes at most {schema['maxItems']} items, got {len(value)}")
        if "items" in schema:
            for i, item in enumerate(value):
                check(item, schema["items"], f"{where}[{i}]")
    elif kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            raise InputError(where, f"must be >= {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            raise InputError(where, f"must be <= {schema['maximum']}, got {value}")


def check_text(value: Any, where: str = "body") -> None:
    """Raise InputError naming the first string (or key) of `value` that holds a lone surrogate."""
    stack = [(value, where)]
    while stack:  # no recursion: the depth of a value is the client's
        item, where = stack.pop()
        if isinstance(item, str):
            found = None if item.isascii() else _SURROGATE.search(item)
            if found:
                raise InputError(where, f"holds a lone surrogate {found.group()!r} at character {found.start()}, "
                                 "which is not Unicode text")
        elif isinstance(item, list):
            stack.extend((x, f"{where}[{i}]") for i, x in reversed(list(enumerate(item))))
        elif isinstance(item, dict):
            for key in item:
                if not key.isascii() and _SURROGATE.search(key):
                    raise InputError(where, "has a key that holds a lone surrogate, which is not Unicode text")
            stack.extend((x, f"{where}.{k}" if where != "body" else k) for k, x in reversed(list(item.items())))
