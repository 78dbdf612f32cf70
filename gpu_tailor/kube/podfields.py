"""The few fields of a pod object that gpu-tailor's services keep, read from a dict or from a pod that
simdjson parsed lazily (a list page of 100,000 pods, every watch event): the rest -- managedFields, volumes,
env, most of status -- is never built. Both services project their pod watches through ``slim_pod``;
the extender's ``PodProjector`` adds its cache of asks on top.
"""

from __future__ import annotations

from typing import Any

import orjson
import simdjson

from gpu_tailor.gpumodel import labels

OBJECTS = (dict, simdjson.Object)
LAZY = (simdjson.Object, simdjson.Array)
OURS = labels.TAILOR_DOMAIN + "/"
CONTAINER_FIELDS = (("containers", ("name", "resources")),
                    ("initContainers", ("name", "resources", "restartPolicy")))


def mapping(value: Any) -> Any:
    """``value`` when it is an object (a dict, or simdjson's lazy one), else None."""
    return value if isinstance(value, OBJECTS) else None


def plain(value: Any) -> Any:
    """A lazily parsed value as plain Python objects (dicts stay as they are)."""
    return value.as_dict() if isinstance(value, simdjson.Object) else value


def containers(spec: Any) -> dict[str, Any]:
    """What is read of a pod spec's containers: names, resources, restart policies (sidecars), and the
    overhead."""
    s: dict[str, Any] = {}
    for key, names in CONTAINER_FIELDS:
        raw = spec.get(key)
        if raw is not None and not isinstance(raw, str) and not mapping(raw):
            s[key] = [{f: plain(c.get(f)) for f in names if c.get(f) is not None}
                      for c in raw if mapping(c) is not None]
    if (overhead := mapping(spec.get("overhead"))) is not None:
        s["overhead"] = plain(overhead)
    return s


def slim_pod(obj: Any) -> dict[str, Any]:
    """The parts of a pod object that the services read, as plain dicts: its name, namespace and uid, the
    project's annotations, its node, its containers' and init containers' resources (and restart
    policy: sidecars), its overhead and its phase. ``obj``: a pod as a dict or as simdjson parsed it
    lazily. Anything that is not the expected shape is left out, as if absent."""
    out: dict[str, Any] = {}
    meta = mapping(obj.get("metadata"))
    if meta is not None:
        out["metadata"] = meta_fields(meta)
    spec = mapping(obj.get("spec"))
    if spec is not None:
        s = containers(spec)
        if (node := spec.get("nodeName")) is not None:
            s["nodeName"] = node
        out["spec"] = s
    status = mapping(obj.get("status"))
    if status is not None and (phase := status.get("phase")) is not None:
        out["status"] = {"phase": phase}
    return out


def meta_fields(meta: Any) -> dict[str, Any]:
    m = {k: v for k in ("name", "namespace", "uid", "resourceVersion") if (v := meta.get(k)) is not None}
    annotations = mapping(meta.get("annotations"))
    if annotations is not None:
        ours = {k: v for k, v in annotations.items() if isinstance(k, str) and k.startswith(OURS)}
        if ours:
            m["annotations"] = ours
    return m


def pick(obj: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The fields of ``names`` that ``obj`` has (none when it is not an object). simdjson charges some
    2 us for looking up a key that is absent (it raises and catches inside), against 0.05 us for one
    that is there, and most pods lack most optional fields: so the keys are read first."""
    if isinstance(obj, dict):
        return {k: obj[k] for k in names if k in obj}
    if not isinstance(obj, simdjson.Object):
        return {}
    return {k: obj.get(k) for k in obj if k in names}


def raw_json(value: Any) -> bytes:
    """The JSON of a lazily parsed value (or of a plain one)."""
    if not isinstance(value, LAZY):
        return orjson.dumps(value)
    mini: Any = value.mini  # bytes, though pysimdjson's stubs say str
    return mini if isinstance(mini, bytes) else str(mini).encode()
