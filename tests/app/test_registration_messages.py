"""A job defined below the ``App(modules=[sys.modules[__name__]])`` that registers its module
(the layout of the dashboard guide) is not registered: the error names that cause, where
the definition order is to blame, rather than asking for an ``app.register`` call."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from ultimat3.jobs import App, RegistrationError

LATE = """
import sys
from ultimat3.jobs import App, job

@job
def early(input): ...

app = App(URL, modules=[sys.modules[__name__]])

@job
def late(input): ...
"""


@pytest.fixture
def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded: list[ModuleType] = []

    def load(name: str, source: str) -> ModuleType:
        url = repr(f"sqlite:///{tmp_path / (name + '.sqlite3')}")
        (tmp_path / f"{name}.py").write_text(source.replace("URL", url))
        module = importlib.import_module(name)
        loaded.append(module)
        return module

    yield load
    for module in loaded:
        module.app.close()
        sys.modules.pop(module.__name__, None)


def test_a_job_below_app_is_told_to_move(load) -> None:  # type: ignore[no-untyped-def]
    shop = load("late_shop", LATE)
    cause = (
        "job 'late' is defined below the App(...) that registered its module late_shop: an App "
        "takes the jobs a module holds when App(...) runs"
    )
    fix = "move `App(...)` below the last @job and task(...) in late_shop (or define late above it)"
    for attempt in (
        lambda: shop.late.enqueue({}),
        lambda: shop.app.enqueue(shop.late, {}),
        lambda: shop.late.name,
    ):
        with pytest.raises(RegistrationError) as raised:
            attempt()
        assert (raised.value.cause, raised.value.fix) == (cause, fix)
    assert shop.early.enqueue({}).id  # the one above App(...) is registered


def test_a_job_left_out_of_all_is_told_so(load) -> None:  # type: ignore[no-untyped-def]
    shop = load("all_shop", '__all__ = ["early"]\n' + LATE.replace("\napp = App", "\n\napp = App"))
    shop.app.register(shop)  # after both: only __all__ keeps `late` out
    with pytest.raises(RegistrationError) as raised:
        shop.late.enqueue({})
    assert raised.value.cause == (
        "job 'late' is not in all_shop.__all__, so the App that registered all_shop left it out"
    )
    assert raised.value.fix == "add 'late' to __all__ in all_shop"


def test_a_job_of_another_app_keeps_the_register_advice(load, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shop = load("other_shop", LATE.replace("@job\ndef late", "@job\ndef never"))
    other = App(f"sqlite:///{tmp_path / 'other.sqlite3'}")
    try:
        with pytest.raises(RegistrationError) as raised:
            other.enqueue(shop.early, {})
        assert raised.value.cause == "job 'early' is not registered with this app"
        assert "app.register(module)" in (raised.value.fix or "")
    finally:
        other.close()
