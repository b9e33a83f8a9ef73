"""A MkDocs hook for the command-line reference: an option's default as what it means.

Since click 8.3 an option declared without a default holds click's ``UNSET`` sentinel, and
mkdocs-click prints it as ``Sentinel.UNSET``. This hook wraps mkdocs-click's table row so that
such an option shows the value click gives it (a flag's ``False``), or ``none`` (with the
environment variable it reads, if any).
"""

from __future__ import annotations

from typing import Any

import click
from mkdocs_click import _docs

_row = _docs._format_table_option_row
#: click >= 8.3's "no default given"; older click uses None, which mkdocs-click handles.
_UNSET = getattr(click.core, "UNSET", None)


def _unset(value: Any) -> bool:
    return _UNSET is not None and value is _UNSET


def _format_row(option: click.Option) -> str:
    if not _unset(option.default):
        return _row(option)
    value = option.get_default(click.Context(click.Command(None)), call=False)
    envvar = option.envvar if isinstance(option.envvar, str) else None
    if not _unset(value) and value is not None:
        shown = f"`{value}`"  # a flag's: False
    elif envvar:
        shown = f"none (reads `${envvar}`)"
    else:
        shown = "_required" if option.required else "none"
    saved = option.default
    option.default = None
    try:
        row = _row(option)
    finally:
        option.default = saved
    head, _, _ = row.rstrip(" |").rpartition(" | ")
    return f"{head} | {shown} |"


def on_startup(**kwargs: Any) -> None:
    _docs._format_table_option_row = _format_row  # type: ignore[assignment]
