"""Registration by export name (seed register.ts), and the errors that say how to fix it."""

from __future__ import annotations

from typing import Any

import pytest

from ultimat3.jobs import App, ConfigurationError, RegistrationError, job, task


def test_export_names_become_job_names_sorted(make_module: Any) -> None:
    @job
    def b_job(input: Any) -> None: ...

    @job
    def a_job(input: Any) -> None: ...

    nightly = task("0 3 * * *", tz="UTC", enqueue=lambda: [(a_job, {})])
    module = make_module(zeta=b_job, alpha=a_job, nightly=nightly, helper=len)
    app = App("memory://")
    registered = app.register(module)
    assert [(r.kind, r.name) for r in registered] == [
        ("job", "alpha"),
        ("task", "nightly"),
        ("job", "zeta"),
    ]
    assert a_job.name == "alpha" and b_job.name == "zeta"
    assert app.registry.tasks["nightly"] is nightly


def test_all_limits_the_exports(make_module: Any) -> None:
    @job
    def shown(input: Any) -> None: ...

    @job
    def hidden(input: Any) -> None: ...

    module = make_module(shown=shown, hidden=hidden, __all__=["shown"])
    assert [r.name for r in App("memory://").register(module)] == ["shown"]


def test_one_handle_under_two_names_is_an_error(make_module: Any) -> None:
    @job
    def send(input: Any) -> None: ...

    with pytest.raises(RegistrationError) as caught:
        App("memory://").register(make_module(send=send, send_alias=send))
    assert "two names" in caught.value.cause and caught.value.fix


def test_two_handles_under_one_name_is_an_error(make_module: Any) -> None:
    @job
    def one(input: Any) -> None: ...

    @job
    def two(input: Any) -> None: ...

    app = App("memory://")
    app.register(make_module("first_mod", send=one))
    with pytest.raises(RegistrationError) as caught:
        app.register(make_module("second_mod", send=two))
    assert "send" in caught.value.cause


def test_explicit_names_win(make_module: Any) -> None:
    @job(name="billing.charge")
    def charge(input: Any) -> None: ...

    app = App("memory://")
    assert [r.name for r in app.register(make_module(charge=charge))] == ["billing.charge"]


def test_registering_twice_is_idempotent(make_module: Any) -> None:
    @job
    def once(input: Any) -> None: ...

    module = make_module(once=once)
    app = App("memory://")
    app.register(module)
    app.register(module)
    assert list(app.registry.jobs) == ["once"]


def test_bad_definitions_say_how_to_fix_them() -> None:
    with pytest.raises(ConfigurationError):
        job(lambda: None)
    with pytest.raises(ConfigurationError):
        job(queue="has space")(lambda i: None)
    with pytest.raises(ConfigurationError):
        job(priority=500)(lambda i: None)
    with pytest.raises(ConfigurationError):
        job(retry=3)(lambda i: None)  # type: ignore[arg-type]


def test_a_handle_is_callable_directly(make_module: Any) -> None:
    @job
    def double(input: int) -> int:
        return input * 2

    assert double(21) == 42
