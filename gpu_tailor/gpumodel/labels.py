"""Every label, annotation and resource-name constant the project reads or writes.

One home for these strings, so the webhook, the extender and the simulator can never disagree on a
spelling. The NVIDIA names are those written by GPU Feature Discovery (GFD) and the GPU operator.
"""

from __future__ import annotations

# --- NVIDIA GPU Feature Discovery / GPU operator node labels -----------------------------------
GFD_PREFIX = "nvidia.com/"
GPU_PRESENT = "nvidia.com/gpu.present"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB per device (per MIG device under single strategy)
GPU_FAMILY = "nvidia.com/gpu.family"  # architecture: ampere, hopper, turing, volta ...
GPU_REPLICAS = "nvidia.com/gpu.replicas"
GPU_SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"  # none | time-slicing | mps
GPU_DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
MIG_STRATEGY = "nvidia.com/mig.strategy"  # none | single | mixed
MIG_CAPABLE = "nvidia.com/mig.capable"
MIG_CONFIG = "nvidia.com/mig.config"
# mig-manager's progress applying nvidia.com/mig.config: pending, rebooting, failed or success
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
MPS_CAPABLE = "nvidia.com/mps.capable"
MIG_LABEL_PREFIX = "nvidia.com/mig-"  # nvidia.com/mig-<profile>.count / .memory / .replicas

# Not published by GFD; an operator may set it to describe the GPU interconnect of a node.
TOPOLOGY_LABEL = "gpu-tailor.io/gpu-topology"  # nvswitch | nvlink-pairs | pcie
# how the pool's device plugin hands out replicas (--shared-devices-allocation-policy): distributed | packed | spread
REPLICA_POLICY_LABEL = "gpu-tailor.io/replica-policy"

# --- NVIDIA extended resources -----------------------------------------------------------------
RESOURCE_DOMAIN = "nvidia.com"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_SHARED_RESOURCE = "nvidia.com/gpu.shared"
GPU_TAINT_KEY = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # nvidia.com/mig-<profile>: MIG instances (the mixed strategy)
# One scheduler for the GPU nodes gpu-tailor packs: taint them gpu-tailor.io/managed:NoSchedule and only the
# pods the webhook sends to gpu-tailor-scheduler tolerate it (docs/admin.md, "The taint")
MANAGED_TAINT_KEY = "gpu-tailor.io/managed"

# --- gpu-tailor's own vocabulary ---------------------------------------------------------------
TAILOR_DOMAIN = "gpu-tailor.io"
GPU_MILLI = "gpu-tailor.io/gpu-milli"
GPU_MEMORY_RESOURCE = "gpu-tailor.io/gpu-memory"
VIRTUAL_RESOURCES = (GPU_MILLI, GPU_MEMORY_RESOURCE)

ANN_ISOLATION = "gpu-tailor.io/isolation"
ANN_GPU_PRODUCT = "gpu-tailor.io/gpu-product"
ANN_TOPOLOGY = "gpu-tailor.io/topology"
ANN_ASK = "gpu-tailor.io/ask"
ANN_BACKING = "gpu-tailor.io/backing"
ANN_GPUS = "gpu-tailor.io/gpus"
# where the device plugin may hand out other GPUs than ANN_GPUS names (GPUs, or replicas' GPUs, that rank alike):
# every GPU it may pick among; absent where the pick is known
ANN_GPUS_AMONG = "gpu-tailor.io/gpus-among"

NAMESPACE_OPT_IN_LABEL = "gpu-tailor.io/enabled"
POD_OPT_OUT_LABEL = "gpu-tailor.io/skip"
# written by the webhook on every GPU pod it admits: the second webhook entry's objectSelector skips such a pod, so
# each pod costs one webhook call (a label, not a matchCondition: kube-apiserver evaluates a label selector for next
# to nothing, a CEL condition by converting the whole pod)
POD_ADMITTED_LABEL = "gpu-tailor.io/admitted"
# the schedulerName of the kube-scheduler profile that runs gpu-tailor's extender (manifests/scheduler)
GPU_TAILOR_SCHEDULER = "gpu-tailor-scheduler"

# --- groups of pods placed whole (gangs) and NVLink domains --------------------------------------
# NVIDIA GPU Feature Discovery: the NVLink domain of a GB200/GB300 NVL72 node, <fabric ClusterUUID>.<CliqueId>
GPU_CLIQUE = "nvidia.com/gpu.clique"
# gpu-tailor's own group ask, on a pod template that names no other convention
ANN_GROUP = "gpu-tailor.io/group"  # the group's name (namespaced)
ANN_GROUP_SIZE = "gpu-tailor.io/group-size"  # how many pods it has
ANN_GROUP_DOMAIN = "gpu-tailor.io/nvlink-domain"  # required | preferred | anywhere
# the extender's plan for a group, written on the member it was made for (where a restarted extender finds it)
ANN_GROUP_PLAN = "gpu-tailor.io/group-plan"
# other projects' conventions, read as they write them
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"  # label
KUEUE_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"  # annotation
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"  # label
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"  # label
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"  # annotation: pods per group, the leader included
COSCHEDULING_GROUP = "scheduling.x-k8s.io/pod-group"  # label naming a scheduler-plugins PodGroup
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"  # label
JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"  # label
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"  # label
JOB_NAME = "batch.kubernetes.io/job-name"  # label
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # annotation (Indexed Jobs)
