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
- kube-scheduler's own PodGroup (1.36, ``spec.schedulingGroup.podGroupName``), the scheduler-plugins coscheduling
  PodGroup (label ``scheduling.x-k8s.io/pod-group``), an Indexed Job and a JobSet's child Job: their size lives in
  another object (``GroupObject``: the PodGroups and the Indexed Job are read from the API); the group is read here
  with the size ``gpu-tailor.io/group-size`` gives, where someone set it.

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

    def ref(kind: str, name: str, size: int) -> GroupRef:
        return GroupRef(f"{ns}/{kind}/{name}", f"{kind} {ns}/{name}", size, _domain(annotations))

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


@dataclass(frozen=True, slots=True)
class GroupObject:
    """An API object that says a group's size: kube-scheduler's PodGroup (``scheduling.k8s.io/v1alpha2``: its gang
    policy's ``minCount``, its topology constraints' node label keys) or a scheduler-plugins coscheduling PodGroup
    (``scheduling.x-k8s.io/v1alpha1``: ``minMember``). ``size`` 0: not a gang (a basic policy)."""

    key: str  # as ``GroupRef.key``
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
    obj = objects.get(ref.key)
    if obj is None:
        return ref
    by_domain = bool(set(obj.topology) & set(domain_keys))
    return GroupRef(ref.key, ref.name, ref.size or obj.size, REQUIRED if by_domain else ref.domain, by_domain)


Reader = Callable[[dict[str, Any]], GroupObject | None]


class GroupObjects:
    """The group objects the API serves, by ``GroupRef.key``; one writer per kind (its list and watch)."""

    def __init__(self) -> None:
        self.objects: dict[str, GroupObject] = {}
        self._keys: dict[str, set[str]] = {}  # kind -> the keys its last list and watch gave

    def reset(self, kind: str, read: Reader, items: list[dict[str, Any]]) -> None:
        for key in self._keys.pop(kind, set()):
            self.objects.pop(key, None)
        for obj in items:
            self.apply(kind, read, "ADDED", obj)

    def apply(self, kind: str, read: Reader, event: str, obj: dict[str, Any]) -> None:
        got = read(obj)
        if got is None:
            return
        keys = self._keys.setdefault(kind, set())
        if event == "DELETED":
            self.objects.pop(got.key, None)
            keys.discard(got.key)
        else:
            self.objects[got.key] = got
            keys.add(got.key)
