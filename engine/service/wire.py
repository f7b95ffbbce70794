"""The wire format between the model server and its clients: MessagePack, with numpy arrays and the engine's
own dataclasses kept as they are.

    data = encode(record)                         # bytes; a PrefillRecord, a RoomState, a job's result ...
    record = decode(data)                         # the same dataclasses back, arrays as numpy (client side)
    params = decode(data, classes=REQUEST_TYPES)  # server side: plain data and the few request types only

A record crosses as a map with a `__dc__` key naming its class (`engine.core.records.DecodeRecord`) and its
fields; an array as an extension (dtype, shape, raw bytes: no copy through lists); a tuple, a set or a
complex value keeps its type. What a server decodes from a client is restricted: a class outside `classes`
is refused, so a request body can never name something to construct. A client decodes any dataclass
defined under `engine.` (it trusts the server it was pointed at). vLLM's engine core and its API server
speak MessagePack to each other for the same reasons (vllm/v1/serial_utils.py).

The JSON form for people (`to_plain`) writes the same structure with arrays as nested lists.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import math
from pathlib import PurePath
from typing import Any, Iterable, Iterator, Mapping

import msgpack
import numpy as np

from engine.errors import InvalidRequestError

ARRAY, TUPLE, SET, FROZENSET = 1, 2, 3, 4       # MessagePack extension codes
CLASS_KEY = "__dc__"
ENGINE_PREFIX = "engine."
MAX_BUFFER = 2**31 - 1                          # largest single message the stream reader accepts


class WireError(InvalidRequestError):
    """Bytes that are not a message of this format, or that name a type the reader does not accept."""


def encode(value: Any) -> bytes:
    """One value as MessagePack bytes (dataclasses, numpy arrays and scalars, tuples, sets, enums, tensors)."""
    return msgpack.packb(value, default=_default, strict_types=True, use_bin_type=True)


def _default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return msgpack.ExtType(ARRAY, _array_bytes(value))
    if isinstance(value, tuple):
        return msgpack.ExtType(TUPLE, encode(list(value)))
    if isinstance(value, frozenset):
        return msgpack.ExtType(FROZENSET, encode(list(value)))
    if isinstance(value, set):
        return msgpack.ExtType(SET, encode(list(value)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {CLASS_KEY: _class_name(type(value)),
                **{f.name: getattr(value, f.name) for f in dataclasses.fields(value)}}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, np.generic):
        return value.item()
    for kind in (bool, int, float, str, bytes, list, dict):        # subclasses (strict_types sends them here)
        if isinstance(value, kind):
            return kind(value)
    if type(value).__module__ == "torch":                           # a tensor, a device, a dtype
        return _torch_value(value)
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"cannot send a {type(value).__name__} over the wire")


def _torch_value(value: Any) -> Any:
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return str(value).removeprefix("torch.")


def _array_bytes(array: np.ndarray) -> bytes:
    array = np.ascontiguousarray(array)
    if array.dtype.hasobject:
        raise TypeError("arrays of Python objects cannot be sent")
    header = msgpack.packb([array.dtype.str, list(array.shape)])
    return header + array.tobytes()


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# --- reading --------------------------------------------------------------------------------------------------

class _Reader:
    """Turns maps with a class key back into dataclasses, where allowed."""

    def __init__(self, classes: Mapping[str, type] | None):
        self.classes = classes                     # None: any dataclass under engine.

    def ext(self, code: int, data: bytes) -> Any:
        if code == ARRAY:
            return _array_from(data)
        if code in (TUPLE, SET, FROZENSET):
            items = self.unpack(data)
            return {TUPLE: tuple, SET: set, FROZENSET: frozenset}[code](items)
        raise WireError(f"unknown extension type {code}")

    def object(self, data: dict) -> Any:
        name = data.get(CLASS_KEY)
        if name is None:
            return data
        cls = self.resolve(name)
        values = {k: v for k, v in data.items() if k != CLASS_KEY}
        return _build(cls, values)

    def resolve(self, name: Any) -> type:
        if self.classes is not None:
            cls = self.classes.get(name) if isinstance(name, str) else None
            if cls is None:
                raise WireError(f"{str(name)[:80]!r} is not a type this server accepts")
            return cls
        return _engine_class(name)

    def unpack(self, data: bytes) -> Any:
        return msgpack.unpackb(data, **self.options())

    def options(self) -> dict[str, Any]:
        return dict(ext_hook=self.ext, object_hook=self.object, strict_map_key=False, raw=False)


def _array_from(data: bytes) -> np.ndarray:
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    try:
        dtype, shape = next(unpacker)
        start = unpacker.tell()
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise WireError("arrays of Python objects are not accepted")
        count = math.prod(shape)
        return np.frombuffer(data, dtype=dt, count=count, offset=start).reshape(shape).copy()
    except WireError:
        raise
    except Exception as err:  # noqa: BLE001 - malformed bytes from the network are a message, not a crash
        raise WireError(f"a malformed array ({type(err).__name__})") from None


def _engine_class(name: Any) -> type:
    if not isinstance(name, str) or not name.startswith(ENGINE_PREFIX):
        raise WireError(f"{str(name)[:80]!r} is not an engine type")
    module_name, _, qualname = name.rpartition(".")
    while module_name:                                 # nested classes: engine.x.Outer.Inner
        try:
            obj: Any = importlib.import_module(module_name)
            break
        except ModuleNotFoundError:
            module_name, _, outer = module_name.rpartition(".")
            qualname = f"{outer}.{qualname}"
    else:
        raise WireError(f"no module for {name!r}")
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise WireError(f"{name!r} is not an engine dataclass")
    return obj


def _build(cls: type, values: dict[str, Any]) -> Any:
    """The dataclass with exactly these field values (no __init__ run: a frozen one is filled the same way)."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise WireError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
    obj = cls.__new__(cls)
    for f in dataclasses.fields(cls):
        if f.name in values:
            value = values[f.name]
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise WireError(f"{cls.__name__} needs its field {f.name!r}")
        object.__setattr__(obj, f.name, value)
    return obj


def decode(data: bytes, classes: Mapping[str, type] | None = None) -> Any:
    """Bytes from `encode` back to values. `classes`: the only dataclasses allowed (by `class_names`); None: any
    engine dataclass (for a client reading its server)."""
    reader = _Reader(classes)
    try:
        return reader.unpack(data)
    except WireError:
        raise
    except Exception as err:  # noqa: BLE001 - malformed bytes are a message, not a crash
        raise WireError(f"the body is not a valid MessagePack message ({type(err).__name__})") from None


def class_names(*classes: type) -> dict[str, type]:
    """The `classes` argument of `decode` for these dataclasses."""
    return {_class_name(c): c for c in classes}


def stream(chunks: Iterable[bytes], classes: Mapping[str, type] | None = None) -> Iterator[Any]:
    """Values from a byte stream that holds `encode`d messages one after another (a streamed response)."""
    unpacker = msgpack.Unpacker(**_Reader(classes).options(), max_buffer_size=MAX_BUFFER)
    for chunk in chunks:
        unpacker.feed(chunk)
        yield from unpacker


# --- JSON for people -----------------------------------------------------------------------------------------

def to_plain(value: Any) -> Any:
    """The same structure as JSON-able values: dataclasses as maps with their class's short name under `type`,
    arrays as nested lists, non-finite floats as null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__,
                **{f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, np.ndarray):
        return to_plain(value.tolist())
    if isinstance(value, np.generic):
        return to_plain(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if type(value).__module__ == "torch":
        return to_plain(_torch_value(value))
    return str(value)                                               # a path, and anything else: its text
