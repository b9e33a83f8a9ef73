from __future__ import annotations

import copy
import dataclasses
import enum
import json
import math
import subprocess
import sys
import uuid
from collections import OrderedDict
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ultimat3.jobs import serialization
from ultimat3.jobs.errors import (
    ConfigurationError,
    DeserializationError,
    PayloadTooLargeError,
    SerializationError,
)
from ultimat3.jobs.serialization import (
    DATE,
    DATETIME,
    DECIMAL,
    UUID,
    Codec,
    Serializer,
    input_type,
)

if TYPE_CHECKING:
    from ultimat3.jobs.job import JobContext

PLAIN = Serializer()
ALL = Serializer(codecs=[DATETIME, DATE, UUID, DECIMAL])
WHEN = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)


@dataclasses.dataclass
class Item:
    sku: str
    when: Any = None


@dataclasses.dataclass
class Order:
    id: int
    items: list[Item]
    note: Item | None = None
    total: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        self.total = len(self.items)


class Model(pydantic.BaseModel):
    name: str
    at: datetime
    count: int = 0
    ratio: float = 1.0
    tag: str = pydantic.Field(default="x", alias="tagName")


class Color(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


def rejected(value: Any, serializer: Serializer = PLAIN) -> SerializationError:
    with pytest.raises(SerializationError) as info:
        serializer.dumps(value)
    error = info.value
    assert error.path in error.cause
    assert error.fix
    return error


# -- what is refused, and where ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "path", "fragment"),
    [
        ({"items": [1, 2, 3, Item("a", WHEN)]}, "input.items[3].when", "datetime"),
        ({"odd key": {1, 2}}, 'input["odd key"]', "set"),
        ({"a": frozenset()}, "input.a", "frozenset"),
        (date(2026, 1, 1), "input", "date"),
        ([uuid.UUID(int=1)], "input[0]", "UUID"),
        ({"price": Decimal("1.10")}, "input.price", "Decimal"),
        ({"raw": b"\x00"}, "input.raw", "bytes"),
        ({"raw": bytearray(b"x")}, "input.raw", "bytearray"),
        ({"pair": (1, 2)}, "input.pair", "tuple"),
        ({"o": object()}, "input.o", "object"),
        ({"d": timedelta(1)}, "input.d", "timedelta"),
        ({"x": math.nan}, "input.x", "nan"),
        ({"x": [math.inf]}, "input.x[0]", "inf"),
        ({"x": -math.inf}, "input.x", "-inf"),
        ({"m": {1: "a"}}, "input.m[1]", "key of type int"),
        ({"m": {None: "a"}}, "input.m[None]", "key of type NoneType"),
        ({"m": {(1, 2): "a"}}, "input.m[(1, 2)]", "key of type tuple"),
        ({"s": "a\ud800b"}, "input.s", "lone surrogate"),
        ("\ud800", "input", "lone surrogate"),
        (["é", "\udc80"], "input[1]", "lone surrogate"),
        ("\x00", "input", "NUL"),
        ({"\udfff": 1}, 'input["\\udfff"]', "lone surrogate"),
        (["ok", "a\x00b"], "input[1]", "NUL"),
        ({"k\x00": 1}, 'input["k\\u0000"]', "NUL"),
        ({"a-b": {"c d": [0, {"é": float("nan")}]}}, 'input["a-b"]["c d"][1].é', "nan"),
    ],
)
def test_refused_with_the_exact_path(value: Any, path: str, fragment: str) -> None:
    error = rejected(value)
    assert error.path == path
    assert fragment in error.cause


def test_fixes_say_what_to_do() -> None:
    assert "DATETIME" in rejected(WHEN).fix
    assert "list" in rejected((1,)).fix
    assert "sorted list" in rejected({1}).fix
    assert "base64" in rejected(b"").fix
    assert "Codec" in rejected(object()).fix
    assert "str(" in rejected({1: 2}).fix


def test_a_cycle_names_both_ends() -> None:
    loop: list[Any] = []
    loop.append(loop)
    error = rejected(loop)
    assert error.path == "input[0]"
    assert "refers back to input," in error.cause

    inner: dict[str, Any] = {"y": []}
    outer = {"x": inner}
    inner["y"].append(inner)
    error = rejected(outer)
    assert error.path == "input.x.y[0]"
    assert "refers back to input.x," in error.cause


def test_a_cycle_through_a_dataclass() -> None:
    @dataclasses.dataclass
    class Node:
        child: Any = None

    node = Node()
    node.child = {"back": [node]}
    error = rejected({"root": node})
    assert error.path == "input.root.child.back[0]"
    assert "refers back to input.root," in error.cause


def test_shared_values_are_not_cycles() -> None:
    shared = [1, 2]
    assert PLAIN.dumps({"a": shared, "b": shared}) == '{"a":[1,2],"b":[1,2]}'


def test_too_deep() -> None:
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    assert "too deep" in rejected(deep).cause


def test_path_root_is_configurable() -> None:
    with pytest.raises(SerializationError) as info:
        PLAIN.dumps({"a": {1}}, path="job.input")
    assert info.value.path == "job.input.a"


def test_big_integers_are_kept() -> None:
    for n in (2**63, -(2**64), 10**100):
        assert PLAIN.loads(PLAIN.dumps({"n": n})) == {"n": n}


def test_an_integer_too_long_to_print_is_refused_at_its_path() -> None:
    error = rejected({"a": [1, 10**5000]})
    assert error.path == "input.a[1]"
    assert "too long" in error.cause


def test_dumps_does_not_touch_the_value() -> None:
    value = {"$type": "x", "order": Order(1, [Item("a")]), "n": [1.5, None]}
    before = copy.deepcopy(value)
    PLAIN.dumps(value)
    assert value == before


# -- what is accepted -------------------------------------------------------------------------


def test_compact_and_not_ascii_escaped() -> None:
    assert PLAIN.dumps({"a": "é", "b": [1, 2.5, True, None]}) == '{"a":"é","b":[1,2.5,true,null]}'
    assert PLAIN.dumps("x") == '"x"'
    assert PLAIN.dumps(None) == "null"


def test_subclasses_are_stored_as_their_base() -> None:
    text = PLAIN.dumps({"c": Color.RED, "l": Level.HIGH, "o": OrderedDict(a=1)})
    assert text == '{"c":"red","l":3,"o":{"a":1}}'
    assert rejected({"c": Color.RED, "s": enum.StrEnum("S", {"A": "a\x00"}).A}).path == "input.s"


def test_dataclasses_are_converted() -> None:
    order = Order(7, [Item("a"), Item("b", "soon")], note=Item("n"))
    data = json.loads(PLAIN.dumps(order))
    assert data == {
        "id": 7,
        "items": [{"sku": "a", "when": None}, {"sku": "b", "when": "soon"}],
        "note": {"sku": "n", "when": None},
    }  # ``total`` is init=False: rebuilt by the constructor, not stored


def test_pydantic_models_dump_their_own_json() -> None:
    model = Model(name="a", at=WHEN, tagName="t")
    data = json.loads(PLAIN.dumps({"m": model}))
    assert data == {
        "m": {"name": "a", "at": "2026-03-29T01:30:00Z", "count": 0, "ratio": 1.0, "tagName": "t"}
    }
    error = rejected({"m": Model(name="a", at=WHEN, ratio=math.nan)})
    assert error.path == "input.m.ratio"


JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))
)
KEYS = st.sampled_from(["$type", "value", "$dict", "$$type", "a"]) | st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=8
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(KEYS, children, max_size=5),
    max_leaves=30,
)


@given(JSON_VALUES)
def test_round_trip(value: Any) -> None:
    assert PLAIN.loads(PLAIN.dumps(value)) == value
    assert ALL.loads(ALL.dumps(value)) == value


def test_a_user_dict_with_a_type_key_is_escaped_and_comes_back() -> None:
    looks_tagged = {"$type": "datetime", "value": "2026-01-01T00:00:00+00:00"}
    text = ALL.dumps({"outer": looks_tagged})
    assert ALL.loads(text) == {"outer": looks_tagged}
    nested = {"$type": {"$type": [{"$type": None}]}, "value": WHEN}
    assert ALL.loads(ALL.dumps(nested)) == nested


# -- codecs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        WHEN,
        datetime(2026, 3, 29, 3, 30, 0, 123456, tzinfo=ZoneInfo("Europe/Paris")),
        datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=ZoneInfo("Europe/Paris")),
        datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-3, minutes=-30))),
        date(2026, 2, 28),
        uuid.UUID("0190b6c2-7f8a-7c3e-9d2b-123456789abc"),
        Decimal("1.10"),
        Decimal("-0.000000000000000000000001"),
    ],
)
def test_ready_codecs_round_trip(value: Any) -> None:
    back = ALL.loads(ALL.dumps({"v": [value]}))["v"][0]
    assert back == value
    assert type(back) is type(value)
    assert str(back) == str(value)
    if isinstance(value, datetime):
        assert back.tzinfo == value.tzinfo
        assert back.utcoffset() == value.utcoffset()


def test_tagged_shape() -> None:
    assert json.loads(ALL.dumps(uuid.UUID(int=0))) == {
        "$type": "uuid",
        "value": "00000000-0000-0000-0000-000000000000",
    }
    paris = datetime(2026, 7, 1, 12, tzinfo=ZoneInfo("Europe/Paris"))
    assert json.loads(ALL.dumps(paris))["value"] == "2026-07-01T12:00:00+02:00[Europe/Paris]"


def test_codecs_are_not_enabled_by_default() -> None:
    rejected(WHEN)
    with pytest.raises(DeserializationError) as info:
        PLAIN.loads(ALL.dumps(WHEN))
    assert "'datetime'" in info.value.cause
    assert "register" in info.value.fix


def test_a_naive_datetime_is_refused_with_a_fix() -> None:
    error = rejected({"at": datetime(2026, 1, 1)}, ALL)
    assert error.path == "input.at"
    assert "naive" in error.cause
    assert "tzinfo" in error.fix


def test_a_codec_matches_the_exact_type_only() -> None:
    dates_only = Serializer(codecs=[DATE])
    assert rejected(WHEN, dates_only).path == "input"  # a datetime is a date subclass


class Point:
    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)


POINT = Codec(Point, "point", lambda p: {"x": p.x, "y": p.y}, lambda d: Point(d["x"], d["y"]))


def test_a_user_codec() -> None:
    points = Serializer(codecs=[POINT])
    value = {"path": [Point(1, 2), Point(3, 4)]}
    assert points.loads(points.dumps(value)) == value


def test_what_a_codec_returns_is_checked_too() -> None:
    bad = Serializer(codecs=[Codec(Point, "point", lambda p: {"xs": {p.x}}, lambda d: d)])
    assert rejected({"p": Point(1, 2)}, bad).path == "input.p.xs"


def test_a_failing_codec() -> None:
    def explode(value: Point) -> Any:
        raise RuntimeError("boom")

    failing = Serializer(codecs=[Codec(Point, "point", explode, lambda d: d)])
    error = rejected([Point(1, 2)], failing)
    assert error.path == "input[0]"
    assert "'point' codec" in error.cause
    assert "boom" in error.cause

    def refuse(value: Any) -> Point:
        raise ValueError("nope")

    strict = Serializer(codecs=[Codec(Point, "point", lambda p: p.x, refuse)])
    with pytest.raises(DeserializationError, match="nope"):
        strict.loads(strict.dumps(Point(1, 2)))


@pytest.mark.parametrize(
    "codecs",
    [
        [DATE, Codec(date, "day", str, date.fromisoformat)],
        [DATE, Codec(datetime, "date", str, datetime.fromisoformat)],
        [Codec(Point, "$point", str, str)],
        [Codec(Point, "", str, str)],
        [Codec(dict, "dict", str, str)],
        [Codec(str, "text", str, str)],
        ["not a codec"],
    ],
)
def test_bad_codecs(codecs: list[Any]) -> None:
    with pytest.raises(ConfigurationError) as info:
        Serializer(codecs=codecs)
    assert info.value.fix


# -- loads ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "not valid JSON"),
        ("[1,]", "not valid JSON"),
        ('{"x": NaN}', "NaN"),
        ("[Infinity]", "Infinity"),
        ('{"$type":"nope","value":1}', "'nope'"),
        ('{"$type":"uuid","value":"1","extra":2}', "malformed"),
        ('{"$type":1,"value":1}', "malformed"),
        ('{"$type":"$dict","value":3}', "malformed escaped"),
        ('{"$type":"$dict","value":[[1,2]]}', "malformed escaped"),
        ('{"$type":"uuid","value":"not-a-uuid"}', "'uuid'"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ],
)
def test_loads_failures(text: str, fragment: str) -> None:
    with pytest.raises(DeserializationError) as info:
        ALL.loads(text)
    assert fragment in info.value.cause


def test_loads_bytes_and_escaped_tag_keys() -> None:
    assert PLAIN.loads(b'{"a":1}') == {"a": 1}
    assert ALL.loads('{"\\u0024type":"uuid","value":"' + str(uuid.UUID(int=5)) + '"}') == uuid.UUID(
        int=5
    )


# -- payload limit ----------------------------------------------------------------------------


def test_the_limit_at_the_boundary() -> None:
    value = {"data": "x" * 100}
    size = len(PLAIN.dumps(value).encode())
    assert Serializer(payload_limit=size).dumps(value)
    with pytest.raises(PayloadTooLargeError) as info:
        Serializer(payload_limit=size - 1).dumps(value)
    assert f"{size:,} bytes" in info.value.cause
    assert f"{size - 1:,} bytes" in info.value.cause
    assert info.value.path == "input"
    assert "elsewhere" in info.value.fix


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_the_limit_counts_utf8_bytes(char: str) -> None:
    value = char * 10
    size = len(json.dumps(value, ensure_ascii=False).encode())
    assert size > len(value) + 2
    assert Serializer(payload_limit=size).dumps(value)
    with pytest.raises(PayloadTooLargeError):
        Serializer(payload_limit=size - 1).dumps(value)


def test_the_default_limit_is_one_mebibyte() -> None:
    assert PLAIN.payload_limit == 1_048_576
    PLAIN.dumps("x" * (1_048_576 - 2))
    with pytest.raises(PayloadTooLargeError):
        PLAIN.dumps("x" * (1_048_576 - 1))


@pytest.mark.parametrize("limit", [0, -1, True, "1MB", 1.5])
def test_bad_limit(limit: Any) -> None:
    with pytest.raises(ConfigurationError):
        Serializer(payload_limit=limit)


# -- typed inputs -----------------------------------------------------------------------------


def handler_dc(order: Order, ctx: JobContext) -> None:
    """``JobContext`` is imported for type checking only: it cannot be resolved at runtime."""


def handler_model(model: Model) -> None: ...


def handler_dict(data: dict[str, Any]) -> None: ...


def handler_untyped(data, ctx): ...


def handler_none() -> None: ...


def handler_varargs(*args: Order) -> None: ...


class Handlers:
    def method(self, order: Order) -> None: ...

    def __call__(self, model: Model) -> None: ...


def test_input_type() -> None:
    assert input_type(handler_dc) is Order
    assert input_type(handler_model) is Model
    assert input_type(handler_dict) is None
    assert input_type(handler_untyped) is None
    assert input_type(handler_none) is None
    assert input_type(handler_varargs) is None
    assert input_type(Handlers().method) is Order
    assert input_type(Handlers()) is Model
    assert input_type(len) is None


def test_loads_into_a_pydantic_model() -> None:
    model = Model(name="a", at=WHEN, count=2, tagName="t")
    assert PLAIN.loads(PLAIN.dumps(model), into=Model) == model
    with pytest.raises(DeserializationError) as info:
        PLAIN.loads('{"name": "a"}', into=Model)
    assert "Model" in info.value.cause
    assert "at" in info.value.cause


def test_loads_into_a_dataclass_with_pydantic() -> None:
    order = Order(1, [Item("a", WHEN)], note=Item("n"))
    back = ALL.loads(ALL.dumps(order), into=Order)
    assert back == order
    assert back.total == 1
    assert isinstance(back.items[0], Item)
    with pytest.raises(DeserializationError):
        PLAIN.loads('{"id": "not a number", "items": []}', into=Order)


def test_loads_into_other_types_with_pydantic() -> None:
    assert PLAIN.loads("[1, 2]", into=list[int]) == [1, 2]
    with pytest.raises(DeserializationError):
        PLAIN.loads('["x"]', into=list[int])
    with pytest.raises(ConfigurationError, match="pydantic cannot validate Point"):
        PLAIN.loads("{}", into=Point)


def test_loads_into_a_dataclass_without_pydantic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "pydantic")
    monkeypatch.setattr(serialization, "_pydantic_installed", lambda: False)
    order = Order(1, [Item("a", WHEN), Item("b")], note=Item("n"))
    back = ALL.loads(ALL.dumps(order), into=Order)
    assert back == order
    assert isinstance(back.items[1], Item)
    assert isinstance(back.note, Item)
    assert ALL.loads('{"id": 2, "items": [], "note": null}', into=Order) == Order(2, [])
    with pytest.raises(DeserializationError, match="sku"):
        ALL.loads('{"id": 2, "items": [{}]}', into=Order)
    with pytest.raises(DeserializationError, match="should be an object"):
        ALL.loads("[1]", into=Order)
    with pytest.raises(ConfigurationError, match="pydantic"):
        ALL.loads("[1]", into=list[int])


def test_dumps_never_imports_pydantic() -> None:
    # The package's __init__ is replaced by an empty package, so that only this module and
    # what it imports are loaded: the check is about serialization, not the whole library.
    script = (
        "import dataclasses, sys, types\n"
        "package = types.ModuleType('ultimat3.jobs')\n"
        "package.__path__ = [sys.argv[1]]\n"
        "sys.modules['ultimat3.jobs'] = package\n"
        "from ultimat3.jobs.serialization import DATETIME, Serializer, input_type\n"
        "@dataclasses.dataclass\n"
        "class D:\n"
        "    a: int\n"
        "def h(d: D) -> None: ...\n"
        "s = Serializer(codecs=[DATETIME])\n"
        "s.loads(s.dumps({'a': [1, D(2)]}))\n"
        "assert input_type(h) is D\n"
        "try:\n"
        "    s.dumps(object())\n"
        "except Exception:\n"
        "    pass\n"
        "assert 'pydantic' not in sys.modules, 'pydantic was imported'\n"
        "assert 'ultimat3.jobs.serialization' in sys.modules\n"
    )
    jobs_dir = str(Path(serialization.__file__).parent)
    subprocess.run([sys.executable, "-c", script, jobs_dir], check=True, timeout=60)
