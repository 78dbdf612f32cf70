"""gpu-tailor: portable GPU asks in, real NVIDIA resources out, and placement that packs GPUs well.

Packages: ``gpumodel`` (pure GPU knowledge shared by everything), ``webhook`` (admission),
``extender`` (kube-scheduler extender), ``certs`` (TLS material), ``simulate`` (trace replay).
"""

__version__ = "0.1.0"
