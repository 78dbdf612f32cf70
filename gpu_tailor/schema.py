"""The JSON schema of a configuration model (the webhook's and the extender's ``--config``), self-contained: every
``$ref`` inlined, so that it can sit anywhere in another schema (the chart's ``values.schema.json``, where Helm checks
``webhook.config`` and ``scheduler.extender.config`` before anything is rendered)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

NUMBER = r"^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$"


def json_schema(model: type[BaseModel], description: str) -> dict[str, Any]:
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline({**defs[ref.removeprefix("#/$defs/")], **{k: v for k, v in node.items() if k != "$ref"}})
            out = {k: inline(v) for k, v in node.items() if k != "title"}
            if out.get("type") == "number":  # ``helm --set a=0.5`` passes a string: the service reads it as a number
                bounds = {k: out.pop(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
                          if k in out}
                out.pop("type")
                out["anyOf"] = [{"type": "number", **bounds}, {"type": "string", "pattern": NUMBER}]
            return out
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    out: dict[str, Any] = inline(schema)
    out["description"] = description
    return out
