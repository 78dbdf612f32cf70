"""Pod creates through the webhook from a few threads, for tests that change something under load."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tests.e2e.kube import ApiError, Kube, Obj, api_path, wait_for
from tests.e2e.pods import gpu_pod, limits_of, unique
from tests.e2e.services import Stack


@contextmanager
def threads_of(target: Callable[[], None], n: int, stop: threading.Event, join_timeout: float) -> Iterator[None]:
    """``n`` daemon threads running ``target`` until the block ends; then ``stop`` is set and they are joined."""
    threads = [threading.Thread(target=target, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=join_timeout)


class Creates:
    """Pod creates through the webhook from 3 threads (dry-run: admission runs exactly as for a real
    create, nothing is stored), counting successes and keeping every failure's message."""

    def __init__(self, stack: Stack, limit_seconds: float = 90) -> None:
        self.stack, self.limit = stack, limit_seconds
        self.ok = 0
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def _run(self) -> None:
        deadline = threading.Event()
        timer = threading.Timer(self.limit, deadline.set)
        timer.start()
        try:
            while not self.stop.is_set() and not deadline.is_set():
                pod = gpu_pod(unique("rotation"), {"gpu-tailor.io/gpu-milli": "250"})
                # a fresh name each time: creates are dry runs, nothing is stored
                try:
                    out = self.stack.kube.create(api_path("pods", self.stack.opted_in), pod, dry_run=True)
                    rewritten = "gpu-tailor.io/gpu-milli" not in limits_of(out, "main")
                    with self.lock:
                        if rewritten:
                            self.ok += 1
                        else:
                            self.failures.append("admitted without the webhook's rewrite")
                except ApiError as exc:
                    with self.lock:
                        self.failures.append(f"{exc.status}: {exc.message}")
        finally:
            timer.cancel()

    def count(self) -> int:
        with self.lock:
            return self.ok

    def more(self, n: int, what: str) -> None:
        """Until ``n`` more creates have gone through."""
        target = self.count() + n
        wait_for(lambda: self.count() >= target, 30, f"{n} more creates {what}")

    @contextmanager
    def running(self) -> Iterator[Creates]:
        with threads_of(self._run, 3, self.stop, join_timeout=30):
            yield self


class Burst:
    """Real pod creates through the webhook from a few threads, that ride out an API server going away:
    a create the API server did not answer is sent again once ``/readyz`` answers, and a 409 on a retry
    means the first try got through. Any other refusal is kept in ``failures``."""

    def __init__(self, kube: Kube, namespace: str, pods: list[Obj], threads: int = 4) -> None:
        self.kube, self.namespace, self.threads = kube, namespace, threads
        self.todo = list(pods)
        self.created = 0
        self.retries = 0
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def _next(self) -> Obj | None:
        with self.lock:
            return self.todo.pop(0) if self.todo and not self.stop.is_set() else None

    def _api_ready(self) -> bool:
        return bool(self.kube.request("GET", "/readyz"))

    def _create(self, pod: Obj) -> None:
        path = api_path("pods", self.namespace)
        retried = False
        while not self.stop.is_set():
            try:
                self.kube.create(path, pod)
            except ApiError as exc:
                if exc.status == 409 and retried:
                    break  # an earlier try was stored before its answer was lost
                if exc.status < 500 and exc.status != 429:
                    with self.lock:
                        self.failures.append(f"{pod['metadata']['name']}: {exc.status}: {exc.message}")
                    return
            except (OSError, http.client.HTTPException):
                pass
            else:
                break
            retried = True
            with self.lock:
                self.retries += 1
            wait_for(self._api_ready, 120, "the API server to answer /readyz again")
        with self.lock:
            self.created += 1

    def _run(self) -> None:
        while (pod := self._next()) is not None:
            self._create(pod)

    def count(self) -> int:
        with self.lock:
            return self.created

    def wait_created(self, n: int, timeout: float = 180) -> None:
        wait_for(lambda: self.count() >= n, timeout, f"{n} pods created ({self.count()} so far)", interval=0.2)

    @contextmanager
    def running(self) -> Iterator[Burst]:
        with threads_of(self._run, self.threads, self.stop, join_timeout=60):
            yield self
