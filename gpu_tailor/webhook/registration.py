"""The MutatingWebhookConfiguration that registers the webhook with kube-apiserver.

One definition for ``manifests/webhook/mutatingwebhookconfiguration.yaml`` (a test keeps the two
identical) and for ``gpu-tailor certs``, which writes it with the caBundle filled in.

Two entries, one ``/mutate``, told apart by what the pod asks for (a CEL ``matchConditions``, evaluated by
the API server; beta and on by default in Kubernetes 1.28, GA from 1.30), so that an outage of gpu-tailor
refuses only what it must:

* ``pods.gpu-tailor.io``, ``failurePolicy: Fail``: a pod CREATE that may ask for a GPU -- any container or
  init container with an ``nvidia.com/*`` or ``gpu-tailor.io/*`` request or limit, or any
  ``gpu-tailor.io/*`` annotation -- and a pod UPDATE that adds, removes or changes a ``gpu-tailor.io/*``
  annotation (which the webhook refuses: ``guard``). Let through unanswered, a portable ask would reach
  kube-scheduler as a resource no node has (Pending with a reason no user understands), a native ask
  would skip the limits == requests check, and a forged ``gpu-tailor.io/gpus`` would go unchecked;
* ``cpu-pods.gpu-tailor.io``, ``failurePolicy: Ignore``: every pod CREATE the first entry has not admitted (its
  ``objectSelector`` skips the label ``gpu-tailor.io/admitted``, which the webhook writes on every GPU pod it
  admits). For a pod without a GPU ask the webhook only routes it to gpu-tailor's scheduler (``cpuOnlyPods``); when
  it cannot answer, the pod is created as it is and the default scheduler places it. So a GPU pod costs one call,
  and a CPU-only pod one. It takes every CREATE but those on purpose: the API server reinvokes
  (``reinvocationPolicy: IfNeeded``) only webhooks it has called once, so a GPU ask that a later webhook adds to
  a CPU-only pod is handled only because this entry was called (its selector, matched again on the reinvocation
  against the pod as it is then, still takes it: nothing has written the label). A label, not a matchCondition:
  kube-apiserver evaluates a CEL condition by converting the whole pod, the request and the namespace, which cost
  it as much CPU per create as the rest of a webhook call (``benchmarks/webhook_create_latency.py
  --anchor-like conditions``); a label selector costs next to nothing.

No pod UPDATE reaches the webhook unless it touches a ``gpu-tailor.io/*`` annotation, so labels and
finalizers keep working while it is down; the extender's GPUs arrive through ``pods/binding``, which no
rule here matches.

A third entry, ``reports.gpu-tailor.io`` (``failurePolicy: Fail``), reviews the node agents' own writes of
``NodeGPUReport`` objects, and nobody else's (a ``matchConditions`` on the agents' service account): an agent
may write its own node's report only (``webhook.reports``). It never patches.

The pod entries select namespaces labelled ``gpu-tailor.io/enabled=true``, but never the webhook's own namespace or
kube-system, whatever their labels: a webhook that is down would otherwise block the pods that bring it
(or the cluster's DNS and network) back. The selector reads ``kubernetes.io/metadata.name``, which the API
server sets and nobody can change; ``mutate.decide`` lets pods of these namespaces through untouched as
well. Pods labelled ``gpu-tailor.io/skip=true`` are never sent.
"""

from __future__ import annotations

from typing import Any

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.report import GROUP as REPORT_GROUP
from gpu_tailor.gpumodel.report import PLURAL as REPORT_PLURAL
from gpu_tailor.gpumodel.report import VERSION as REPORT_VERSION

WEBHOOK_CONFIG_NAME = "gpu-tailor"
NAMESPACE = "gpu-tailor"  # the webhook's own (manifests/webhook/namespace.yaml)
SYSTEM_NAMESPACES = ("kube-system",)
EXEMPT_NAMESPACES = frozenset({NAMESPACE, *SYSTEM_NAMESPACES})

_OURS = f"'{labels.TAILOR_DOMAIN}/'"
_RESOURCE = f"r.startsWith('{labels.RESOURCE_DOMAIN}/') || r.startsWith({_OURS})"
_CONTAINER_ASKS = " ".join([
    "has(c.resources) && (",
    f"(has(c.resources.requests) && c.resources.requests.exists(r, {_RESOURCE})) ||",
    f"(has(c.resources.limits) && c.resources.limits.exists(r, {_RESOURCE})))",
])
# A CREATE that may ask for a GPU: a GPU resource in any container, or any of our annotations.
MAY_ASK_FOR_GPU = " ".join([
    # (a pod with no containers comes as null, which has() does not rule out; the API server refuses it after)
    "(has(object.spec.containers) && type(object.spec.containers) == list &&",
    f"object.spec.containers.exists(c, {_CONTAINER_ASKS})) ||",
    f"(has(object.spec.initContainers) && object.spec.initContainers.exists(c, {_CONTAINER_ASKS})) ||",
    f"(has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith({_OURS})))",
])
_ANNOTATIONS_CHANGED = " ".join([
    "(has(object.metadata.annotations) && object.metadata.annotations.exists(k,",
    f"k.startsWith({_OURS}) && !(has(oldObject.metadata.annotations) &&",
    "k in oldObject.metadata.annotations && oldObject.metadata.annotations[k] == object.metadata.annotations[k])))",
    "||",
    "(has(oldObject.metadata.annotations) && oldObject.metadata.annotations.exists(k,",
    f"k.startsWith({_OURS}) && !(has(object.metadata.annotations) &&",
    "k in object.metadata.annotations)))",
])
GPU_PODS = (f"(request.operation == 'CREATE' && ({MAY_ASK_FOR_GPU})) ||"
            f" (request.operation == 'UPDATE' && ({_ANNOTATIONS_CHANGED}))")
GPU_HOOK, CPU_HOOK = "pods.gpu-tailor.io", "cpu-pods.gpu-tailor.io"
REPORTS_HOOK = "reports.gpu-tailor.io"
AGENT_SERVICE_ACCOUNT = "gpu-tailor-agent"  # manifests/agent


def agent_user(namespace: str, account: str = AGENT_SERVICE_ACCOUNT) -> str:
    """The node agents' user name, as the API server authenticates their service account."""
    return f"system:serviceaccount:{namespace}:{account}"


def exempt_namespaces(namespace: str) -> list[str]:
    """The namespaces the webhook never acts in, when it runs in ``namespace``."""
    return [namespace, *(n for n in SYSTEM_NAMESPACES if n != namespace)]


def webhook_configuration(service: str, namespace: str) -> dict[str, Any]:
    def hook(name: str, failure: str, timeout: int, operations: list[str],
             condition: tuple[str, str] | None, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": name,
            "admissionReviewVersions": ["v1"],
            # a pod sent to a DRA pool has its ResourceClaimTemplate made on admission, never for a dry run
            "sideEffects": "NoneOnDryRun",
            "failurePolicy": failure,
            "timeoutSeconds": timeout,
            "reinvocationPolicy": "IfNeeded",
            "matchPolicy": "Equivalent",
            "clientConfig": {"service": {"name": service, "namespace": namespace, "path": "/mutate", "port": 443}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": operations,
                       "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchExpressions": [
                {"key": labels.NAMESPACE_OPT_IN_LABEL, "operator": "In", "values": ["true"]},
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": exempt_namespaces(namespace)},
            ]},
            "objectSelector": {"matchExpressions": [
                {"key": labels.POD_OPT_OUT_LABEL, "operator": "NotIn", "values": ["true"]},
                *({"key": key, "operator": "DoesNotExist"} for key in skip),
            ]},
        }
        if condition is not None:
            out["matchConditions"] = [{"name": condition[0], "expression": condition[1]}]
        return out

    reports = {
        "name": REPORTS_HOOK,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",  # an agent's write waits for the check; the agent tries again next round
        "timeoutSeconds": 5,
        "reinvocationPolicy": "Never",
        "matchPolicy": "Equivalent",
        "clientConfig": {"service": {"name": service, "namespace": namespace, "path": "/reports", "port": 443}},
        "rules": [{"apiGroups": [REPORT_GROUP], "apiVersions": [REPORT_VERSION],
                   "operations": ["CREATE", "UPDATE", "DELETE"], "resources": [REPORT_PLURAL], "scope": "Cluster"}],
        "matchConditions": [{"name": "node-agents-only",
                             "expression": f"request.userInfo.username == '{agent_user(namespace)}'"}],
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIG_NAME},
        "webhooks": [
            hook(GPU_HOOK, "Fail", 5, ["CREATE", "UPDATE"], ("gpu-ask-or-gpu-tailor-annotations-changed", GPU_PODS)),
            # every CREATE the first entry did not admit: a pod that another webhook gives a GPU ask later is
            # handled when this entry is called again (the API server reinvokes only webhooks it has called once);
            # a CPU-only pod waits at most 3 s for an answer, then is created as it is
            hook(CPU_HOOK, "Ignore", 3, ["CREATE"], None, skip=(labels.POD_ADMITTED_LABEL,)),
            reports,
        ],
    }
