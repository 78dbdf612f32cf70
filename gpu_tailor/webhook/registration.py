"""The MutatingWebhookConfiguration that registers the webhook with kube-apiserver.

One definition for ``manifests/webhook/mutatingwebhookconfiguration.yaml`` (a test keeps the two
identical) and for ``gpu-tailor certs``, which writes it with the caBundle filled in.

What it selects and why:

* every pod CREATE in a namespace labelled ``gpu-tailor.io/enabled=true``, but never in the webhook's
  own namespace or kube-system, whatever their labels: with ``failurePolicy: Fail`` a webhook that is
  down would otherwise block the pods that bring it (or the cluster's DNS and network) back. The
  selector reads ``kubernetes.io/metadata.name``, which the API server sets and nobody can change;
  ``mutate.decide`` lets pods of these namespaces through untouched as well;
* a pod UPDATE only when it adds, removes or changes a ``gpu-tailor.io/*`` annotation (a CEL
  ``matchCondition``, evaluated by the API server; beta and on by default in Kubernetes 1.28), which
  the webhook refuses (``guard``). Updates that leave them alone never reach it, so labels and
  finalizers keep working while it is down. The extender's GPUs arrive through ``pods/binding``,
  which no rule here matches;
* not pods labelled ``gpu-tailor.io/skip=true``.
"""

from __future__ import annotations

from typing import Any

from gpu_tailor.gpumodel import labels

WEBHOOK_CONFIG_NAME = "gpu-tailor"
NAMESPACE = "gpu-tailor"  # the webhook's own (manifests/webhook/namespace.yaml)
SYSTEM_NAMESPACES = ("kube-system",)
EXEMPT_NAMESPACES = frozenset({NAMESPACE, *SYSTEM_NAMESPACES})

_ANNOTATIONS_CHANGED = " ".join([
    "request.operation == 'CREATE' ||",
    "(has(object.metadata.annotations) && object.metadata.annotations.exists(k,",
    f"k.startsWith('{labels.TAILOR_DOMAIN}/') && !(has(oldObject.metadata.annotations) &&",
    "k in oldObject.metadata.annotations && oldObject.metadata.annotations[k] == object.metadata.annotations[k])))",
    "||",
    "(has(oldObject.metadata.annotations) && oldObject.metadata.annotations.exists(k,",
    f"k.startsWith('{labels.TAILOR_DOMAIN}/') && !(has(object.metadata.annotations) &&",
    "k in object.metadata.annotations)))",
])


def exempt_namespaces(namespace: str) -> list[str]:
    """The namespaces the webhook never acts in, when it runs in ``namespace``."""
    return [namespace, *(n for n in SYSTEM_NAMESPACES if n != namespace)]


def webhook_configuration(service: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIG_NAME},
        "webhooks": [{
            "name": "pods.gpu-tailor.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "reinvocationPolicy": "IfNeeded",
            "matchPolicy": "Equivalent",
            "clientConfig": {"service": {"name": service, "namespace": namespace, "path": "/mutate", "port": 443}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "matchConditions": [{"name": "create-or-gpu-tailor-annotations-changed",
                                 "expression": _ANNOTATIONS_CHANGED}],
            "namespaceSelector": {"matchExpressions": [
                {"key": labels.NAMESPACE_OPT_IN_LABEL, "operator": "In", "values": ["true"]},
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": exempt_namespaces(namespace)},
            ]},
            "objectSelector": {"matchExpressions": [
                {"key": labels.POD_OPT_OUT_LABEL, "operator": "NotIn", "values": ["true"]},
            ]},
        }],
    }
