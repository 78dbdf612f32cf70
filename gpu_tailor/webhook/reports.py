"""``/reports``: a node agent may write only its own node's ``NodeGPUReport``; nothing else is sent here.

RBAC cannot say "your own node": the agents' ClusterRole grants writes on every report (``resourceNames``
are fixed names). So the webhook configuration's ``reports.gpu-tailor.io`` entry sends the agents' own
writes here (a ``matchConditions`` on the agent's service account: nobody else's writes wait on gpu-tailor),
and this check refuses one whose report is not named after the node the agent runs on. The node is what
the API server itself says of the caller -- never a field the caller writes:

* on Kubernetes 1.32 and later (1.30 and 1.31 with the ServiceAccountTokenPodNodeInfo feature, beta and on
  by default there), a pod's service account token carries its node, and the API server puts it in the
  request's ``userInfo.extra["authentication.kubernetes.io/node-name"]``;
* before that (1.28, 1.29), the token carries the pod (``.../pod-name``, ``.../pod-uid``, present since
  bound tokens, the default since 1.22), and the webhook reads that pod's ``spec.nodeName`` from the API
  (a pod of that name with another uid is not the caller's).

This entry only ever refuses: it never patches. The same check applies to deletes (the old object's name).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gpu_tailor.gpumodel.report import GROUP, PLURAL
from gpu_tailor.webhook.mutate import Decision
from gpu_tailor.webhook.registration import AGENT_SERVICE_ACCOUNT, agent_user

NODE_NAME = "authentication.kubernetes.io/node-name"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"

# (namespace, pod name) -> (uid, spec.nodeName), or None when there is no such pod
PodLookup = Callable[[str, str], Awaitable[tuple[str, str] | None]]


def _deny(message: str, code: int = 403) -> Decision:
    return Decision(allowed=False, code=code, message=message, outcome="denied", backing="report")


def _first(extra: Any, key: str) -> str:
    values = extra.get(key) if isinstance(extra, dict) else None
    return str(values[0]) if isinstance(values, list) and values else ""


async def check(request: dict[str, Any], namespace: str, pods: PodLookup | None,
                account: str = AGENT_SERVICE_ACCOUNT) -> Decision:
    """Allow or refuse one write of a report, as the API server sent it for review."""
    resource = request.get("resource") or {}
    if (resource.get("group"), resource.get("resource")) != (GROUP, PLURAL):
        return _deny(f"/reports reviews {PLURAL}.{GROUP} only, not {resource.get('resource')!r}", 400)
    user = request.get("userInfo") or {}
    agents = agent_user(namespace, account)
    if user.get("username") != agents:
        # only the agents' writes are sent here (the entry's matchConditions): anyone else's means the webhook
        # and the configuration disagree on the agents' namespace -- refuse rather than let a write through unchecked
        return _deny(f"/reports checks the node agents of namespace {namespace} ({agents}), not "
                     f"{user.get('username')!r}: the webhook's --agent-namespace and --agent-service-account and the "
                     "webhook configuration's matchConditions must name the same ServiceAccount", 500)
    obj = request.get("oldObject") if request.get("operation") == "DELETE" else request.get("object")
    name = str(request.get("name") or ((obj or {}).get("metadata") or {}).get("name") or "")
    extra = user.get("extra")
    node = _first(extra, NODE_NAME)
    if not node:
        pod = _first(extra, POD_NAME)
        if not pod:
            return _deny("the agent's credentials name no pod and no node (not a pod's service account token): "
                         "which node it runs on cannot be told")
        if pods is None:
            return _deny("the webhook cannot read pods to tell which node the agent runs on", 500)
        found = await pods(namespace, pod)
        uid = _first(extra, POD_UID)
        if found is None or (uid and found[0] != uid):
            return _deny(f"agent pod {namespace}/{pod} does not exist (any more)")
        node = found[1]
        if not node:
            return _deny(f"agent pod {namespace}/{pod} is not on a node yet")
    if name != node:
        return _deny(f"an agent on node {node} may write NodeGPUReport {node} only, not {name!r}")
    if request.get("operation") in ("CREATE", "UPDATE"):
        spec = (obj or {}).get("spec") or {}
        if spec.get("node") != name:
            return _deny(f"spec.node must be the report's name {name!r}, not {spec.get('node')!r}", 400)
    return Decision(allowed=True, backing="report")
