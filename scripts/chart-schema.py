#!/usr/bin/env python3
"""Write the schemas of the webhook's and the extender's ``--config`` into the chart's ``values.schema.json``
(``webhook.config``, ``scheduler.extender.config``), from the models that read them; ``--check`` says whether the file
is up to date (``tests/test_chart.py`` runs it)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gpu_tailor.extender.__main__ import Settings
from gpu_tailor.schema import json_schema
from gpu_tailor.webhook.config import AdmissionPolicy

SCHEMA = Path(__file__).resolve().parents[1] / "charts" / "gpu-tailor" / "values.schema.json"


def updated(values: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(values))
    out["properties"]["webhook"]["properties"]["config"] = json_schema(
        AdmissionPolicy, "the webhook's --config (docs/reference.md)")
    out["properties"]["scheduler"]["properties"]["extender"]["properties"]["config"] = json_schema(
        Settings, "the extender's --config (docs/reference.md)")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true", help="exit 1 when the file is not what the models say")
    args = p.parse_args()
    now = json.loads(SCHEMA.read_text())
    want = updated(now)
    if args.check:
        if want != now:
            print(f"{SCHEMA} is out of date: run python scripts/chart-schema.py")
            return 1
        return 0
    SCHEMA.write_text(json.dumps(want, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
