"""Job input as JSON text: checked whole before anything is written, never pickled.

Guarantees:

- ``Serializer.dumps`` returns text only for a value that survives the round trip
  ``loads(dumps(v)) == v``: dicts with ``str`` keys, lists, ``str``, ``int``, finite ``float``,
  ``bool`` and ``None``, plus values of a registered ``Codec``. Dataclass instances (their
  ``init`` fields) and pydantic models (``model_dump(mode="json", by_alias=True)``: pydantic
  owns its fields' JSON) are converted first, then checked like everything else.
- Anything else raises ``SerializationError`` naming the exact place (``input.items[3].when``,
  ``input["odd key"]``) and what to do, before any text exists: ``datetime``, ``date``,
  ``UUID``, ``Decimal``, ``set``, ``tuple``, ``bytes`` and other objects without a codec; NaN
  and infinities; a cycle (the error names both ends); non-``str`` keys; lone surrogates
  (``"\\ud800"``, not UTF-8); NUL characters (``"\\x00"``, which PostgreSQL ``jsonb`` refuses).
- Text larger than ``payload_limit`` bytes of UTF-8 raises ``PayloadTooLargeError`` with the
  size and the limit.
- A codec's value is stored as ``{"$type": tag, "value": ...}``. A user dict that has a
  ``"$type"`` key of its own is stored escaped, as ``{"$type": "$dict", "value": [[k, v], ...]}``,
  and comes back unchanged; tags starting with ``$`` are reserved.
- ``loads`` decodes tagged values with the registered codecs; an unknown tag, a malformed tag,
  NaN or invalid JSON raise ``DeserializationError``. ``loads(text, into=T)`` builds a ``T``:
  pydantic models with ``model_validate``, anything else with pydantic's ``TypeAdapter`` when
  pydantic is installed, and, without pydantic, dataclasses by calling them (nested dataclass,
  ``list[...]``, ``dict[str, ...]`` and optional fields rebuilt from their annotations, leaves
  not validated).

Choices and limits:

- Integers of any size are kept: JSON has no limit and ``jsonb`` stores them exactly, but a
  JavaScript reader loses precision above 2**53, and Python refuses to print integers longer
  than ``sys.get_int_max_str_digits()`` (an error naming the place).
- ``str``, ``int``, ``float``, ``dict`` and ``list`` subclasses (``StrEnum``, ``IntEnum``,
  ``OrderedDict``) are stored as their base value: a typed ``loads`` gets the enum back.
- A codec matches the exact type only, so a subclass never takes its base's codec and comes
  back as the base class. ``DATETIME`` keeps a ``zoneinfo`` zone (``...+02:00[Europe/Paris]``)
  and any other ``tzinfo`` as its fixed offset.
- pydantic is imported only by ``loads(into=...)`` (and only when installed); ``dumps`` looks
  for it in ``sys.modules``, since a value cannot be a pydantic model unless it is there.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import importlib.util
import inspect
import json
import math
import re
import sys
import types
import typing
import uuid
from collections.abc import Callable, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Generic, Literal, TypeAlias, TypeVar
from zoneinfo import ZoneInfo

from ultimat3.jobs.errors import (
    ConfigurationError,
    DeserializationError,
    PayloadTooLargeError,
    SerializationError,
)

__all__ = [
    "DATE",
    "DATETIME",
    "DECIMAL",
    "DEFAULT_PAYLOAD_LIMIT",
    "JSON",
    "UUID",
    "Codec",
    "Serializer",
    "input_type",
]

JSON: TypeAlias = "dict[str, JSON] | list[JSON] | str | int | float | bool | None"
T = TypeVar("T")

DEFAULT_PAYLOAD_LIMIT = 1_048_576
_TAG_KEY = "$type"
_ESCAPED_DICT = "$dict"
_JSON_TYPES = (dict, list, str, int, float, bool, type(None))
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclasses.dataclass(frozen=True, slots=True)
class Codec(Generic[T]):
    """Stores values of exactly ``type`` as ``{"$type": tag, "value": encode(v)}``.

    ``decode(encode(v)) == v`` must hold. ``encode`` may raise ``SerializationError`` (its
    cause and fix are kept, the path is added); ``decode`` receives the JSON value.
    """

    type: builtins.type[T]
    tag: str
    encode: Callable[[T], JSON]
    decode: Callable[[Any], T]


class Serializer:
    """Turns job input into JSON text and back; safe to share between threads."""

    __slots__ = ("_adapters", "_by_tag", "_by_type", "_tag_decoder", "codecs", "payload_limit")

    def __init__(
        self, codecs: Sequence[Codec[Any]] = (), payload_limit: int = DEFAULT_PAYLOAD_LIMIT
    ) -> None:
        if isinstance(payload_limit, bool) or not isinstance(payload_limit, int):
            raise ConfigurationError(
                f"payload_limit={payload_limit!r} is not a number of bytes",
                fix="write payload_limit=1_048_576 (1 MiB, the default)",
            )
        if payload_limit < 1:
            raise ConfigurationError(
                f"payload_limit={payload_limit} must be at least 1 byte",
                fix="write payload_limit=1_048_576 (1 MiB, the default)",
            )
        self.payload_limit = payload_limit
        self.codecs: tuple[Codec[Any], ...] = tuple(codecs)
        self._by_type: dict[type, Codec[Any]] = {}
        self._by_tag: dict[str, Codec[Any]] = {}
        self._adapters: dict[Any, Any] = {}
        self._tag_decoder = json.JSONDecoder(
            object_hook=self._untag, parse_constant=_refuse_constant
        )
        for codec in self.codecs:
            self._register(codec)

    def _register(self, codec: Codec[Any]) -> None:
        if not isinstance(codec, Codec):
            raise ConfigurationError(
                f"{codec!r} is not a Codec",
                fix="pass Codec(type=..., tag=..., encode=..., decode=...) objects",
            )
        if not isinstance(codec.tag, str) or not codec.tag or codec.tag.startswith("$"):
            raise ConfigurationError(
                f"codec tag {codec.tag!r} is not usable: tags are non-empty text and those "
                "starting with $ are reserved",
                fix='name the tag after the type, e.g. tag="money"',
            )
        if codec.type in _JSON_TYPES:
            raise ConfigurationError(
                f"a codec for {codec.type.__name__} would change a value JSON already stores",
                fix="remove the codec; convert such values before enqueueing instead",
            )
        if codec.type in self._by_type or codec.tag in self._by_tag:
            raise ConfigurationError(
                f"two codecs are registered for type {codec.type.__qualname__} "
                f"or for tag {codec.tag!r}",
                fix="keep one codec per type and per tag",
            )
        self._by_type[codec.type] = codec
        self._by_tag[codec.tag] = codec

    # -- encoding ---------------------------------------------------------------------------

    def dumps(self, value: Any, *, path: str = "input") -> str:
        """``value`` as compact JSON text, or ``SerializationError`` naming where it fails.

        ``path`` names the root in messages (``input``, ``input.items[3].when``).
        """
        try:
            converted = self._walk(value, set())
        except _Reject as reject:
            raise reject.error(path) from None
        except RecursionError:
            raise SerializationError(
                f"{path} nests too deep to store",
                path=path,
                fix="flatten the structure; deep nesting is also slow to decode",
            ) from None
        try:
            text = _encode(converted)
        except ValueError as exc:  # an int too long to print (sys.get_int_max_str_digits)
            where = path + "".join(_locate(converted, _is_unprintable_int) or ())
            raise SerializationError(
                f"{where} is an integer too long to write as text ({exc})",
                path=where,
                fix="store it as text, or raise the limit with sys.set_int_max_str_digits()",
            ) from None
        # An ASCII text has one byte per character: no copy of it to count them.
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        limit = self.payload_limit
        if size > limit:
            raise PayloadTooLargeError(
                f"{path} is {size:,} bytes of JSON, above the limit of {limit:,} bytes", path=path
            )
        return text

    def _walk(self, value: Any, stack: set[int]) -> Any:
        """``value`` checked and converted to JSON-ready data (the same object when it already
        is); raises ``_Reject`` carrying the path back up. Subclasses of the JSON types
        (``StrEnum``, ``IntEnum``, ``OrderedDict``) are stored as their base value."""
        kind = type(value)
        if kind is int or kind is bool or value is None:
            return value
        if kind is dict:
            return self._dict(value, stack)
        if kind is list:
            return self._list(value, stack)
        if kind is not str:
            codec = self._by_type.get(kind)  # never a JSON type's: ``_register``
            if codec is not None:
                return _tagged(codec.tag, self._walk(_run_encode(codec, value), stack))
        if isinstance(value, str):
            text = value if kind is str else str.__str__(value)
            if "\x00" in text or (not text.isascii() and _SURROGATE.search(text)):
                raise _Reject(*_bad_text(text, "text"))
            return value
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise _Reject(
                    f"is {value!r}, which JSON cannot store",
                    "use None for a missing number, or text such as 'inf'",
                )
            return value
        if isinstance(value, dict):
            return self._dict(value, stack)
        if isinstance(value, list):
            return self._list(value, stack)
        return self._other(value, stack)

    def _dict(self, obj: dict[Any, Any], stack: set[int]) -> dict[str, Any]:
        ident = id(obj)
        if ident in stack:
            raise _Reject(loop=ident)
        stack.add(ident)
        out: dict[str, Any] | None = None
        key: Any = None
        try:
            for key, item in obj.items():
                if not isinstance(key, str):
                    raise _Reject(
                        f"is a key of type {_type_name(key)}; JSON object keys are text",
                        "convert the keys with str(), or use a list of [key, value] pairs",
                    )
                if "\x00" in key or (not key.isascii() and _SURROGATE.search(key)):
                    raise _Reject(*_bad_text(key, "a key"))
                new = self._walk(item, stack)
                if new is not item:
                    if out is None:
                        out = dict(obj)
                    out[key] = new
        except _Reject as reject:
            reject.unwind(_key_segment(key), ident)
            raise
        finally:
            stack.discard(ident)
        result = obj if out is None else out
        if _TAG_KEY in result:
            return _tagged(_ESCAPED_DICT, [[k, v] for k, v in result.items()])
        return result

    def _list(self, obj: list[Any], stack: set[int]) -> list[Any]:
        ident = id(obj)
        if ident in stack:
            raise _Reject(loop=ident)
        stack.add(ident)
        out: list[Any] | None = None
        index = 0
        try:
            for index, item in enumerate(obj):
                new = self._walk(item, stack)
                if new is not item:
                    if out is None:
                        out = list(obj)
                    out[index] = new
        except _Reject as reject:
            reject.unwind(f"[{index}]", ident)
            raise
        finally:
            stack.discard(ident)
        return obj if out is None else out

    def _other(self, value: Any, stack: set[int]) -> Any:
        """An object that is no JSON type and has no codec: a dataclass or a pydantic model."""
        ident = id(value)
        if ident in stack:
            raise _Reject(loop=ident)
        converted = _convert_object(value)
        if converted is None:
            raise _Reject(*_unsupported(value))
        stack.add(ident)
        try:
            return self._dict(converted, stack)
        except _Reject as reject:
            # The fields belong to ``value``: a cycle back to it is reported at its place.
            if reject.loop == ident:
                reject.loop_len = len(reject.segments)
            raise
        finally:
            stack.discard(ident)

    # -- decoding ---------------------------------------------------------------------------

    def loads(self, text: str | bytes, into: Any = None) -> Any:
        """The value stored as ``text``; with ``into=T``, a ``T`` built from it.

        Raises ``DeserializationError`` with the cause when the text is not valid JSON, holds
        an unknown or malformed tag, or does not fit ``into``.
        """
        try:
            if isinstance(text, bytes | bytearray):
                text = bytes(text).decode("utf-8")
            # No tag can hide in text without "$type" (or an escaped "$"): parse in C alone.
            if _TAG_KEY not in text and "\\u0024" not in text:
                data = _PLAIN_DECODER.decode(text)
            else:
                data = self._tag_decoder.decode(text)
        except DeserializationError:
            raise
        except (ValueError, RecursionError) as exc:
            raise DeserializationError(f"the stored input is not valid JSON: {exc}") from None
        if into is None:
            return data
        return self._build(data, into)

    def _untag(self, obj: dict[str, Any]) -> Any:
        if _TAG_KEY not in obj:
            return obj
        tag = obj[_TAG_KEY]
        if len(obj) != 2 or "value" not in obj or not isinstance(tag, str):
            raise DeserializationError(
                f"the stored input has a malformed tagged value: {_preview(obj)}"
            )
        value = obj["value"]
        if tag == _ESCAPED_DICT:
            if not isinstance(value, list) or not all(
                isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                for pair in value
            ):
                raise DeserializationError(
                    f"the stored input has a malformed escaped object: {_preview(obj)}"
                )
            return {pair[0]: pair[1] for pair in value}
        codec = self._by_tag.get(tag)
        if codec is None:
            raise DeserializationError(
                f"the stored input has a value tagged {tag!r} and no codec for it is registered",
                fix=f"register the codec that wrote it: Serializer(codecs=[...]) with tag={tag!r}",
            )
        try:
            return codec.decode(value)
        except Exception as exc:
            raise DeserializationError(
                f"a value tagged {tag!r} could not be decoded: {exc!r}"
            ) from exc

    def _build(self, data: Any, into: Any) -> Any:
        pydantic = sys.modules.get("pydantic")
        if pydantic is None and _pydantic_installed():
            import pydantic
        if pydantic is not None:
            try:
                if isinstance(into, type) and issubclass(into, pydantic.BaseModel):
                    return typing.cast(Any, into).model_validate(data)
                adapter = self._adapters.get(into)
                if adapter is None:
                    adapter = self._adapters[into] = pydantic.TypeAdapter(into)
                return adapter.validate_python(data)
            except pydantic.ValidationError as exc:
                raise DeserializationError(
                    f"the stored input does not fit {_type_label(into)}: {exc}"
                ) from None
            except pydantic.PydanticUserError as exc:
                raise ConfigurationError(
                    f"pydantic cannot validate {_type_label(into)}: {exc}",
                    fix="annotate the input as a dataclass or a pydantic model",
                ) from None
        if not (isinstance(into, type) and dataclasses.is_dataclass(into)):
            raise ConfigurationError(
                f"loads(into={_type_label(into)}) needs pydantic for anything but a dataclass",
                fix="pip install 'ultimat3-jobs[pydantic]', or annotate the input as a dataclass",
            )
        return _build_plain(data, into, "input")


def input_type(fn: Callable[..., Any]) -> Any | None:
    """The annotation of ``fn``'s first parameter when it is a dataclass or a pydantic model.

    Anything else (no annotation, ``dict``, a name that cannot be resolved) gives ``None``:
    such a handler receives the decoded JSON as it is. Later parameters (a ``JobContext``) are
    not looked at, so their annotations may name things only imported for type checking.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    if not positional or positional[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return None
    first = positional[0]
    annotation = first.annotation
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):
        annotation = _resolve(fn, first.name, annotation)
    if not isinstance(annotation, type):
        return None
    if dataclasses.is_dataclass(annotation):
        return annotation
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and issubclass(annotation, pydantic.BaseModel):
        return annotation
    return None


# -- ready codecs ---------------------------------------------------------------------------


def _encode_datetime(value: datetime) -> str:
    if value.utcoffset() is None:
        raise SerializationError(
            f"is a naive datetime ({value.isoformat()}): without a time zone it names no instant",
            fix="make it aware, e.g. value.replace(tzinfo=UTC) or value.astimezone()",
        )
    text = value.isoformat()
    if isinstance(value.tzinfo, ZoneInfo):
        text += f"[{value.tzinfo.key}]"
    return text


def _decode_datetime(text: str) -> datetime:
    if text.endswith("]"):
        stamp, _, zone = text[:-1].partition("[")
        return datetime.fromisoformat(stamp).astimezone(ZoneInfo(zone))
    return datetime.fromisoformat(text)


DATETIME: Codec[datetime] = Codec(datetime, "datetime", _encode_datetime, _decode_datetime)
"""Aware ``datetime`` as ISO 8601 text (a ``zoneinfo`` zone kept as a ``[Area/City]`` suffix):
``App(..., codecs=[DATETIME])`` lets job input hold ``datetime`` values."""
DATE: Codec[date] = Codec(date, "date", date.isoformat, date.fromisoformat)
"""``date`` as ``YYYY-MM-DD``."""
UUID: Codec[uuid.UUID] = Codec(uuid.UUID, "uuid", str, uuid.UUID)
"""``uuid.UUID`` as its canonical text. (This is the codec, not the class: ``uuid.UUID`` is.)"""
DECIMAL: Codec[Decimal] = Codec(Decimal, "decimal", str, Decimal)
"""``decimal.Decimal`` as its exact text (``"1.10"`` keeps its trailing zero)."""


# -- internals ------------------------------------------------------------------------------


def _tagged(tag: str, value: Any) -> dict[str, Any]:
    return {_TAG_KEY: tag, "value": value}


class _Reject(Exception):
    """A value that cannot be stored; collects its path while unwinding the walk."""

    def __init__(self, reason: str = "", fix: str = "", *, loop: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fix = fix
        self.segments: list[str] = []  # innermost first
        self.loop = loop  # for a cycle: id() of the container it loops back to
        self.loop_len: int | None = None  # segments below that container

    def unwind(self, segment: str, container: int) -> None:
        self.segments.append(segment)
        if self.loop == container and self.loop_len is None:
            self.loop_len = len(self.segments)

    def error(self, root: str) -> SerializationError:
        forward = self.segments[::-1]
        where = root + "".join(forward)
        if self.loop is not None:
            depth = len(forward) - (self.loop_len or 0)
            target = root + "".join(forward[:depth])
            return SerializationError(
                f"{where} refers back to {target}, a cycle JSON cannot represent",
                path=where,
                fix="break the cycle: store an id or a copy instead of the object itself",
            )
        return SerializationError(f"{where} {self.reason}", path=where, fix=self.fix)


#: Compact JSON text of data the walk has checked (so no cycle check: it refused cycles).
_encode = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False
).encode


def _run_encode(codec: Codec[Any], value: Any) -> Any:
    try:
        return codec.encode(value)
    except SerializationError as exc:
        raise _Reject(exc.cause, exc.fix) from None
    except Exception as exc:
        raise _Reject(
            f"could not be encoded by the {codec.tag!r} codec: {exc!r}",
            "fix the codec's encode function, or convert the value before enqueueing",
        ) from None


def _convert_object(value: Any) -> dict[str, Any] | None:
    """A dataclass instance or pydantic model as a dict, or None for anything else."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        try:
            dumped = value.model_dump(mode="json", by_alias=True)
        except Exception as exc:
            raise _Reject(
                f"is a {_type_name(value)} that pydantic cannot dump as JSON: {exc}",
                "fix the model's field types or serializers",
            ) from None
        return typing.cast(dict[str, Any], dumped)
    return None


_BINARY_FIX = "store the data elsewhere and pass its id, or pass base64 text"
_FIXES: dict[str, str] = {
    "datetime.datetime": "pass App(..., codecs=[DATETIME]) (from ultimat3.jobs import DATETIME), "
    "or pass value.isoformat()",
    "datetime.date": "pass App(..., codecs=[DATE]) (from ultimat3.jobs import DATE), "
    "or pass value.isoformat()",
    "uuid.UUID": "pass App(..., codecs=[UUID]) (from ultimat3.jobs import UUID), "
    "or pass str(value)",
    "decimal.Decimal": "pass App(..., codecs=[DECIMAL]) (from ultimat3.jobs import DECIMAL), "
    "or pass str(value) to keep every digit",
    "tuple": "use a list",
    "set": "use a sorted list",
    "frozenset": "use a sorted list",
    "bytes": _BINARY_FIX,
    "bytearray": _BINARY_FIX,
    "memoryview": _BINARY_FIX,
}


def _unsupported(value: Any) -> tuple[str, str]:
    name = _type_name(value)
    fix = _FIXES.get(name) or (
        f'give the app a codec for it, App(..., codecs=[Codec({name}, "tag", encode, decode)]), '
        "or convert it to a dict, a list, text or a number "
        "(a dataclass or a pydantic model is converted for you)"
    )
    return f"has type {name}, which JSON cannot store", fix


def _bad_text(text: str, what: Literal["text", "a key"]) -> tuple[str, str]:
    if "\x00" in text:
        return (
            f"is {what} containing a NUL character (\\x00), which PostgreSQL cannot store",
            "remove the NUL characters, or pass binary data as base64 text",
        )
    return (
        f"is {what} containing a lone surrogate ({_SURROGATE.findall(text)[0]!r}), "
        "which is not valid UTF-8",
        "decode the source bytes with errors='replace', or fix the text's origin "
        "(often os.fsdecode or errors='surrogateescape')",
    )


def _key_segment(key: Any) -> str:
    if not isinstance(key, str):
        return f"[{key!r}]"
    if key.isidentifier():
        return f".{key}"
    return f"[{json.dumps(key, ensure_ascii=bool(_SURROGATE.search(key)))}]"


def _type_name(value: Any) -> str:
    kind = type(value)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def _type_label(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)


def _is_unprintable_int(value: Any) -> bool:
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    try:
        int.__repr__(value)
    except ValueError:
        return True
    return False


def _locate(value: Any, found: Callable[[Any], bool]) -> list[str] | None:
    """The path segments of the first leaf where ``found`` holds (slow; for error messages)."""
    if found(value):
        return []
    items: Any = ()
    if isinstance(value, dict):
        items = ((_key_segment(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    for segment, item in items:
        below = _locate(item, found)
        if below is not None:
            return [segment, *below]
    return None


def _refuse_constant(name: str) -> Any:
    raise DeserializationError(f"the stored input contains {name}, which is not JSON")


_PLAIN_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _preview(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 200 else text[:197] + "..."


@functools.cache
def _pydantic_installed() -> bool:
    return importlib.util.find_spec("pydantic") is not None


def _resolve(fn: Callable[..., Any], name: str, annotation: str) -> Any:
    """Evaluate one string annotation in ``fn``'s module, or None when it cannot be."""
    target: Any = inspect.unwrap(fn)
    if callable(target) and not (inspect.isfunction(target) or inspect.ismethod(target)):
        target = type(target).__call__
    globalns = getattr(target, "__globals__", {})
    holder = types.SimpleNamespace(__annotations__={name: annotation})
    try:
        return typing.get_type_hints(holder, globalns=globalns).get(name)
    except Exception:  # a name only imported under TYPE_CHECKING, a typo: treat as untyped
        return None


def _build_plain(data: Any, tp: Any, where: str) -> Any:
    """``data`` shaped into ``tp`` without pydantic: dataclasses rebuilt, leaves as they are."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise DeserializationError(
                f"{where} should be an object for {tp.__qualname__}, got {type(data).__name__}"
            )
        hints = typing.get_type_hints(tp)
        kwargs = {
            f.name: _build_plain(data[f.name], hints.get(f.name, Any), f"{where}.{f.name}")
            for f in dataclasses.fields(tp)
            if f.init and f.name in data
        }
        try:
            return tp(**kwargs)
        except (TypeError, ValueError) as exc:
            raise DeserializationError(f"{where} does not fit {tp.__qualname__}: {exc}") from None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is list and args and isinstance(data, list):
        return [_build_plain(item, args[0], f"{where}[{i}]") for i, item in enumerate(data)]
    if origin is dict and len(args) == 2 and isinstance(data, dict):
        return {k: _build_plain(v, args[1], f"{where}{_key_segment(k)}") for k, v in data.items()}
    if origin in (typing.Union, types.UnionType) and data is not None:
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:
            return _build_plain(data, members[0], where)
    return data
