"""``gpu-tailor trace fetch DIR``: the Alibaba openb trace from its public home, checked, with its licence.

The project ships no trace: it generates its default workload (``synthetic``) and downloads the real one on
demand. Every file is checked against the size and SHA-256 it has upstream and must carry the columns the
replay reads. Files are staged under temporary names in DIR and renamed into place only once every one of
them has passed, so a failed, partial or tampered download leaves nothing new behind under a real name.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gpu_tailor.simulate.synthetic import NODE_COLUMNS
from gpu_tailor.simulate.trace import TraceError

TRACE_URL = "https://raw.githubusercontent.com/alibaba/clusterdata/master/cluster-trace-gpu-v2023/csv/"
TRACE_HOME = "https://github.com/alibaba/clusterdata/tree/master/cluster-trace-gpu-v2023"
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class TraceFile:
    name: str
    size: int
    sha256: str
    columns: tuple[str, ...]


# Sizes and digests of the files as published upstream (cluster-trace-gpu-v2023/csv).
OPENB = (
    TraceFile("openb_node_list_gpu_node.csv", 42353,
              "2beca64b4d3dfa342036a34b56a495c6cef9225db836c81f541282cb1df320b5", NODE_COLUMNS),
    TraceFile("openb_pod_list_default.csv", 575468,
              "1ee7ed79c27a3b0861cda8ddba86a004c6aba904caafa329a76ae93ca63834a8", POD_COLUMNS),
    TraceFile("openb_pod_list_gpushare20.csv", 574603,
              "9be2d0efb52e242c32e23dd184cc5fcc1983478c6c9c02cbb6b4b62925c0ffcd", POD_COLUMNS),
    TraceFile("openb_pod_list_gpuspec10.csv", 579461,
              "2dc7e4cb9480484f08539720b433a9ec9ab5d76b396f3f7557c53a2ff78a7611", POD_COLUMNS),
    TraceFile("openb_pod_list_multigpu20.csv", 271530,
              "d9ec6f6c74fb980cc0b81239470c6353fceea077ea9abd610003b604c7cc2b01", POD_COLUMNS),
)

ATTRIBUTION = f"""# Alibaba GPU cluster trace (openb)

The CSV files in this folder were downloaded by `gpu-tailor trace fetch` from the public Alibaba `clusterdata`
repository, `cluster-trace-gpu-v2023` ({TRACE_HOME}), unchanged (each checked against its published size
and SHA-256). They are licensed under the Creative Commons Attribution 4.0 International licence (CC BY 4.0,
https://creativecommons.org/licenses/by/4.0/). gpu-tailor does not distribute them.

Please cite:

> Qizhen Weng, Lingyun Yang, Yinghao Yu, Wei Wang, Xiaochuan Tang, Guodong Yang, Liping Zhang.
> "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent".
> 2023 USENIX Annual Technical Conference (USENIX ATC '23).
"""

Opener = Callable[[str, float], IO[bytes]]


def _open(url: str, timeout: float) -> IO[bytes]:
    return urllib.request.urlopen(url, timeout=timeout)  # type: ignore[no-any-return]


def is_valid(path: Path, spec: TraceFile) -> bool:
    """``path`` holds exactly the published file."""
    try:
        if path.stat().st_size != spec.size:
            return False
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
    except OSError:
        return False
    return digest.hexdigest() == spec.sha256


def _download(url: str, spec: TraceFile, folder: Path, timeout: float, opener: Opener) -> Path:
    """Stream ``url`` into a temporary file in ``folder`` and check it; the temporary file's path."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{spec.name}.", suffix=".part")
    path = Path(tmp)
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out, opener(url, timeout) as resp:
            first = b""
            while chunk := resp.read(CHUNK):
                if size < CHUNK:
                    first += chunk[: CHUNK - size]
                size += len(chunk)
                if size > spec.size:
                    raise TraceError(f"{url}: larger than the published {spec.size} bytes")
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if size != spec.size:
            raise TraceError(f"{url}: {size} bytes, the published file has {spec.size} (a partial download?)")
        if digest.hexdigest() != spec.sha256:
            raise TraceError(f"{url}: SHA-256 {digest.hexdigest()} is not the published {spec.sha256}")
        header = first.split(b"\n", 1)[0].decode("utf-8", "replace").strip().split(",")
        missing = [c for c in spec.columns if c not in header]
        if missing:
            raise TraceError(f"{url}: missing column(s) {', '.join(missing)}")
        return path
    except urllib.error.HTTPError as exc:
        path.unlink(missing_ok=True)
        raise TraceError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        path.unlink(missing_ok=True)
        if isinstance(exc, TraceError):
            raise
        raise TraceError(f"{url}: {getattr(exc, 'reason', None) or exc!r}") from exc
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def fetch(folder: Path, base_url: str = TRACE_URL, files: Sequence[TraceFile] = OPENB, timeout: float = 60,
          opener: Opener = _open, log: Callable[[str], None] = print) -> list[Path]:
    """Download ``files`` from ``base_url`` into ``folder`` (a file already there and valid is kept), then
    write the attribution beside them; the files' paths. Nothing is renamed into place unless all passed."""
    folder.mkdir(parents=True, exist_ok=True)
    base = base_url if base_url.endswith("/") else base_url + "/"
    staged: list[tuple[Path, Path]] = []
    try:
        for spec in files:
            target = folder / spec.name
            if is_valid(target, spec):
                log(f"{spec.name}: already here and valid")
                continue
            staged.append((_download(base + spec.name, spec, folder, timeout, opener), target))
            log(f"{spec.name}: {spec.size} bytes, SHA-256 checked")
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, target in staged:
        os.replace(tmp, target)
    notice = folder / "README.md"
    tmp_notice = notice.with_name(".README.md.part")
    tmp_notice.write_text(ATTRIBUTION)
    os.replace(tmp_notice, notice)
    return [folder / spec.name for spec in files]
