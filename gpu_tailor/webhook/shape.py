"""The parts of a Pod that ``mutate.decide`` reads or edits, checked for their JSON types first.

The API server only sends pods it has decoded, so a wrong type here means the body did not come from
it; the answer is a 400 naming the field, not a 500 from deep inside ``decide``. Only what ``decide``
touches is checked (not the whole Pod schema), and ``null`` counts as absent, as Kubernetes' own
decoder treats it. Kept cheap: a pod create walks a dozen small dicts here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

QUANTITY_TYPES = (str, int, float)


def problem(pod: Any) -> str | None:
    """Why ``pod`` cannot be a Pod's JSON, or None."""
    if not isinstance(pod, dict):
        return f"request.object: expected a Pod object, got {_kind(pod)}"
    meta = pod.get("metadata")
    if meta is not None:
        if not isinstance(meta, dict):
            return f"metadata: expected an object, got {_kind(meta)}"
        for key in ("annotations", "labels"):
            why = _string_map(meta.get(key), f"metadata.{key}")
            if why:
                return why
    spec = pod.get("spec")
    if spec is None:
        return None
    if not isinstance(spec, dict):
        return f"spec: expected an object, got {_kind(spec)}"
    for key in ("initContainers", "containers"):
        why = _containers(spec.get(key), f"spec.{key}")
        if why:
            return why
    why = _quantities(spec.get("overhead"), "spec.overhead")
    if why:
        return why
    name = spec.get("schedulerName")
    if name is not None and not isinstance(name, str):
        return f"spec.schedulerName: expected a string, got {_kind(name)}"
    why = _objects(spec.get("tolerations"), "spec.tolerations") or _named(spec.get("resourceClaims"),
                                                                           "spec.resourceClaims")
    if why:
        return why
    return _affinity(spec.get("affinity"))


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def annotations_problem(value: Any, where: str) -> str | None:
    """Why ``value`` cannot be a pod's annotations (an object of strings, or null), or None."""
    return _string_map(value, where)


def _string_map(value: Any, where: str) -> str | None:
    return _map_of(value, where, "strings", "a string", lambda v: isinstance(v, str))


def _quantities(value: Any, where: str) -> str | None:
    return _map_of(value, where, "quantities", "a quantity",
                   lambda v: not isinstance(v, bool) and isinstance(v, QUANTITY_TYPES))


def _map_of(value: Any, where: str, values: str, each: str, ok: Callable[[Any], bool]) -> str | None:
    """Why ``value`` cannot be an object of ``values`` (each one ``ok``), or null, or None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return f"{where}: expected an object of {values}, got {_kind(value)}"
    for k, v in value.items():
        if not ok(v):
            return f"{where}: {k!r}: expected {each}, got {_kind(v)}"
    return None


def _objects(value: Any, where: str) -> str | None:
    """A list of objects (or null)."""
    if value is None:
        return None
    if not isinstance(value, list):
        return f"{where}: expected a list, got {_kind(value)}"
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            return f"{where}[{i}]: expected an object, got {_kind(item)}"
    return None


def _containers(value: Any, where: str) -> str | None:
    why = _objects(value, where)
    if why or value is None:
        return why
    for i, c in enumerate(value):
        at = f"{where}[{i}]"
        name = c.get("name")
        if name is not None and not isinstance(name, str):
            return f"{at}.name: expected a string, got {_kind(name)}"
        res = c.get("resources")
        if res is None:
            continue
        if not isinstance(res, dict):
            return f"{at}.resources: expected an object, got {_kind(res)}"
        for part in ("requests", "limits"):
            why = _quantities(res.get(part), f"{at}.resources.{part}")
            if why:
                return why
        why = _named(res.get("claims"), f"{at}.resources.claims", ("name", "request"))
        if why:
            return why
    return None


def _named(value: Any, where: str, keys: tuple[str, ...] = ("name",)) -> str | None:
    """A list of objects whose ``keys`` are strings where present (claims: names the webhook compares)."""
    why = _objects(value, where)
    if why or value is None:
        return why
    for i, item in enumerate(value):
        for key in keys:
            if item.get(key) is not None and not isinstance(item[key], str):
                return f"{where}[{i}].{key}: expected a string, got {_kind(item[key])}"
    return None


def _affinity(value: Any) -> str | None:
    where = "spec.affinity"
    node: Any = value
    for key in ("", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"):
        if key:
            node = node.get(key)
            where = f"{where}.{key}"
        if node is None:
            return None
        if not isinstance(node, dict):
            return f"{where}: expected an object, got {_kind(node)}"
    terms = node.get("nodeSelectorTerms")
    where = f"{where}.nodeSelectorTerms"
    why = _objects(terms, where)
    if why or terms is None:
        return why
    for i, term in enumerate(terms):
        why = _objects(term.get("matchExpressions"), f"{where}[{i}].matchExpressions")
        if why:
            return why
    return None
