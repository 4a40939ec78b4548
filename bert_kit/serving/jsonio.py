"""JSON in and out of the server: orjson where it is installed (the `serve` extra), else the standard library.

Both give the same values. An embedding leaves as the model's float32 numbers: orjson writes each
as the shortest decimal that reads back as the same float32 (`0.1`, 9 digits at most), the standard
library as the exact double of that float32 (`0.10000000149011612`); read into float32, both are
the model's values bit for bit. orjson encodes a (n, 384) float32 array without making 384 Python
floats a row, about 25x faster than `json.dumps(array.tolist())` (10 us a vector against 270).

Reading: orjson first; whatever it refuses (invalid JSON, a lone surrogate escape such as
"\\ud800", 1e999, an integer of hundreds of digits, nesting past 1024 levels) is read again by the
standard library, so the errors and the values are those of `json.loads`. One difference stays:
orjson reads an integer past 64 bits as a float, so such a value is a number rather than an
integer in the checks (still a 422 naming its field).
"""

from __future__ import annotations

import json
import math
from typing import Any

try:
    import orjson
except ImportError:  # the standard library serves alone
    orjson = None

FAST = orjson is not None


class NotFinite(ValueError):
    """A float to encode is NaN or inf, which JSON cannot hold."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def loads(raw: bytes, fast: bool = FAST) -> Any:
    """The parsed body; the standard library's ValueError (or RecursionError) when it is not JSON."""
    if fast:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # refused: the standard library decides, with its own message
    return json.loads(raw, parse_constant=_no_constant)


def finite(content: Any) -> bool:
    """Whether every float in `content` (dicts, lists, NumPy arrays) is finite."""
    stack = [content]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "dtype"):  # a NumPy array or scalar
            if item.dtype.kind in "fc" and not _np().isfinite(item).all():
                return False
    return True


def _np() -> Any:
    import numpy

    return numpy


def _plain(value: Any) -> Any:
    """NumPy arrays and scalars for the standard library: their exact values as Python numbers."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(content: Any, fast: bool = FAST) -> bytes:
    """UTF-8 JSON of `content` (dicts, lists, str, numbers, NumPy arrays); NotFinite when a float
    in it is NaN or inf (never a `NaN` token, which is not JSON, nor orjson's `null`)."""
    if fast:
        if not finite(content):
            raise NotFinite("NaN or inf cannot be written as JSON")
        try:
            return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
        except (TypeError, orjson.JSONEncodeError):
            pass  # an integer past 64 bits, a lone surrogate, a non-contiguous array: as the standard library does
    try:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_plain)
    except ValueError as e:  # allow_nan=False: "Out of range float values are not JSON compliant"
        raise NotFinite(str(e)) from None
    return text.encode("utf-8")
