#!/usr/bin/env python3
"""Write the values table of ``charts/gpu-tailor/README.md`` from ``values.yaml``: one row per key that has a
``# --`` comment above it (the comment lines after it continue the description), with its default as values.yaml
gives it. A key without one is described by its children's rows; a key with neither (a value nobody described) is an
error. ``--check`` says whether the README's table is up to date (``tests/test_chart.py`` runs it)."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "gpu-tailor"
VALUES, README = CHART / "values.yaml", CHART / "README.md"
START, END = "<!-- values table: scripts/chart-readme.py writes it -->", "<!-- end of the values table -->"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


@dataclass(frozen=True)
class Row:
    key: str
    default: Any
    description: str


class Undescribed(ValueError):
    """A key of values.yaml with no ``# --`` comment, whose value has no described keys under it either."""


def rows(text: str) -> list[Row]:
    values = yaml.safe_load(text)
    out: list[Row] = []
    path: list[tuple[int, str]] = []  # (indent, key) of the keys above the current line
    described_above: list[str] = []  # the dotted keys with a row, whose children need none
    comment: list[str] | None = None
    leaves: list[tuple[str, bool]] = []  # (dotted key, whether its value is a block mapping)
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment = [stripped[4:].strip()]
            continue
        if stripped.startswith("#") and comment is not None:
            comment.append(stripped[1:].strip())
            continue
        m = KEY.match(line)
        if not m:
            if not stripped.startswith("-"):  # a list item continues the key above it
                comment = None
            continue
        indent = len(m["indent"])
        while path and path[-1][0] >= indent:
            path.pop()
        path.append((indent, m["key"]))
        dotted = ".".join(k for _, k in path)
        block = m["rest"].split("#")[0].strip() == ""
        if comment is not None:
            out.append(Row(dotted, _get(values, dotted), " ".join(comment)))
            described_above.append(dotted)
        leaves.append((dotted, block))
        comment = None
    for dotted, block in leaves:
        covered = any(dotted == d or dotted.startswith(d + ".") for d in described_above)
        has_rows_below = any(d.startswith(dotted + ".") for d in described_above)
        if not covered and not (block and has_rows_below):
            raise Undescribed(f"{VALUES.name}: {dotted} has no '# --' comment above it")
    return out


def _get(values: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        values = values[part]
    return values


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(text: str) -> str:
    lines = ["| Key | Default | Description |", "|---|---|---|"]
    for row in rows(text):
        default = json.dumps(row.default, separators=(", ", ": "))
        lines.append(f"| `{row.key}` | `{_cell(default)}` | {_cell(row.description)} |")
    return "\n".join(lines)


def updated(readme: str, values: str) -> str:
    before, found, rest = readme.partition(START)
    _, found_end, after = rest.partition(END)
    if not (found and found_end):
        raise ValueError(f"{README} lacks the markers {START!r} and {END!r}")
    return f"{before}{START}\n{table(values)}\n{END}{after}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true", help="exit 1 when the README's table is not what values.yaml says")
    args = p.parse_args()
    now = README.read_text()
    try:
        want = updated(now, VALUES.read_text())
    except Undescribed as exc:
        print(exc)
        return 1
    if args.check:
        if want != now:
            print(f"{README} is out of date: run python scripts/chart-readme.py")
            return 1
        return 0
    README.write_text(want)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
