"""PostgreSQL one-dimensional arrays in the binary wire format, built here.

A group-commit batch sends every column of its multi-row writes as an array (the guarded
compare-and-swap's ``unnest``, queries.sql's ``_many`` statements): four or five arrays a task.
psycopg's generic list dumper inspects each list to choose an element type, then dumps it
element by element through its per-type dumpers; for the handful of element types taskward
sends, the format (``array_send``: dimensions, a has-nulls flag, the element type's oid, then
each element as its length and its binary form, -1 for NULL) is a few lines of ``struct``, and
building it here is much cheaper (measured:
docs/benchmarks.md#figures-that-justified-design-choices).

The store's PostgreSQL connections carry a binary dumper for ``PgArray`` that sends ``data``
as it is, under the array type's oid (``store.postgres.connection``). Elements are coerced to
the one Python type of the column first: an int among floats is a float8, a float in an
integer column an int (as ``int()`` does), JSON columns travel as their text.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final

_HEADER = struct.Struct("!iiIii")  # ndim 1, has-nulls flag, element oid, length, lower bound 1
_EMPTY = struct.Struct("!iiI")  # ndim 0, no nulls, element oid
_LENGTH = struct.Struct("!i")
_NULL: Final = b"\xff\xff\xff\xff"  # length -1


class PgArray:
    """A one-dimensional array already in PostgreSQL's binary format."""

    __slots__ = ("data",)
    element_oid: ClassVar[int]
    array_oid: ClassVar[int]

    def __init__(self, data: bytes) -> None:
        self.data = data


class TextArray(PgArray):
    __slots__ = ()
    element_oid = 25  # text
    array_oid = 1009  # text[]


class IntegerArray(PgArray):
    __slots__ = ()
    element_oid = 23  # int4
    array_oid = 1007  # integer[]


class Float8Array(PgArray):
    __slots__ = ()
    element_oid = 701  # float8
    array_oid = 1022  # float8[]


ARRAY_TYPES: Final = (TextArray, IntegerArray, Float8Array)

# Fixed-width elements: the struct packing (length, value) and the Python type coerced to.
_FIXED: Final[dict[type[PgArray], tuple[struct.Struct, int, Callable[[Any], Any]]]] = {
    IntegerArray: (struct.Struct("!ii"), 4, int),  # out of int4's range: struct.error
    Float8Array: (struct.Struct("!id"), 8, float),
}


def _framed(kind: type[PgArray], parts: list[bytes], count: int, nulls: int) -> PgArray:
    if not count:
        return kind(_EMPTY.pack(0, 0, kind.element_oid))
    return kind(_HEADER.pack(1, nulls, kind.element_oid, count, 1) + b"".join(parts))


def _element(kind: type[PgArray], value: Any) -> bytes:
    """One element in the array's format: its length, then its binary form (-1: NULL)."""
    if value is None:
        return _NULL
    if kind is TextArray:
        encoded: bytes = value.encode("utf-8")
        return _LENGTH.pack(len(encoded)) + encoded
    packing, width, coerce = _FIXED[kind]
    return packing.pack(width, coerce(value))


def _repeated(kind: type[PgArray], values: Sequence[Any]) -> PgArray | None:
    """The array of a column holding one value in every row (most of a group commit's
    columns: its status, reason, actor, time), built from that element once; None otherwise.
    ``list.count`` compares in C, so a column of several values costs one pass more. Values
    that compare equal encode equally: texts are equal strings, numbers coerce to one value
    (1, 1.0 and True are one integer or float8 element either way)."""
    count = len(values)
    if count < 2:
        return None
    first = values[0]
    if values.count(first) != count:
        return None
    return _framed(kind, [_element(kind, first) * count], count, 1 if first is None else 0)


def text_array(values: Sequence[str | None]) -> PgArray:
    """A text array; a value equal to the one before it (a batch's status, reason, actor,
    worker: most columns hold one value down the batch) is not encoded again, and a column of
    one value throughout is one element repeated (``_repeated``)."""
    repeated = _repeated(TextArray, values)
    if repeated is not None:
        return repeated
    parts: list[bytes] = []
    append = parts.append
    pack = _LENGTH.pack
    nulls = 0
    previous: str | None = None
    length = encoded = b""
    for value in values:
        if value is None:
            append(_NULL)
            nulls = 1
            continue
        if value != previous:
            encoded = value.encode("utf-8")
            length = pack(len(encoded))
            previous = value
        append(length)
        append(encoded)
    return _framed(TextArray, parts, len(values), nulls)


def fixed_array(kind: type[PgArray], values: Sequence[Any]) -> PgArray:
    """An integer (int4) or float8 array, each value coerced to the column's Python type."""
    repeated = _repeated(kind, values)
    if repeated is not None:
        return repeated
    packing, width, coerce = _FIXED[kind]
    pack = packing.pack
    parts: list[bytes] = []
    nulls = 0
    for value in values:
        if value is None:
            parts.append(_NULL)
            nulls = 1
        else:
            parts.append(pack(width, coerce(value)))
    return _framed(kind, parts, len(values), nulls)


_KINDS: Final = {"float8": Float8Array, "integer": IntegerArray}


def pg_array(pg_type: str, values: Sequence[Any]) -> PgArray:
    """``values`` as the binary array a ``:param::<pg_type>[]`` cast receives. ``jsonb``
    columns travel as text (their JSON text), cast element by element by the statement."""
    if pg_type in ("text", "jsonb"):
        return text_array(values)
    kind = _KINDS.get(pg_type)
    if kind is None:
        raise ValueError(f"no binary array encoding for {pg_type!r}")
    return fixed_array(kind, values)
