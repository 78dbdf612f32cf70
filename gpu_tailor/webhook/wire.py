"""AdmissionReview v1 on the wire: the request fields we read and the response we write."""

from __future__ import annotations

import base64
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from gpu_tailor.webhook.mutate import Decision

# metav1.StatusReason for the codes a denial carries
REASONS = {400: "BadRequest", 422: "Invalid", 403: "Forbidden"}


class Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    uid: str = Field(min_length=1)
    kind: dict[str, Any] = Field(default_factory=dict)
    operation: str = "CREATE"
    object: Any = None  # the raw Pod: validated by gpumodel, not here
    dryRun: bool = False


class AdmissionReview(BaseModel):
    model_config = ConfigDict(extra="allow")

    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: Request


def response(uid: str, decision: Decision) -> dict[str, Any]:
    body: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if decision.allowed and decision.patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = base64.b64encode(orjson.dumps(decision.patch)).decode()
    if not decision.allowed:
        body["status"] = {"code": decision.code, "message": decision.message,
                          "reason": REASONS.get(decision.code, "Forbidden")}
    if decision.warnings:
        body["warnings"] = list(decision.warnings)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": body}
