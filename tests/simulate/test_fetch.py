"""``gpu-tailor trace fetch`` against a local HTTP server serving small files the tests make."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpu_tailor.cli import main
from gpu_tailor.simulate.fetch import ATTRIBUTION, OPENB, POD_COLUMNS, TraceFile, fetch, is_valid
from gpu_tailor.simulate.trace import TraceError, load_pods

NODES = b"sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,2,T4\n"
PODS = b"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\np1,2000,2048,0,0\n"


def spec(name: str, body: bytes, columns: tuple[str, ...] = POD_COLUMNS) -> TraceFile:
    return TraceFile(name, len(body), hashlib.sha256(body).hexdigest(), columns)


class Served:
    """What the server answers: a body per path, optionally cut short after ``short`` bytes of it."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {}
        self.short: dict[str, int] = {}
        self.requests: list[str] = []


@pytest.fixture
def server() -> Iterator[tuple[str, Served]]:
    served = Served()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            name = self.path.rsplit("/", 1)[-1]
            served.requests.append(name)
            body = served.bodies.get(name)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            cut = served.short.get(name)
            self.wfile.write(body if cut is None else body[:cut])
            if cut is not None:
                self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/csv/", served
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def quiet(_: str) -> None:
    pass


def test_fetch_writes_checked_files_and_the_attribution(tmp_path: Path, server: tuple[str, Served]) -> None:
    url, served = server
    served.bodies = {"nodes.csv": NODES, "pods.csv": PODS}
    files = (spec("nodes.csv", NODES, ("sn", "gpu")), spec("pods.csv", PODS))
    paths = fetch(tmp_path / "trace", url, files, log=quiet)
    assert [p.read_bytes() for p in paths] == [NODES, PODS]
    assert (tmp_path / "trace" / "README.md").read_text() == ATTRIBUTION
    assert "CC BY 4.0" in ATTRIBUTION and "USENIX ATC '23" in ATTRIBUTION
    assert [p.name for p in load_pods(paths[1])] == ["p0", "p1"]
    assert sorted(p.name for p in (tmp_path / "trace").iterdir()) == ["README.md", "nodes.csv", "pods.csv"]
    served.requests.clear()
    fetch(tmp_path / "trace", url, files, log=quiet)
    assert served.requests == []  # valid files are kept, not downloaded again


def test_a_tampered_file_is_refused_and_nothing_is_left(tmp_path: Path, server: tuple[str, Served]) -> None:
    url, served = server
    served.bodies = {"nodes.csv": NODES, "pods.csv": PODS.replace(b"500", b"900")}
    files = (spec("nodes.csv", NODES, ("sn",)), spec("pods.csv", PODS))
    with pytest.raises(TraceError, match="SHA-256"):
        fetch(tmp_path, url, files, log=quiet)
    assert list(tmp_path.iterdir()) == []  # not even the good first file: all or nothing


def test_a_download_cut_short_is_refused_and_nothing_is_left(tmp_path: Path, server: tuple[str, Served]) -> None:
    url, served = server
    served.bodies = {"pods.csv": PODS}
    served.short = {"pods.csv": 20}
    with pytest.raises(TraceError, match=r"pods\.csv: 20 bytes, the published file has 80"):
        fetch(tmp_path, url, (spec("pods.csv", PODS),), log=quiet)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_file_and_missing_columns_are_clear_errors(tmp_path: Path, server: tuple[str, Served]) -> None:
    url, served = server
    with pytest.raises(TraceError, match="404"):
        fetch(tmp_path, url, (spec("absent.csv", PODS),), log=quiet)
    served.bodies = {"nodes.csv": NODES}
    with pytest.raises(TraceError, match=r"missing column.*num_gpu"):
        fetch(tmp_path, url, (spec("nodes.csv", NODES),), log=quiet)
    assert list(tmp_path.iterdir()) == []


def test_an_invalid_file_already_there_is_replaced(tmp_path: Path, server: tuple[str, Served]) -> None:
    url, served = server
    served.bodies = {"pods.csv": PODS}
    (tmp_path / "pods.csv").write_bytes(PODS[:-5])
    files = (spec("pods.csv", PODS),)
    assert not is_valid(tmp_path / "pods.csv", files[0])
    fetch(tmp_path, url, files, log=quiet)
    assert (tmp_path / "pods.csv").read_bytes() == PODS


def test_the_command_checks_the_published_digests(tmp_path: Path, server: tuple[str, Served],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The real file list: a server whose files differ from the published ones is refused, with the reason."""
    url, served = server
    served.bodies = {f.name: (NODES if "node" in f.name else PODS) for f in OPENB}
    assert main(["trace", "fetch", str(tmp_path / "openb"), "--base-url", url]) == 1
    err = capsys.readouterr().err
    assert "openb_node_list_gpu_node.csv" in err and "published" in err and "nothing new" in err
    assert list((tmp_path / "openb").iterdir()) == []


def test_simulate_trace_needs_the_node_list_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--trace", str(tmp_path)]) == 2
    assert "gpu-tailor trace fetch" in capsys.readouterr().err
    assert main(["simulate", "--workload", "gpuspec10"]) == 2
    assert "needs --trace" in capsys.readouterr().err
