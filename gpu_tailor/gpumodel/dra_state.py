"""What a service keeps of Dynamic Resource Allocation from the API (``DraState``): the ResourceSlices of NVIDIA's DRA
driver, each allocated claim's hold and the DeviceClasses that exist, as the watches of the webhook and the extender
deliver them (``kube.dra``). The pools' inventory (``gpumodel.dra``) and what the claims hold of it
(``gpumodel.dra_usage``) are recomputed from them only after a change.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gpu_tailor.gpumodel.dra import DRIVER, ClaimHold, DeviceType, DraInventory, claim_hold, read_slices
from gpu_tailor.gpumodel.dra_usage import Usage

CHANGES = 4096  # the changes DraState.changed_since can look back on; further back, every node counts as changed


@dataclass
class DraState:
    """What a service keeps of DRA from the API: the driver's slices, each allocated claim's hold, the DeviceClasses
    that exist (and the extended resources they serve, KEP-5004). ``inventory`` and ``usage`` are recomputed only
    after a change. ``enabled`` is False where the API server serves no ``resource.k8s.io/v1``."""

    enabled: bool = True
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)  # by name
    holds: dict[str, ClaimHold] = field(default_factory=dict)  # claim uid -> ClaimHold
    classes: dict[str, str] = field(default_factory=dict)  # DeviceClass name -> its extendedResourceName ("")
    synced: set[str] = field(default_factory=set)  # "slices", "claims", "classes" once listed
    version: int = 0  # counts changes to the slices, the claims' holds and the classes
    layout: int = 0  # counts changes to the slices and the classes alone: what each node's pools are and serve
    _inventory: DraInventory | None = None
    _usage: Usage | None = None
    # (version, the nodes whose devices' use it changed, or None: any node may have changed), the last CHANGES of them
    _changes: deque[tuple[int, frozenset[str] | None]] = field(default_factory=lambda: deque(maxlen=CHANGES))
    _free: dict[str, int] = field(default_factory=dict)  # node -> whole GPUs free there (``free_gpus``)
    # what readers derive from the slices and classes alone (a claim's rungs, by its ask), until the layout changes
    by_layout: dict[str, Any] = field(default_factory=dict)

    KINDS = ("slices", "claims", "classes")

    def _changed(self, nodes: frozenset[str] | None = None) -> None:
        self.version += 1
        self._changes.append((self.version, nodes))
        if nodes is None:
            self.layout += 1
            self._free.clear()
            self.by_layout.clear()
        else:
            for node in nodes:
                self._free.pop(node, None)

    def free_gpus(self, node: str) -> int:
        """The GPUs a claim could take whole on ``node`` now (devices of type gpu, not shared, not held), kept until
        a change reaches the node."""
        free = self._free.get(node)
        if free is None:
            usage = self.usage()
            free = self._free[node] = sum(1 for p in self.inventory().on_node(node) for d in p.devices.values()
                                          if d.type is DeviceType.GPU and not d.shared and usage.free(d))
        return free

    def changed_since(self, version: int) -> set[str] | None:
        """The nodes whose DRA devices or their use changed after ``version``: an allocated or released claim
        changes its devices' nodes alone. None where any node may have (slices or classes changed, or ``version`` is
        older than the changes kept)."""
        if version == self.version:
            return set()
        if not self._changes or self._changes[0][0] > version + 1:
            return None
        out: set[str] = set()
        for at, nodes in reversed(self._changes):
            if at <= version:
                break
            if nodes is None:
                return None
            out |= nodes
        return out

    @property
    def ready(self) -> bool:
        return not self.enabled or self.synced >= set(self.KINDS)

    def inventory(self) -> DraInventory:
        if self._inventory is None:
            self._inventory = read_slices(self.slices.values())
        return self._inventory

    def usage(self) -> Usage:
        if self._usage is None:
            self._usage = Usage.of(self.holds.values(), self.inventory())  # counted against the pools' counters
        return self._usage

    def extended(self) -> dict[str, str]:
        """Extended resource -> the DeviceClass that serves it through DRA on nodes that do not sell it."""
        return {r: c for c, r in sorted(self.classes.items()) if r}

    def reset_slices(self, items: list[dict[str, Any]]) -> None:
        self.slices = {_name(s): s for s in items if _driver(s) == DRIVER}
        self.synced.add("slices")
        self._inventory = self._usage = None
        self._changed()

    def apply_slice(self, event: str, obj: dict[str, Any]) -> None:
        name = _name(obj)
        if event == "DELETED" or _driver(obj) != DRIVER:
            if self.slices.pop(name, None) is None:
                return
        else:
            self.slices[name] = obj
        self._inventory = self._usage = None
        self._changed()

    def reset_claims(self, items: list[dict[str, Any]]) -> None:
        self.holds = {_uid(c): h for c in items if (h := claim_hold(c))}
        self.synced.add("claims")
        self._usage = None
        self._changed()

    def apply_claim(self, event: str, obj: dict[str, Any]) -> None:
        hold = claim_hold(obj) if event != "DELETED" else None
        before = self.holds.pop(_uid(obj), None)
        if hold:
            self.holds[_uid(obj)] = hold
        if before == (hold or None):
            return
        if self._usage is not None:  # this claim alone counted again, on a copy: a usage handed out stays as it was
            usage, inv = self._usage.copy(), self.inventory()
            if before:
                usage.remove(before, inv)
            if hold:
                usage.add(hold, inv)
            self._usage = usage
        pools = self.inventory().pools
        self._changed(frozenset(pools[pool].node for h in (before, hold) if h
                                for _, pool, _ in (*h.devices, *(key for key, _ in h.consumed)) if pool in pools))

    def reset_classes(self, items: list[dict[str, Any]]) -> None:
        self.classes = dict(filter(None, map(_device_class, items)))
        self.synced.add("classes")
        self._changed()

    def apply_class(self, event: str, obj: dict[str, Any]) -> None:
        entry = _device_class(obj)
        if entry is None:
            return
        if event == "DELETED":
            self.classes.pop(entry[0], None)
        else:
            self.classes[entry[0]] = entry[1]
        self._changed()


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _uid(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def _driver(obj: dict[str, Any]) -> Any:
    spec = obj.get("spec")
    return spec.get("driver") if isinstance(spec, dict) else None


def _device_class(obj: dict[str, Any]) -> tuple[str, str] | None:
    name = _name(obj)
    if not name:
        return None
    spec = obj.get("spec")
    resource = spec.get("extendedResourceName") if isinstance(spec, dict) else None
    return name, resource if isinstance(resource, str) else ""
