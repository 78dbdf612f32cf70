"""The manifests of ``examples/``, and what each says it becomes, read from its opening comment.

Each example opens with a comment for its user: what it asks, what it becomes. In that comment, one block per kind of
cluster names what the tests check, the backing annotation, the GPU resources (or the DRA claims) and the node::

    # On the fixture nodes (tests/fixtures/nodes) it becomes:
    #   gpu-tailor.io/backing: mig-2g.10gb
    #   nvidia.com/mig-2g.10gb: 1
    #   node: a100-mig-mixed-0

``the fixture nodes`` are the device-plugin nodes of tests/fixtures/nodes (``tests/test_reference.py`` places the
examples on them in-process, ``tests/e2e/test_examples.py`` on a real control plane); ``DRA pools`` are the
ResourceSlices of tests/gpumodel/dra_slices.py, alone (the device-plugin nodes cordoned). ``node`` may name several,
``a or b``, where kube-scheduler's own scores pick among them.

An example whose pods are one group placed whole says which group, as ``namespace/`` + the rest of its key
(``gpumodel.groups.GroupRef.key``), how many pods and the NVLink-domain ask that gpu-tailor reads::

    # Its pods are one group, placed whole (the plan in gpu-tailor.io/group-plan names it):
    #   group: job/indexed-train
    #   size: 2
    #   nvlink-domain: required

A file may hold more than its workload: the object that sizes its group (a PodGroup) goes before it, in the order
``kubectl apply`` creates them. The workload is a Pod, a Deployment or a Job, which the test control planes run, or a
JobSet or a LeaderWorkerSet, whose controllers they do not (``tests/test_example_groups.py`` makes their pods).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.gangs import PREFERRED
from gpu_tailor.tools import manifest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

Setting = Literal["fixture nodes", "DRA pools"]
_BLOCK = re.compile(r"^# On (?:the )?(fixture nodes|DRA pools)\b[^\n]*becomes:\n((?:#   [^\n]*\n)+)", re.M)
_GROUP = re.compile(r"^# Its pods are one group\b[^\n]*:\n((?:#   [^\n]*\n)+)", re.M)
_LINE = re.compile(r"^#   ([\w./-]+): (.+)$")
# the kinds that make pods -> where their pod template is: explain's (a JobSet's: its first replicated Job's; a
# LeaderWorkerSet's: its workers', which its leader shares unless it has a template of its own)
TEMPLATES: dict[str, tuple[str | int, ...]] = {"Pod": (), **manifest.TEMPLATES}


@dataclass(frozen=True)
class Becomes:
    """What an example's pods become on one kind of cluster."""

    backing: str
    gpu_resources: dict[str, str]  # nvidia.com/* limits of the container, as the webhook writes them
    resource_claims: int  # entries of spec.resourceClaims (DRA)
    nodes: tuple[str, ...]  # where gpu-tailor-scheduler may bind them

    def check(self, pod: dict[str, Any], where: str) -> None:
        """``pod`` (as stored by the API server, or as explain says it would be) is rewritten as said."""
        annotations = pod["metadata"].get("annotations") or {}
        assert annotations.get(labels.ANN_BACKING) == self.backing, f"{where}: {annotations}"
        (container,) = pod["spec"]["containers"]
        limits = (container.get("resources") or {}).get("limits") or {}
        assert not any(k.startswith(labels.TAILOR_DOMAIN + "/") for k in limits), f"{where}: not rewritten: {limits}"
        gpu = {k: str(v) for k, v in limits.items() if k.startswith(labels.RESOURCE_DOMAIN + "/")}
        assert gpu == self.gpu_resources, f"{where}: limits {limits}"
        claims = pod["spec"].get("resourceClaims") or []
        assert len(claims) == self.resource_claims, f"{where}: resourceClaims {claims}"


@dataclass(frozen=True)
class Grouped:
    """The group an example's pods are placed in whole."""

    key: str  # GroupRef.key less its namespace: ``job/indexed-train``
    size: int
    domain: str  # the NVLink-domain ask: required, preferred, anywhere

    def key_in(self, namespace: str) -> str:
        return f"{namespace}/{self.key}"


@dataclass(frozen=True)
class Example:
    path: Path
    manifest: dict[str, Any]  # the workload: the document that makes pods
    becomes: dict[Setting, Becomes]
    group: Grouped | None = None
    extra: tuple[dict[str, Any], ...] = ()  # the other documents (the object that sizes its group), in file order

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])

    @property
    def replicas(self) -> int:
        """Pods it makes at once: one for a Pod, ``replicas`` of a Deployment, ``parallelism`` of a Job, and of a
        JobSet each replicated Job's ``replicas`` times its Job's ``parallelism``."""
        spec = self.manifest["spec"]
        if self.kind == "JobSet":
            return sum(int(r.get("replicas", 1)) * int(r["template"]["spec"].get("parallelism", 1))
                       for r in spec["replicatedJobs"])
        return int({"Pod": 1, "Deployment": spec.get("replicas", 1), "Job": spec.get("parallelism", 1)}[self.kind])

    def pod(self) -> dict[str, Any]:
        """The pod it makes (its workload's pod template as a Pod, named after it), as written: without what its
        controller adds."""
        doc = copy.deepcopy(self.manifest)
        if doc["kind"] == "Pod":
            return doc
        template: Any = doc
        for step in TEMPLATES[self.kind]:
            template = template[step]
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": doc["metadata"]["name"], **(template.get("metadata") or {})},
                "spec": template["spec"]}


def _fields(block: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in block.splitlines():
        match = _LINE.match(line)
        assert match, f"not '#   key: value': {line!r}"
        fields[match.group(1)] = match.group(2).strip()
    return fields


def _becomes(block: str) -> Becomes:
    fields = _fields(block)
    gpu = {k: v for k, v in fields.items() if k.startswith(labels.RESOURCE_DOMAIN + "/")}
    unknown = set(fields) - set(gpu) - {labels.ANN_BACKING, "node", "resourceClaims"}
    assert not unknown, f"unknown keys in a 'becomes' block: {sorted(unknown)}"
    return Becomes(backing=fields[labels.ANN_BACKING], gpu_resources=gpu,
                   resource_claims=int(fields.get("resourceClaims", "0")), nodes=tuple(fields["node"].split(" or ")))


def _grouped(block: str) -> Grouped:
    fields = _fields(block)
    unknown = set(fields) - {"group", "size", "nvlink-domain"}
    assert not unknown, f"unknown keys in a group block: {sorted(unknown)}"
    return Grouped(fields["group"], int(fields["size"]), fields.get("nvlink-domain", PREFERRED))


def load(path: Path) -> Example:
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    comment = "".join(lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))])
    becomes: dict[Setting, Becomes] = {setting: _becomes(block) for setting, block in _BLOCK.findall(comment)}
    groups = [_grouped(block) for block in _GROUP.findall(comment)]
    assert len(groups) <= 1, f"{path.name}: one group block at most"
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    workloads = [d for d in docs if d.get("kind") in TEMPLATES]
    assert len(workloads) == 1, f"{path.name}: one workload ({', '.join(TEMPLATES)}), found {len(workloads)}"
    return Example(path, workloads[0], becomes, groups[0] if groups else None,
                   tuple(d for d in docs if d is not workloads[0]))


def examples() -> list[Example]:
    return [load(p) for p in sorted(EXAMPLES.glob("*.yaml"))]
