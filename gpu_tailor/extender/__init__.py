"""kube-scheduler extender: filter and score nodes by per-GPU occupancy and NVLink topology."""
