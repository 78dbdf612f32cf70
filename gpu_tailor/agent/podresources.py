"""The kubelet's PodResources API (``v1.PodResourcesLister``, gRPC over the kubelet's unix socket): which
devices each container was given, and which devices the node has.

The API is a documented wire format (Kubernetes "Monitoring device plugin resources"; GA since 1.28 for
``GetAllocatableResources``). The messages are defined here, in code, with only the fields this project
reads -- protobuf ignores the others on the wire, so newer kubelets (CPU ids, memory, dynamic resources)
answer the same calls. No generated code and no ``.proto`` file: the descriptors are built at import.

    List                    -> pod_resources[]: name, namespace, containers[]: name, devices[]
    GetAllocatableResources -> devices[]
    ContainerDevices        =  resource_name, device_ids[]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from gpu_tailor.agent.options import SOCKET

SERVICE = "v1.PodResourcesLister"

_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_ONE = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_MANY = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED

# message -> (field name, number, type, label, message type); numbers are the wire format's
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _MESSAGE, _MANY, "PodResources")],
    "PodResources": [("name", 1, _STRING, _ONE, ""), ("namespace", 2, _STRING, _ONE, ""),
                     ("containers", 3, _MESSAGE, _MANY, "ContainerResources")],
    "ContainerResources": [("name", 1, _STRING, _ONE, ""), ("devices", 2, _MESSAGE, _MANY, "ContainerDevices")],
    "ContainerDevices": [("resource_name", 1, _STRING, _ONE, ""), ("device_ids", 2, _STRING, _MANY, "")],
    "AllocatableResourcesRequest": [],
    "AllocatableResourcesResponse": [("devices", 1, _MESSAGE, _MANY, "ContainerDevices")],
}


def _classes() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(name="gpu_tailor/podresources_v1.proto", package="v1",
                                               syntax="proto3")
    for name, fields in _MESSAGES.items():
        msg = proto.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            field = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()  # our own pool: never clashes with another copy of these names
    pool.AddSerializedFile(proto.SerializeToString())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}")) for name in _MESSAGES}


MESSAGES = _classes()
# method -> (request message, response message)
METHODS = {"List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
           "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse")}


@dataclass(frozen=True, slots=True)
class Devices:
    """Devices of one resource: given to one container (``pod``, ``container`` set), or the node's own."""

    resource: str
    ids: tuple[str, ...]
    namespace: str = ""
    pod: str = ""
    container: str = ""


def _devices(raw: Any, **where: str) -> list[Devices]:
    return [Devices(d.resource_name, tuple(d.device_ids), **where) for d in raw if d.device_ids]


def parse_list(response: Any) -> list[Devices]:
    """A ``ListPodResourcesResponse`` as the devices each container holds."""
    return [dev for p in response.pod_resources for c in p.containers
            for dev in _devices(c.devices, namespace=p.namespace, pod=p.name, container=c.name)]


def parse_allocatable(response: Any) -> list[Devices]:
    """An ``AllocatableResourcesResponse`` as the node's devices per resource."""
    return _devices(response.devices)


class PodResourcesError(Exception):
    """The kubelet could not be asked (no socket, an old kubelet, a timeout): said, never a crash."""


class Client:
    """One channel to the kubelet's socket; ``await assigned()`` and ``await allocatable()``."""

    def __init__(self, socket: str = SOCKET, timeout: float = 10.0) -> None:
        self.socket, self.timeout = socket, timeout
        self.channel = grpc.aio.insecure_channel(f"unix://{socket}")

    async def _call(self, method: str) -> Any:
        req, resp = METHODS[method]
        call = self.channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=_serialize,
                                        response_deserializer=MESSAGES[resp].FromString)
        try:
            return await call(MESSAGES[req](), timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise PodResourcesError(f"{method} on {self.socket}: {exc.code().name}: {exc.details()}") from exc

    async def assigned(self) -> list[Devices]:
        """``List``: the devices each container of the node's pods holds."""
        return parse_list(await self._call("List"))

    async def allocatable(self) -> list[Devices]:
        """The node's devices; empty where the kubelet does not serve it (it is GA from 1.28 on)."""
        try:
            return parse_allocatable(await self._call("GetAllocatableResources"))
        except PodResourcesError as exc:
            if "UNIMPLEMENTED" in str(exc):
                return []
            raise

    async def close(self) -> None:
        await self.channel.close()


def _serialize(message: Any) -> bytes:
    out: bytes = message.SerializeToString()
    return out
