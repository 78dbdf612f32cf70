"""The anchor of ``webhook_create_latency.py``: a mutating webhook that does next to nothing, served as gpu-tailor's is
(aiohttp, TLS, one process), so that the benchmark compares gpu-tailor's cost with the cost of any webhook at all.

It answers every AdmissionReview allowed, with a one-operation JSONPatch (an annotation added), the least a
mutating webhook does; or, with ``--patch FILE``, with the JSONPatch in FILE (to measure what a bigger patch costs
the API server).

    python benchmarks/trivial_webhook.py --listen 127.0.0.1:PORT --tls-cert FILE --tls-key FILE [--patch FILE]
"""

from __future__ import annotations

import argparse
import base64
import json
import ssl

from aiohttp import web

PATCH = base64.b64encode(json.dumps([{"op": "add", "path": "/metadata/annotations",
                                      "value": {"bench.gpu-tailor.io/seen": "true"}}]).encode()).decode()


def answering(patch: str) -> web.Application:
    async def mutate(request: web.Request) -> web.Response:
        review = await request.json()
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
            "uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch", "patch": patch}})

    app = web.Application()
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/readyz", lambda _: web.Response(text="ok"))
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    parser.add_argument("--patch", metavar="FILE", help="answer this JSONPatch (a JSON list of operations)")
    args = parser.parse_args()
    patch = PATCH
    if args.patch:
        with open(args.patch, "rb") as f:
            patch = base64.b64encode(f.read()).decode()
    host, port = args.listen.rsplit(":", 1)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(args.tls_cert, args.tls_key)
    web.run_app(answering(patch), host=host, port=int(port), ssl_context=ctx, print=None, access_log=None)


if __name__ == "__main__":
    main()
