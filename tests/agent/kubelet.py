"""A stand-in kubelet for the agent's tests: a real gRPC server on a unix socket serving
``v1.PodResourcesLister``, its answers encoded here byte by byte from the documented wire format (field numbers
of the Kubernetes PodResources v1 API), independently of the agent's own message definitions -- so a wrong
field number on either side fails the tests. It also adds fields the agent does not read (CPU ids, a NUMA
topology), as newer kubelets send."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def text(number: int, value: str) -> bytes:
    raw = value.encode()
    return varint(number << 3 | 2) + varint(len(raw)) + raw


def message(number: int, body: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(body)) + body


def packed_ints(number: int, values: list[int]) -> bytes:
    return message(number, b"".join(varint(v) for v in values))


def devices(resource: str, ids: list[str], numa: int = 0) -> bytes:
    """ContainerDevices: resource_name = 1, device_ids = 2, topology = 3 (TopologyInfo: nodes = 1, NUMANode ID = 1)."""
    topology = message(1, varint(1 << 3 | 0) + varint(numa))
    return text(1, resource) + b"".join(text(2, i) for i in ids) + message(3, topology)


@dataclass
class Held:
    namespace: str
    pod: str
    container: str
    resource: str
    ids: list[str]


@dataclass
class Kubelet:
    """What the stand-in answers: each container's devices, and the node's allocatable devices by resource."""

    held: list[Held] = field(default_factory=list)
    allocatable: dict[str, list[str]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def list_response(self) -> bytes:
        pods: dict[tuple[str, str], list[Held]] = {}
        for h in self.held:
            pods.setdefault((h.namespace, h.pod), []).append(h)
        out = b""
        for (namespace, name), held in pods.items():
            # PodResources: name = 1, namespace = 2, containers = 3; ContainerResources: name = 1, devices = 2,
            # cpu_ids = 3 (not read by the agent)
            containers = b"".join(message(3, text(1, h.container) + message(2, devices(h.resource, h.ids))
                                          + packed_ints(3, [2, 3])) for h in held)
            out += message(1, text(1, name) + text(2, namespace) + containers)
        return out  # ListPodResourcesResponse: pod_resources = 1

    def allocatable_response(self) -> bytes:
        # AllocatableResourcesResponse: devices = 1, cpu_ids = 2
        return b"".join(message(1, devices(r, ids)) for r, ids in self.allocatable.items()) + packed_ints(2, [0, 1])

    def handler(self) -> grpc.GenericRpcHandler:
        def answer(method: str, make: object) -> grpc.RpcMethodHandler:
            async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                self.calls.append(method)
                assert request == b""  # both requests are empty messages
                return make()  # type: ignore[operator,no-any-return]
            return grpc.unary_unary_rpc_method_handler(call, request_deserializer=None, response_serializer=None)

        return grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": answer("List", self.list_response),
            "GetAllocatableResources": answer("GetAllocatableResources", self.allocatable_response)})


@asynccontextmanager
async def serving(kubelet: Kubelet, directory: Path) -> AsyncIterator[str]:
    """The stand-in on ``directory/kubelet.sock``; yields the socket's path."""
    path = str(directory / "kubelet.sock")
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((kubelet.handler(),))
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield path
    finally:
        await server.stop(None)
