"""What every command shares: the group's options as a ``Context`` (``--app``/``--url``
resolved to an App, with every mistake explained), how a library error is printed and exits
(``explained``), JSON and table output, and the duration option type."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn, TypeVar

import click

from ultimat3.jobs.app import App
from ultimat3.jobs.drivers import sqlite_path, url_from_env
from ultimat3.jobs.duration import to_timedelta
from ultimat3.jobs.errors import ConfigurationError, DurationError, JobsError
from ultimat3.jobs.job import JobHandle
from ultimat3.jobs.tasks import TaskHandle

F = TypeVar("F", bound=Callable[..., Any])


_APP_FIX = "point --app at the App in your code: --app package.module:attribute, e.g. shop.jobs:app"


class Context:
    """What the group's options say: the App reference and the database URL."""

    def __init__(self, app_ref: str | None, url: str | None, *, json_log: bool = False) -> None:
        self.app_ref = app_ref
        self.url = url
        #: ``--log-format json``: every line on stderr is JSON, errors included.
        self.json_log = json_log
        self._app: App | None = None

    @property
    def app(self) -> App:
        """The App, for a command that may create the database (worker, migrate, ...)."""
        if self._app is None:
            self._app = load_app(self.app_ref, self.url)
        return self._app

    @property
    def existing_app(self) -> App:
        """The App, for a command that reads or changes jobs: its database and its job tables
        must exist, so a command run in the wrong folder or against a new database says so
        rather than create an empty SQLite file or the schema."""
        app = self.app_with_a_database
        if not app._opened:
            driver = app._unopened_driver()
            if not driver.schema_current():
                raise ConfigurationError(
                    f"the job tables in {driver.display_url} are missing or older than this "
                    "version of ultimat3-jobs, and this command never creates or changes them",
                    fix="run `ultimat3-jobs migrate` (a worker migrates too), then this "
                    "command again",
                )
        return app

    @property
    def app_with_a_database(self) -> App:
        """The App, whose database must exist (a SQLite file is never created): the health
        check reads what state its schema is in."""
        app = self.app
        if app._driver is None and app.url and app.url.startswith("sqlite:"):
            path = sqlite_path(app.url).absolute()
            if not path.exists():
                raise ConfigurationError(
                    f"no job database at {path}: {self._url_source()}",
                    fix="run from your project's folder, or pass --app module:attribute (or "
                    "--url sqlite:///path/to/jobs.sqlite3); `ultimat3-jobs migrate` creates "
                    "a database",
                )
        return app

    def _url_source(self) -> str:
        if self.url:
            return "--url names it, and it does not exist"
        if self.app_ref:
            return f"the app {self.app_ref!r} uses it, and it does not exist"
        if url_from_env():
            return "$ULTIMAT3_JOBS_URL names it, and it does not exist"
        return (
            "with no --app, --url or $ULTIMAT3_JOBS_URL this is the default file, and it does "
            "not exist in this folder"
        )


def load_app(ref: str | None, url: str | None) -> App:
    """The App named by ``module:attribute`` (the attribute defaults to ``app``; ``module:f()``
    calls a factory), pointed at ``url`` when given; without ``ref``, a bare App on ``url``
    (or ``$ULTIMAT3_JOBS_URL``, or ./ultimat3-jobs.sqlite3)."""
    if not ref:
        return App(url)
    module_name, attr, call = _parse_ref(ref)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = _import(ref, module_name)
    if not hasattr(module, attr):
        raise ConfigurationError(
            f"--app {ref!r}: module {module_name!r} has no attribute {attr!r}",
            fix=_app_fix(module, module_name),
        )
    value = getattr(module, attr)
    if call:
        if not inspect.isfunction(value):
            raise ConfigurationError(
                f"--app {ref!r}: {attr} is {_what(value)}, not a function that builds an App",
                fix=_app_fix(module, module_name),
            )
        try:
            value = value()
        except JobsError as exc:
            raise ConfigurationError(
                f"--app {ref!r}: {attr}() raised: {exc.cause}", fix=exc.fix
            ) from exc
        except Exception as exc:
            raise ConfigurationError(
                f"--app {ref!r}: {attr}() raised {type(exc).__name__}: {exc} ({_where(exc)})",
                fix="fix the factory, or point --app at an App built at import",
            ) from exc
    if not isinstance(value, App):
        fix = _app_fix(module, module_name)
        if inspect.isfunction(value):
            fix = f"to build the App by calling {attr}(), write --app '{module_name}:{attr}()'"
        raise ConfigurationError(f"--app {ref!r} is {_what(value)}, not an App", fix=fix)
    if url and value.url != url:
        value._use_url(url, label=f"--app {ref!r}")
    return value


def _parse_ref(ref: str) -> tuple[str, str, bool]:
    """``module:attribute`` as (module, attribute, whether to call it)."""
    module_name, _, attr = ref.partition(":")
    attr = attr or "app"
    looks_like_path = "/" in module_name or "\\" in module_name or module_name.endswith(".py")
    if looks_like_path:
        path = Path(module_name)
        if path.is_absolute() or ".." in path.parts:
            where = f"run from {path.parent}, and write"
            dotted = path.stem
        else:
            where = "write"
            dotted = ".".join(p for p in path.with_suffix("").parts if p != ".")
        raise ConfigurationError(
            f"--app {ref!r} is a file path; --app takes a module name and an attribute",
            fix=f"{where} --app {dotted}:{attr} (a module importable from the current folder)",
        )
    call = attr.endswith("()")
    name = attr[:-2] if call else attr
    dotted_ok = all(part.isidentifier() for part in module_name.split("."))
    if not module_name or not dotted_ok or not name.isidentifier():
        raise ConfigurationError(f"--app {ref!r} is not module:attribute", fix=_APP_FIX)
    return module_name, name, call


def _import(ref: str, module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigurationError(
                f"--app {ref!r}: no module named {missing!r} in {os.getcwd()} or on sys.path",
                fix="run from the folder that holds your module or package, or fix --app "
                "module:attribute",
            ) from None
        raise _import_error(ref, module_name, exc) from exc
    except SyntaxError as exc:
        raise ConfigurationError(
            f"--app {ref!r}: {exc.msg} ({exc.filename}, line {exc.lineno})",
            fix=f"fix the syntax error; `python -c 'import {module_name}'` shows it in full",
        ) from None
    except JobsError as exc:
        # A definition that cannot work (a bad zone, duration or name) fails at import.
        raise ConfigurationError(
            f"--app {ref!r}: importing {module_name!r} raised {type(exc).__name__} at "
            f"{_where(exc)}: {exc.cause}",
            fix=exc.fix,
        ) from None
    except Exception as exc:
        raise _import_error(ref, module_name, exc) from exc


def _import_error(ref: str, module_name: str, exc: BaseException) -> ConfigurationError:
    return ConfigurationError(
        f"--app {ref!r}: importing {module_name!r} raised {type(exc).__name__}: {exc} "
        f"({_where(exc)})",
        fix=f"fix the error in your module; `python -c 'import {module_name}'` shows the "
        "whole traceback",
    )


def _where(exc: BaseException) -> str:
    """The innermost frame of ``exc`` outside this library and importlib: "file, line N"."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("<frozen importlib") and _PACKAGE_DIR not in f.filename
    ]
    if not frames:
        return "no frame of yours"
    return f"{frames[-1].filename}, line {frames[-1].lineno}"


#: The library's folder: its frames are not the user's.
_PACKAGE_DIR = str(Path(__file__).parents[1])


def _what(value: object) -> str:
    """What ``value`` is, as a person would say it."""
    if isinstance(value, type):
        return f"the class {value.__name__} itself"
    if isinstance(value, JobHandle):
        return "a job (@job)"
    if isinstance(value, TaskHandle):
        return "a cron task (task(...))"
    if isinstance(value, ModuleType):
        return f"the module {value.__name__}"
    if inspect.isfunction(value):
        return "a function"
    return f"a {type(value).__name__}"


def _app_fix(module: ModuleType, module_name: str) -> str:
    """The fix for an --app that names no App: the Apps the module has, or how to make one."""
    apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
    if apps:
        return "the module's App: " + " or ".join(f"--app {module_name}:{a}" for a in apps)
    return (
        f"module {module_name!r} holds no App: add `app = App(modules=[sys.modules[__name__]])` "
        "to it, or point --app at the module that does"
    )


def fail(error: JobsError, as_json: bool = False) -> NoReturn:
    if as_json:
        click.echo(json.dumps(error.to_dict()), err=True)
    else:
        click.secho(f"error: {error.cause}", fg="red", err=True)
        if error.fix:
            click.echo(f"  fix: {error.fix}", err=True)
    sys.exit(error.exit_code)


@contextmanager
def explained(as_json: bool = False) -> Iterator[None]:
    """A library error as its cause and fix (JSON with ``--json``, or under ``--log-format
    json``, where every line on stderr is JSON), and its exit code."""
    try:
        yield
    except JobsError as error:
        current = click.get_current_context(silent=True)
        found = current.find_object(Context) if current is not None else None
        fail(error, as_json or (found is not None and found.json_log))


def emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


pass_ctx = click.make_pass_decorator(Context)


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic in newer click, not in 8.1
    """A duration option: text with a unit ("30s", "250ms", "1h30m"), named in its error."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, timedelta):
            return value
        try:
            return to_timedelta(str(value))
        except DurationError as exc:
            why = exc.context.get("why", exc.cause)
            suggestion = exc.context.get("suggestion")
            if suggestion:
                hint = f'write "{suggestion}"'
            elif "longer than 10 years" in why:
                hint = 'write at most "3653d"'
            else:
                hint = 'write text such as "250ms", "30s", "1h30m" or "2d"'
            self.fail(f"{value!r} {why}; {hint}", param, ctx)


DURATION = Duration()


def table(rows: list[list[str]], headers: list[str], *, indent: str = "") -> None:
    """Print the rows under their headers, every column lined up (the last is not padded)."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, *rows]:
        cells = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
        click.echo(indent + cells.rstrip())


def clip(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters, with an ellipsis when cut."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """Several ``click.option`` decorators as one, in the order they are written."""

    def apply(f: F) -> F:
        for decorator in reversed(decorators):
            f = decorator(f)
        return f

    return apply


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
