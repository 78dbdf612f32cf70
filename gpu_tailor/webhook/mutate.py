"""The admission decision for one pod: pure, synchronous, no I/O.

Given the AdmissionReview request, what the cluster offers and the policy, answer allow (with a
JSONPatch and warnings) or deny (with a message a person can act on). The HTTP server only
validates the body and serialises what this returns.
"""

from __future__ import annotations

import json
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.ask import ContainerAsk, Isolation, PodAsk, from_pod
from gpu_tailor.gpumodel.catalog import Candidate, NoFit, OfferingChoice, choose, free_somewhere
from gpu_tailor.gpumodel.devices import dra as claims
from gpu_tailor.gpumodel.devices.base import GPU_TOLERATION, MANAGED_TOLERATION, Toleration
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.inventory import UnitsRefusal
from gpu_tailor.gpumodel.resources import parse_resource
from gpu_tailor.webhook import groups, guard, shape
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.registration import EXEMPT_NAMESPACES

KUBE_DEFAULT_SCHEDULER = "default-scheduler"  # Kubernetes' own scheduler, what an unset schedulerName means


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: tuple[str, ...] = ()
    code: int = 200
    message: str = ""
    backing: str = "none"  # for metrics: the chosen backing, "native", "none"
    outcome: str = "allowed"  # allowed | mutated | denied
    template: dict[str, Any] | None = None  # a ResourceClaimTemplate the pod needs in its namespace (DRA)


def _deny(message: str, code: int = 403) -> Decision:
    return Decision(allowed=False, code=code, message=message, outcome="denied")


def decide(request: dict[str, Any], candidates: list[Candidate], policy: AdmissionPolicy,
           dra: DraState | None = None, dra_nodes: AbstractSet[str] | None = None, largest_domain: int = 0,
           plugin_domain: int = 0) -> Decision:
    """``dra``: the DRA pools, where DRA is on; ``dra_nodes``: the nodes that take pods (not cordoned), when known;
    ``largest_domain``: the most GPUs one NVLink domain has, DRA's devices counted (0: not known); ``plugin_domain``:
    the same of the device plugin's GPUs alone."""
    obj = request.get("object")
    kind = request.get("kind")
    operation = request.get("operation", "CREATE")
    namespace = request.get("namespace")
    if not isinstance(kind, dict) or kind.get("kind") != "Pod" or (
            isinstance(namespace, str) and namespace in EXEMPT_NAMESPACES):
        return Decision(allowed=True)  # the selector keeps the exempt namespaces away; this is the backstop
    if operation == "UPDATE":
        return _update(request)
    if operation != "CREATE":
        return Decision(allowed=True)
    malformed = shape.problem(obj)
    if malformed:
        return _deny(malformed, 400)
    assert isinstance(obj, dict)
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    ask = from_pod(obj)
    if ask.errors:
        return _deny("; ".join(_where(e.container) + e.message for e in ask.errors), 422)
    owned = guard.on_create(annotations, ask, obj)
    # containers whose GPU requests and limits disagree, zero units included (requests 1, limits 0)
    unequal = [c for c in ask.containers if c.mismatches or c.missing_limits]
    routed = not ask.has_gpu and _routes_cpu_only(obj, policy)
    if not ask.has_gpu and not owned.drop and not unequal and not routed:
        return Decision(allowed=True)

    try:
        pod = _copy_for_edit(obj)
    except TypeError as exc:  # orjson: nested deeper than 254 levels (a Pod is a dozen deep)
        return _deny(f"request.object: cannot copy the pod: {exc} (nested too deep)", 400)
    warnings: list[str] = []
    if owned.drop:
        kept = _obj(_obj(pod, "metadata"), "annotations")
        for key in owned.drop:
            kept.pop(key)
            warnings.append(guard.why_removed(key))
    for container in unequal:
        denial = _requests_equal_limits(pod, container, policy)
        if denial:
            return _deny(denial, 422)
    if not ask.has_gpu:
        if routed:
            _obj(pod, "spec")["schedulerName"] = policy.schedulerName
        return _allow(obj, pod, warnings, "none")
    grouped = groups.refusal(obj, ask, largest_domain, plugin_domain)
    if grouped is not None:
        return _deny(grouped[1], grouped[0])
    isolation = ask.isolation if labels.ANN_ISOLATION in annotations else policy.defaultIsolation

    for resource, units in ask.effective_native.items():
        per_container = ask.most_in_one_container(resource)
        verdict = _native_units_check(resource, per_container, candidates)
        if isinstance(verdict, Decision):
            return verdict
        if verdict:
            warnings.append(verdict)
        if free_somewhere(resource, units, per_container, candidates) is False and not (
                dra is not None and dra_free_somewhere(dra, resource, units)):
            warnings.append(f"no node has {units} x {resource} free right now; the pod waits for capacity")

    backing = "native"
    template = None
    tolerations: tuple[Toleration, ...] = (GPU_TOLERATION,)
    if ask.virtual:
        choice = choose(ask, candidates, isolation)
        on_dra = claims.choose(ask, isolation, dra.inventory(), dra.usage(), dra.classes, dra_nodes) \
            if dra is not None and dra.enabled and dra.inventory().pools else None
        if isinstance(on_dra, claims.DraChoice) and (isinstance(choice, NoFit) or _dra_first(on_dra, choice)):
            template = on_dra.template
            _rewrite_dra(pod, ask, on_dra)
            backing = on_dra.backing
            _annotate(pod, ask, isolation, backing)
            if not on_dra.free_now:
                warnings.append(f"no DRA device of {on_dra.template['metadata']['name']} is free right now; the "
                                "pod waits for capacity")
        else:
            if isinstance(choice, NoFit):
                why = f"; on DRA pools: {on_dra.message}" if isinstance(on_dra, claims.DraRefusal) else ""
                return _deny(f"pod cannot get its GPU ask: {choice.message}{why}")
            _rewrite(pod, ask, choice)
            backing = choice.candidate.backing
            _annotate(pod, ask, isolation, backing)
            if not choice.free_now:
                warnings.append(f"no {choice.candidate.backing} is free right now; the pod waits for capacity")
            tolerations = (*tolerations, *choice.candidate.write.tolerations)
    elif labels.ANN_BACKING not in ((pod.get("metadata") or {}).get("annotations") or {}):
        # a native ask, left as written (not one rewritten before this reinvocation): recorded all the same
        _annotate(pod, ask, isolation, backing)
    # every GPU pod admitted, reinvoked or not: the second webhook entry skips a pod so labelled
    _obj(_obj(pod, "metadata"), "labels")[labels.POD_ADMITTED_LABEL] = "gpu"
    if policy.schedulerName and _takes_default_scheduler(pod):
        _obj(pod, "spec")["schedulerName"] = policy.schedulerName
    if policy.schedulerName and (pod.get("spec") or {}).get("schedulerName") == policy.schedulerName:
        tolerations = (*tolerations, MANAGED_TOLERATION)  # the one scheduler of nodes tainted as gpu-tailor's
    _tolerate(pod, tolerations)
    if owned.reinvocation:  # its warnings went out with the first answer
        return _allow(obj, pod, [], "reinvocation")
    decision = _allow(obj, pod, warnings, backing)
    return replace(decision, template=template) if template is not None else decision


def _dra_first(on_dra: claims.DraChoice, choice: OfferingChoice) -> bool:
    """Whether the DRA claim beats the device-plugin offering by ``choose``'s own order: free now first, then the
    least share of a GPU, then the least memory left over; a tie stays on the device plugin."""
    return (not on_dra.free_now, on_dra.consumed, on_dra.spare) < (not choice.free_now, choice.consumed,
                                                                     choice.spare)


def dra_free_somewhere(dra: DraState, resource: str, units: int) -> bool:
    """Whether a DRA pool serves ``resource`` (a DeviceClass's ``extendedResourceName``, KEP-5004) with ``units``
    whole GPUs free now; the scheduler allocates them as a claim on nodes that do not sell the resource."""
    if not dra.enabled or resource not in dra.extended():
        return False
    return any(claims.native_preference(dra, node, units) is not None for node in dra.inventory().nodes())


def _takes_default_scheduler(pod: dict[str, Any]) -> bool:
    return (pod.get("spec") or {}).get("schedulerName") in (None, "", KUBE_DEFAULT_SCHEDULER)


def _routes_cpu_only(pod: dict[str, Any], policy: AdmissionPolicy) -> bool:
    """Whether a pod without a GPU ask goes to gpu-tailor's scheduler (``AdmissionPolicy.cpuOnlyPods``):
    not one that names another scheduler, nor one created bound (a mirror pod: no scheduler sees it),
    nor a DaemonSet's (its node is chosen already, and it should not wait for the extender)."""
    return bool(policy.cpuOnlyPods and policy.schedulerName and _takes_default_scheduler(pod)
                and not (pod.get("spec") or {}).get("nodeName") and not _daemonset_pod(pod))


def _daemonset_pod(pod: dict[str, Any]) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences")
    return isinstance(owners, list) and any(
        isinstance(o, dict) and o.get("kind") == "DaemonSet" and o.get("controller") is True for o in owners)


def _allow(obj: dict[str, Any], pod: dict[str, Any], warnings: list[str], backing: str) -> Decision:
    patch: list[dict[str, Any]] = []
    _diff(obj, pod, "", patch)
    return Decision(allowed=True, patch=patch, warnings=tuple(warnings), backing=backing,
                    outcome="mutated" if patch else "allowed")


def _update(request: dict[str, Any]) -> Decision:
    """A pod's ``gpu-tailor.io/*`` annotations are fixed once it exists (``guard``)."""
    both: list[dict[str, Any]] = []
    for key in ("oldObject", "object"):
        meta = request.get(key)
        meta = meta.get("metadata") if isinstance(meta, dict) else None
        annotations = meta.get("annotations") if isinstance(meta, dict) else None
        problem = shape.annotations_problem(annotations, f"request.{key}.metadata.annotations")
        if problem:
            return _deny(problem, 400)
        both.append(annotations or {})
    changed = guard.changed(*both)
    user = request.get("userInfo")
    username = user.get("username") if isinstance(user, dict) else None
    if changed and not (isinstance(username, str) and username in guard.ANNOTATION_WRITERS):
        return _deny(f"annotations {', '.join(changed)} cannot be changed once the pod exists: gpu-tailor reads "
                     f"them at creation ({labels.ANN_ISOLATION}, {labels.ANN_TOPOLOGY}, {labels.ANN_GPU_PRODUCT}) "
                     f"or writes them itself ({', '.join(guard.OUTPUT_ANNOTATIONS)}); create a new pod instead")
    return Decision(allowed=True)


def _copy_for_edit(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod with its own copy of what ``decide`` edits (metadata and spec; the rest is shared with
    ``obj``, which ``_diff`` then skips by identity). A round trip through orjson copies a pod several
    times faster than ``copy.deepcopy``, and a pod is JSON by construction."""
    pod = dict(obj)
    for key in ("metadata", "spec"):
        if key in obj:
            pod[key] = orjson.loads(orjson.dumps(obj[key]))
    return pod


def _diff(old: Any, new: Any, path: str, out: list[dict[str, Any]]) -> None:
    """Append to ``out`` a JSONPatch (RFC 6902) that turns ``old`` into ``new``.

    Simpler than ``jsonpatch.make_patch`` (which cost a third of the webhook's CPU in a py-spy profile
    under load, most of it in its list-move detection): dicts key by key, a list that only grew gets
    its new items appended, and anything else that differs is replaced whole. ``decide`` only adds keys,
    sets values, pops resources and appends to lists, so the patches stay as small as jsonpatch's.
    """
    if old is new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            if key not in new:
                out.append({"op": "remove", "path": f"{path}/{_escape(key)}"})
        for key, value in new.items():
            where = f"{path}/{_escape(key)}"
            if key in old:
                _diff(old[key], value, where, out)
            else:
                out.append({"op": "add", "path": where, "value": value})
    elif isinstance(old, list) and isinstance(new, list) and len(old) <= len(new):
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            _diff(a, b, f"{path}/{i}", out)
        for value in new[len(old):]:
            out.append({"op": "add", "path": f"{path}/-", "value": value})
    elif type(old) is not type(new) or old != new:
        out.append({"op": "replace", "path": path, "value": new})


def _obj(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """``parent[key]``, a new ``{}`` there when absent or null (``shape.problem`` ruled out other types)."""
    child = parent.get(key)
    if child is None:
        child = parent[key] = {}
    assert isinstance(child, dict)
    return child


def _list(parent: dict[str, Any], key: str) -> list[Any]:
    child = parent.get(key)
    if child is None:
        child = parent[key] = []
    assert isinstance(child, list)
    return child


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _where(container: str | None) -> str:
    return f"container {container}: " if container else ""


def _resources(pod: dict[str, Any], container: ContainerAsk) -> dict[str, Any]:
    lst = pod["spec"]["initContainers" if container.init else "containers"]
    return _obj(lst[container.index], "resources")


def _requests_equal_limits(pod: dict[str, Any], container: ContainerAsk, policy: AdmissionPolicy) -> str | None:
    res = _resources(pod, container)
    for m in container.mismatches:
        if policy.onMismatch == "deny":
            return (f"container {container.name}: {m.resource} requests ({m.request}) must equal limits "
                    f"({m.limit}); GPU resources cannot be overcommitted")
        _obj(res, "requests")[m.resource] = m.limit
    for key in container.missing_limits:
        _obj(res, "limits")[key] = res["requests"][key]
    return None


def _native_units_check(resource: str, count: int, candidates: list[Candidate]) -> Decision | str | None:
    """Several units of a native resource in one container: denied where no offering of it can ever run
    them (the extender's filter asks the same ``units_refusal``, so an admitted pod can be placed), and
    a warning where they are replicas of a shared GPU, which give no more GPU than one replica."""
    if count <= 1 or parse_resource(resource) is None:
        return None
    offers = [c for c in candidates if c.resource == resource]
    if not offers:
        return None
    refusals = [c.device.units_refusal(resource, count, c.sharing, c.fail_requests_gt_one) for c in offers]
    usable = [c for c, r in zip(offers, refusals, strict=True) if r is None]
    if not usable:
        where = ", ".join(sorted({f"{c.backing} on {c.product}" for c in offers}))
        if UnitsRefusal.ONE_PER_CONTAINER not in refusals:
            return _deny(f"{resource}: {count} requested in one container means {count} GPUs, but every node "
                         f"selling {resource} sells it as slices ({where}): there {count} units would be {count} "
                         f"slices or replicas, not {count} GPUs; ask for 1 per container, or for part of a GPU with "
                         f"{labels.GPU_MILLI}")
        return _deny(f"{resource}: {count} requested, but every node offering it fails requests for more than one "
                     f"replica ({where}); ask for 1")
    if not any(c.device.units_add_up(c.offering) for c in usable):
        return (f"{resource}: {count} replicas of a shared GPU are not combined into more GPU: "
                f"they give no more compute or memory than one ({usable[0].backing} on {usable[0].product})")
    return None


def _rewrite(pod: dict[str, Any], ask: PodAsk, choice: OfferingChoice) -> None:
    resource = choice.candidate.resource
    for container in ask.gpu_containers:
        if not container.virtual:
            continue
        units = str(choice.units[("init:" if container.init else "") + container.name])
        res = _resources(pod, container)
        for part in ("requests", "limits"):
            _without_virtual(res, part)[resource] = units
    _require_nodes(pod, choice.candidate)


def _without_virtual(res: dict[str, Any], part: str) -> dict[str, Any]:
    """``res[part]`` (requests or limits) with the portable resources taken out."""
    values = _obj(res, part)
    for virtual in labels.VIRTUAL_RESOURCES:
        values.pop(virtual, None)
    return values


def _rewrite_dra(pod: dict[str, Any], ask: PodAsk, choice: claims.DraChoice) -> None:
    """The portable resources out, the claim in: ``spec.resourceClaims`` names the template, each GPU container
    names its request in ``resources.claims``."""
    spec = _obj(pod, "spec")
    listed = _list(spec, "resourceClaims")
    taken = {c.get("name") for c in listed if isinstance(c, dict)}
    name = next(n for n in (claims.CLAIM, *(f"{claims.CLAIM}-{i}" for i in range(1, len(taken) + 2)))
                if n not in taken)
    listed.append({"name": name, "resourceClaimTemplateName": choice.name})
    for container in ask.gpu_containers:
        if not container.virtual:
            continue
        res = _resources(pod, container)
        for part in ("requests", "limits"):
            if not _without_virtual(res, part):
                res.pop(part)
        _list(res, "claims").append({"name": name, "request": choice.requests[claims.container_key(container)]})


def _require_nodes(pod: dict[str, Any], cand: Candidate) -> None:
    """AND the candidate's node requirements into every required nodeSelectorTerm (terms are ORed)."""
    exprs = [{"key": k, "operator": op, "values": list(v)} for k, op, v in cand.affinity]
    if not exprs:
        return
    required = _obj(_obj(_obj(_obj(pod, "spec"), "affinity"), "nodeAffinity"),
                    "requiredDuringSchedulingIgnoredDuringExecution")
    terms = _list(required, "nodeSelectorTerms")
    if not terms:
        terms.append({"matchExpressions": exprs})
        return
    for term in terms:
        have = _list(term, "matchExpressions")
        have.extend(e for e in exprs if e not in have)


def _tolerate(pod: dict[str, Any], wanted: tuple[Toleration, ...]) -> None:
    """Add each wanted toleration the pod does not have already (an empty effect tolerates every effect)."""
    tolerations = _list(_obj(pod, "spec"), "tolerations")
    for key, operator, effect in dict.fromkeys(wanted):
        if not any(t.get("key") == key and t.get("operator") == operator and t.get("effect") in (None, "", effect)
                   for t in tolerations):
            tolerations.append({"key": key, "operator": operator, "effect": effect})


def _annotate(pod: dict[str, Any], ask: PodAsk, isolation: Isolation, backing: str) -> None:
    canonical = ask.canonical()
    canonical["isolation"] = isolation.value
    annotations = _obj(_obj(pod, "metadata"), "annotations")
    annotations[labels.ANN_ASK] = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    annotations[labels.ANN_BACKING] = backing
