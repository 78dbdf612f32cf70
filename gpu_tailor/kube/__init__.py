"""The only package that talks to the Kubernetes API (kubernetes-asyncio), plus the offline
``--cluster-file`` reader. Both services get their cluster state from here."""
