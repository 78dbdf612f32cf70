"""SIGTERM to the webhook while the API server is sending it admission requests: what a rolling update
does to one replica. Its readiness goes off first while it goes on answering, and it exits cleanly.
(Here its URL keeps pointing at it; in a cluster the endpoints would already have dropped it.)"""

from __future__ import annotations

import signal

import pytest

from tests.e2e.kube import wait_for
from tests.e2e.load import Creates
from tests.e2e.services import Service, Stack, probe

pytestmark = pytest.mark.e2e


def test_sigterm_turns_readiness_off_keeps_answering_then_exits_cleanly(cluster: Stack) -> None:
    # The manifests' drain (2 s) is for endpoints to catch up; here the test must see creates go
    # through after readiness went off on a loaded machine, so this replica drains for 10 s.
    cluster.webhook.stop()
    webhook = Service("gpu-tailor webhook (--drain 10)", [*cluster.webhook.argv, "--drain", "10"],
                      cluster.webhook.log, cluster.webhook.ready_url)
    webhook.start()
    load = Creates(cluster)
    with load.running():
        load.more(5, "before SIGTERM")
        webhook.send(signal.SIGTERM)
        wait_for(lambda: probe(webhook.ready_url) == 503, 5, "/readyz to answer 503 after SIGTERM")
        # not ready, yet still answering the API server during the drain
        load.more(3, "while the webhook drains")
        assert webhook.proc is not None
        code = wait_for(lambda: webhook.proc is not None and webhook.proc.poll() is not None, 30,
                        "the webhook to exit after its drain")
        assert code
    assert webhook.proc is not None
    returncode = webhook.proc.returncode
    webhook.stop()  # already exited: this closes its log
    assert returncode == 0, webhook.tail()
    # once it is gone the API server is refused a connection (failurePolicy: Fail); no request it had
    # taken was left unanswered until the API server's timeout
    assert not [f for f in load.failures if "deadline exceeded" in f or "Timeout" in f], load.failures[:5]
    cluster.webhook.start()
    cluster.wait_admission_works(timeout=10)
