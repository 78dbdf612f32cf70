"""Serving TLS for both services: TLS >= 1.2 from PEM files, reloaded when the files change."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl

log = logging.getLogger(__name__)


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


class CertReloader:
    """Reload the serving certificate into the live SSLContext when either file changes."""

    def __init__(self, ctx: ssl.SSLContext, cert: str, key: str) -> None:
        self.ctx, self.cert, self.key = ctx, cert, key
        self.stamp = self._stamp()

    def _stamp(self) -> tuple[float, float]:
        return (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime)

    def check(self) -> bool:
        """Reload if changed; a half-written pair is retried on the next check."""
        try:
            stamp = self._stamp()
            if stamp == self.stamp:
                return False
            self.ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.warning("serving certificate not reloaded yet: %s", exc)
            return False
        self.stamp = stamp
        log.info("serving certificate reloaded")
        return True

    async def run(self, interval: float = 10.0) -> None:
        while True:
            await asyncio.sleep(interval)
            self.check()
