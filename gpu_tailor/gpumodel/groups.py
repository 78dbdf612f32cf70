"""Which group of pods a pod belongs to, read from the conventions its users already follow.

A group (a gang) is placed whole or not at all (``gangs``). Users declare one the way their tools do, and gpu-tailor
reads each from that project's own names (``labels``):

- gpu-tailor's own annotations, for a pod template that names nothing else: ``gpu-tailor.io/group`` (a name),
  ``gpu-tailor.io/group-size`` (how many pods) and optionally ``gpu-tailor.io/nvlink-domain`` (``required``,
  ``preferred``, ``anywhere``);
- Kueue's plain pod groups: the label ``kueue.x-k8s.io/pod-group-name`` and the annotation
  ``kueue.x-k8s.io/pod-group-total-count`` on every member;
- LeaderWorkerSet: one group per replica, the labels ``leaderworkerset.sigs.k8s.io/name`` and ``.../group-index``, its
  size in the annotation ``leaderworkerset.sigs.k8s.io/size``;
- kube-scheduler's own groups: 1.36's PodGroup (``spec.schedulingGroup.podGroupName``) and 1.35's Workload
  (``spec.workloadRef``: the Workload, one of its pod groups, and a replica key that makes each replica a group of its
  own), the scheduler-plugins coscheduling PodGroup (label ``scheduling.x-k8s.io/pod-group``), an Indexed Job and a
  JobSet's child Job: their size lives in another object (``GroupObject``: the PodGroups, the Workloads and the
  Indexed Job are read from the API); the group is read here with the size ``gpu-tailor.io/group-size`` gives, where
  someone set it.

The NVLink-domain ask defaults to ``preferred``: one domain where one holds the group, else anywhere (on HGX pools a
domain is one node, and most multi-node jobs there span nodes). ``gpu-tailor.io/nvlink-domain`` on the pod says
otherwise for any convention. A group whose size is not known is no gang: its pods are placed one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.gangs import DOMAIN_ASKS, PREFERRED, REQUIRED

MAX_GROUP = 10_000  # pods in one group: a larger size is a typo


class GroupError(ValueError):
    """A pod's group ask cannot be read (a size that is no number, an unknown domain ask)."""


@dataclass(frozen=True, slots=True)
class GroupRef:
    """The group a pod belongs to: ``key`` unique in the cluster, ``name`` for people, ``size`` 0 where unknown.
    ``by_domain``: kube-scheduler places it one NVLink domain at a time (a PodGroup whose topology constraint names
    the domain label: 1.36's topology-aware workload scheduling asks about each member once per domain, with that
    domain's nodes only)."""

    key: str
    name: str
    size: int
    domain: str = PREFERRED
    by_domain: bool = False
    source: str = ""  # the ``GroupObject.key`` that sizes it, where not ``key`` (a Workload's replicas share one)


def _size(raw: Any, where: str) -> int:
    try:
        size = int(str(raw).strip())
    except ValueError:
        raise GroupError(f"{where}={raw!r}: expected a whole number of pods") from None
    if not 1 <= size <= MAX_GROUP:
        raise GroupError(f"{where}={raw!r}: a group has 1 to {MAX_GROUP} pods")
    return size


def _domain(annotations: dict[str, Any]) -> str:
    raw = annotations.get(labels.ANN_GROUP_DOMAIN)
    if raw is None:
        return PREFERRED
    ask = str(raw).strip().lower()
    if ask not in DOMAIN_ASKS:
        raise GroupError(f"{labels.ANN_GROUP_DOMAIN}={raw!r}: expected one of {', '.join(DOMAIN_ASKS)}")
    return ask


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def group_of(pod: dict[str, Any]) -> GroupRef | None:
    """The pod's group, or None where it names none; ``GroupError`` where its group ask cannot be read."""
    meta = _dict(pod.get("metadata"))
    pod_labels, annotations, spec = _dict(meta.get("labels")), _dict(meta.get("annotations")), _dict(pod.get("spec"))
    ns = str(meta.get("namespace") or "")
    stated = annotations.get(labels.ANN_GROUP_SIZE)

    def ref(kind: str, name: str, size: int, source: str = "") -> GroupRef:
        return GroupRef(f"{ns}/{kind}/{name}", f"{kind} {ns}/{name}", size, _domain(annotations), source=source)

    def stated_size() -> int:
        return _size(stated, labels.ANN_GROUP_SIZE) if stated is not None else 0

    if labels.ANN_GROUP in annotations:
        name = str(annotations[labels.ANN_GROUP]).strip()
        if not name:
            raise GroupError(f"{labels.ANN_GROUP} is empty: name the group")
        if stated is None:
            raise GroupError(f"{labels.ANN_GROUP}={name!r} without {labels.ANN_GROUP_SIZE}: say how many pods it has")
        return ref("group", name, stated_size())
    scheduling_group = spec.get("schedulingGroup")
    if isinstance(scheduling_group, dict) and scheduling_group.get("podGroupName"):
        return ref("podgroup", str(scheduling_group["podGroupName"]), stated_size())
    workload_ref = spec.get("workloadRef")
    if isinstance(workload_ref, dict) and workload_ref.get("name"):
        group = f"{workload_ref['name']}/{workload_ref.get('podGroup') or ''}"
        replica = str(workload_ref.get("podGroupReplicaKey") or "")
        return ref("workload", f"{group}/{replica}" if replica else group, stated_size(), f"{ns}/workload/{group}")
    if labels.KUEUE_GROUP in pod_labels:
        count = annotations.get(labels.KUEUE_GROUP_COUNT)
        if count is None:
            raise GroupError(f"{labels.KUEUE_GROUP} without {labels.KUEUE_GROUP_COUNT}")
        return ref("kueue", str(pod_labels[labels.KUEUE_GROUP]), _size(count, labels.KUEUE_GROUP_COUNT))
    if labels.LWS_NAME in pod_labels and labels.LWS_SIZE in annotations:
        name = f"{pod_labels[labels.LWS_NAME]}-{pod_labels.get(labels.LWS_GROUP_INDEX, '0')}"
        return ref("leaderworkerset", name, _size(annotations[labels.LWS_SIZE], labels.LWS_SIZE))
    if labels.COSCHEDULING_GROUP in pod_labels:
        return ref("coscheduling", str(pod_labels[labels.COSCHEDULING_GROUP]), stated_size())
    if labels.JOBSET_NAME in pod_labels and labels.JOB_NAME in pod_labels:  # its child Job, an Indexed one
        return ref("job", str(pod_labels[labels.JOB_NAME]), stated_size())
    if labels.JOBSET_NAME in pod_labels:
        name = "-".join(str(pod_labels.get(k, "")) for k in (labels.JOBSET_NAME, labels.JOBSET_REPLICATED_JOB,
                                                                labels.JOBSET_JOB_INDEX))
        return ref("jobset", name, stated_size())
    if labels.JOB_NAME in pod_labels and labels.JOB_COMPLETION_INDEX in annotations:
        return ref("job", str(pod_labels[labels.JOB_NAME]), stated_size())
    return None


SIZED_BY_OBJECT = ("podgroup", "workload", "coscheduling", "job")  # the kinds of ref an API object may size


def sizing_object(ref: GroupRef) -> tuple[str, str, str] | None:
    """The API object that says the size of ``ref``'s group (or its topology constraint): its kind, as
    ``kube.groupobjects.SOURCES`` names it, namespace and name; None where no object does."""
    ns, kind, rest = (ref.source or ref.key).split("/", 2)
    if kind not in SIZED_BY_OBJECT:
        return None
    return kind, ns, rest.split("/", 1)[0]  # a Workload's pod groups are "name/group"


@dataclass(frozen=True, slots=True)
class GroupObject:
    """An API object that says a group's size: kube-scheduler's PodGroup (``scheduling.k8s.io/v1alpha2``: its gang
    policy's ``minCount``, its topology constraints' node label keys), one pod group of its Workload (1.35's
    ``scheduling.k8s.io/v1alpha1``) or a scheduler-plugins coscheduling PodGroup (``scheduling.x-k8s.io/v1alpha1``:
    ``minMember``). ``size`` 0: not a gang (a basic policy)."""

    key: str  # as ``GroupRef.source``, else ``GroupRef.key``
    size: int
    topology: tuple[str, ...] = ()


def podgroup_object(obj: dict[str, Any]) -> GroupObject | None:
    """A ``scheduling.k8s.io/v1alpha2`` PodGroup; None where it cannot be read."""
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    if not meta.get("name"):
        return None
    gang = _dict(_dict(spec.get("schedulingPolicy")).get("gang"))
    count = gang.get("minCount")
    size = count if isinstance(count, int) and 1 <= count <= MAX_GROUP else 0
    constraints = _dict(spec.get("schedulingConstraints")).get("topology")
    keys = tuple(str(t["key"]) for t in constraints if isinstance(t, dict) and t.get("key")) \
        if isinstance(constraints, list) else ()
    return GroupObject(f"{meta.get('namespace', '')}/podgroup/{meta['name']}", size, keys)


def workload_objects(obj: dict[str, Any]) -> list[GroupObject]:
    """The pod groups of a ``scheduling.k8s.io/v1alpha1`` Workload (1.35): each ``spec.podGroups[]`` entry, sized by
    its gang policy's ``minCount`` (0 for a basic one); none where the Workload cannot be read."""
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    groups = spec.get("podGroups")
    if not meta.get("name") or not isinstance(groups, list):
        return []
    out = []
    for g in groups:
        if not isinstance(g, dict) or not g.get("name"):
            continue
        count = _dict(_dict(g.get("policy")).get("gang")).get("minCount")
        size = count if isinstance(count, int) and 1 <= count <= MAX_GROUP else 0
        out.append(GroupObject(f"{meta.get('namespace', '')}/workload/{meta['name']}/{g['name']}", size))
    return out


def coscheduling_object(obj: dict[str, Any]) -> GroupObject | None:
    """A ``scheduling.x-k8s.io/v1alpha1`` PodGroup (scheduler-plugins' coscheduling); None where it cannot be read."""
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    if not meta.get("name"):
        return None
    count = spec.get("minMember")
    size = count if isinstance(count, int) and 1 <= count <= MAX_GROUP else 0
    return GroupObject(f"{meta.get('namespace', '')}/coscheduling/{meta['name']}", size)


def job_object(obj: dict[str, Any]) -> GroupObject | None:
    """An Indexed Job (``batch/v1``): its pods run at once up to ``parallelism`` (else ``completions``), one group;
    None for a Job of another completion mode, or one that cannot be read."""
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    if not meta.get("name") or spec.get("completionMode") != "Indexed":
        return None
    count = spec.get("parallelism", spec.get("completions"))
    size = count if isinstance(count, int) and 1 <= count <= MAX_GROUP else 0
    return GroupObject(f"{meta.get('namespace', '')}/job/{meta['name']}", size)


def resolved(ref: GroupRef, objects: dict[str, GroupObject], domain_keys: tuple[str, ...]) -> GroupRef:
    """``ref`` with the size its group's object says, where the pod did not say it; a topology constraint on a node
    label that names NVLink domains (``domain_keys``) makes one domain required."""
    obj = objects.get(ref.source or ref.key)
    if obj is None:
        return ref
    by_domain = bool(set(obj.topology) & set(domain_keys))
    return GroupRef(ref.key, ref.name, ref.size or obj.size, REQUIRED if by_domain else ref.domain, by_domain,
                    ref.source)


# an API object's groups: one (a PodGroup, a Job), several (a Workload's pod groups) or none (not readable, not one)
Reader = Callable[[dict[str, Any]], GroupObject | list[GroupObject] | None]


class GroupObjects:
    """The group objects the API serves, by ``GroupObject.key``; one writer per kind (its list and watch)."""

    def __init__(self) -> None:
        self.objects: dict[str, GroupObject] = {}
        self._given: dict[str, dict[str, tuple[str, ...]]] = {}  # kind -> API object (ns/name) -> the keys it gave

    def reset(self, kind: str, read: Reader, items: list[dict[str, Any]]) -> None:
        for keys in self._given.pop(kind, {}).values():
            for key in keys:
                self.objects.pop(key, None)
        for obj in items:
            self.apply(kind, read, "ADDED", obj)

    def apply(self, kind: str, read: Reader, event: str, obj: dict[str, Any]) -> None:
        meta = _dict(obj.get("metadata"))
        given = self._given.setdefault(kind, {})
        source = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        for key in given.pop(source, ()):  # what it gave before: a change may drop a group
            self.objects.pop(key, None)
        if event == "DELETED":
            return
        got = read(obj)
        found = got if isinstance(got, list) else [got] if got is not None else []
        for g in found:
            self.objects[g.key] = g
        if found:
            given[source] = tuple(g.key for g in found)
