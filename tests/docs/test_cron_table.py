"""docs/cron.md's golden table is what the scheduler's arithmetic does, row by row."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from ultimat3.jobs.cron import occurrences_between

from .examples import ROOT

TINY = timedelta(microseconds=1)


def table_rows() -> list[list[str]]:
    text = (ROOT / "docs" / "cron.md").read_text()
    section = text[text.index("## The golden table") :]
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.split("\n")
        if line.startswith("| ") and not line.startswith("| Zone") and "---" not in line
    ]
    return rows


def on_local_day(expr: str, tz: str, day: date) -> list[datetime]:
    zone = ZoneInfo(tz)
    start = datetime(day.year, day.month, day.day, tzinfo=zone).astimezone(UTC)
    nxt = day + timedelta(days=1)
    end = datetime(nxt.year, nxt.month, nxt.day, tzinfo=zone).astimezone(UTC)
    return list(occurrences_between(expr, tz, start - TINY, end - TINY))


def expect(cell: str, fires: list[str]) -> None:
    counted = re.fullmatch(r"(\d+) times", cell)
    if counted:
        assert len(fires) == int(counted[1])
    elif cell == "none":
        assert fires == []
    else:
        assert fires == cell.split(", ")


ROWS = table_rows()


def test_the_table_has_its_rows() -> None:
    assert len(ROWS) >= 12


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r[0]} {r[1]} {r[2]}")
def test_a_golden_row_holds(row: list[str]) -> None:
    tz, expr, day, local, utc, _why = row
    fires = on_local_day(expr.strip("`"), tz, date.fromisoformat(day))
    zone = ZoneInfo(tz)
    expect(local, [f.astimezone(zone).strftime("%H:%M %Z") for f in fires])
    expect(utc, [f.strftime("%Y-%m-%d %H:%M") for f in fires])
