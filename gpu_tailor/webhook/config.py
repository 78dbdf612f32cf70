"""The webhook's policy file (``--config``), validated by pydantic.

Offerings declared here are those the cluster can provide but does not show yet -- a node pool
scaled to zero has no Node objects, yet a pod asking for its GPUs must be admitted so the
autoscaler can bring it up.

Example::

    schedulerName: gpu-tailor-scheduler   # "" leaves pods' schedulerName alone
    cpuOnlyPods: true                     # pods without a GPU ask go to schedulerName too (false: left alone)
    defaultIsolation: any                 # any | mig | mps | time-slicing | exclusive
    onMismatch: deny                      # deny | useLimits
    offerings:
    - backing: mig                        # whole | mig | time-slicing | mps
      product: NVIDIA-H100-80GB-HBM3
      migProfile: 1g.10gb
      migStrategy: mixed                  # mixed (nvidia.com/mig-<p>) | single (nvidia.com/gpu)
      gpusPerNode: 8
      nodeSelector: {agentpool: h100mig}
    - backing: time-slicing
      product: Tesla-T4
      replicas: 4
      renamed: true                       # resource nvidia.com/gpu.shared
      failRequestsGreaterThanOne: true
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpu_tailor.gpumodel import devices, labels, mig
from gpu_tailor.gpumodel.ask import Isolation
from gpu_tailor.gpumodel.devices.base import DeclaredSpec
from gpu_tailor.gpumodel.quantity import QuantityError, parse_bytes


class ConfigError(ValueError):
    """The policy file is unreadable or invalid; the message names the bad field."""


class DeclaredOffering(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backing: Literal["whole", "mig", "time-slicing", "mps"]
    product: str = Field(min_length=1)
    migProfile: str | None = None
    migStrategy: Literal["mixed", "single"] = "mixed"
    replicas: int | None = Field(default=None, ge=2, le=1024)
    renamed: bool = False
    failRequestsGreaterThanOne: bool = False
    gpuMemory: str | None = None  # per GPU, e.g. 80Gi; default from the MIG table where known
    gpusPerNode: int = Field(default=1, ge=1, le=64)
    nodeSelector: dict[str, str] = Field(default_factory=dict)

    @field_validator("gpuMemory")
    @classmethod
    def _memory(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_bytes(v)
            except QuantityError as exc:
                raise ValueError(str(exc)) from exc
        return v

    @model_validator(mode="after")
    def _consistent(self) -> DeclaredOffering:
        problem = devices.DEVICES[self.backing].declared_problem(self.spec())
        if problem:
            raise ValueError(problem)
        if self.gpuMemory is None and mig.sku_for_product(self.product) is None:
            raise ValueError(f"gpuMemory is required for {self.product} (not in the MIG table)")
        return self

    def spec(self) -> DeclaredSpec:
        """The offering as its device reads it (``gpumodel.devices``)."""
        sku = mig.sku_for_product(self.product)
        memory = parse_bytes(self.gpuMemory) // 2**20 if self.gpuMemory else (sku.memory_mib if sku else 0)
        return DeclaredSpec(
            backing=self.backing, product=self.product, mig_profile=self.migProfile, mig_strategy=self.migStrategy,
            replicas=self.replicas, renamed=self.renamed, fail_requests_gt_one=self.failRequestsGreaterThanOne,
            gpu_memory_mib=memory, gpus_per_node=self.gpusPerNode,
            node_selector=tuple(sorted(self.nodeSelector.items())))


class AdmissionPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schedulerName: str = labels.GPU_TAILOR_SCHEDULER
    # Pods of an opted-in namespace that ask for no GPU go to ``schedulerName`` too, so the extender
    # places their CPU and memory where they strand no GPU. Left to a scheduler that spreads, they
    # take the CPU beside free GPUs: on the openb replay (docs/design.md, "The openb trace on a real control
    # plane") allocation fell by 3.5 points.
    cpuOnlyPods: bool = True
    defaultIsolation: Isolation = Isolation.ANY
    onMismatch: Literal["deny", "useLimits"] = "deny"
    offerings: tuple[DeclaredOffering, ...] = ()


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_policy(text: str, source: str = "config") -> AdmissionPolicy:
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return AdmissionPolicy.model_validate(data)
    except ValidationError as exc:
        lines = [f"{source}: {_field_path(tuple(e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from None


def load_policy(path: str | Path | None) -> AdmissionPolicy:
    if path is None:
        return AdmissionPolicy()
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from exc
    return parse_policy(text, str(path))
