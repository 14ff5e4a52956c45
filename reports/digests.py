"""What ties a verdict to its evidence: the digest of each check's evidence, and the evidence archive.

A check's evidence is its result (as ``checks/<check>.json`` holds it) and the files its evidence
names (``evidence/<check>/...``: Pod timelines, logs, manifests). Its digest is one ``sha256`` over
those, as ``sha256sum`` lines sorted by name (``result.json`` for the result, the file names for the
rest), so a reviewer can recompute it with standard tools. The files are read from the evidence
archive when the run's folder has one (a submission: ``evidence.tar.gz``), else from the run's
``evidence/`` folder (``reports.figures.resolve``).

``write_archive`` writes that archive deterministically (members sorted, fixed mtimes, owners and
modes, no gzip timestamp): bundling one run twice gives the same bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path, PurePosixPath
from typing import Final

from reports.figures import resolve
from reports.model import CheckResult, RunRecord
from reports.provenance import digest_of_files, file_digest

ARCHIVE: Final = "evidence.tar.gz"
RESULT_NAME: Final = "result.json"
MTIME: Final = 0
"""Every member's mtime in the archive (and the gzip header's): 1970-01-01, so bytes never vary."""


def member_name(path: str) -> str:
    """Where an evidence file named in a result lies in the archive: ``evidence/<check>/<file>``."""
    parts = PurePosixPath(path.replace("\\", "/")).parts
    if "evidence" in parts:
        return "/".join(parts[parts.index("evidence") :])
    return "evidence/" + "/".join(parts[-2:])


def read_archive(path: Path) -> dict[str, bytes]:
    """Every regular file of an evidence archive, by member name; raises ``OSError``/``tarfile.TarError``."""
    out = {}
    with tarfile.open(path, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile():
                handle = tar.extractfile(member)
                if handle is not None:
                    out[member.name] = handle.read()
    return out


def result_bytes(result: CheckResult) -> bytes:
    """A check's result as ``checks/<check>.json`` holds it."""
    return (json.dumps(result.as_dict(), indent=2, default=str) + "\n").encode()


def evidence_files(record: RunRecord, archive: dict[str, bytes] | None = None) -> dict[str, dict[str, bytes]]:
    """Per check key, the files its evidence names (name: content) that could be found."""
    if archive is None and record.directory is not None and (record.directory / ARCHIVE).is_file():
        archive = read_archive(record.directory / ARCHIVE)
    out: dict[str, dict[str, bytes]] = {}
    for result in record.results:
        found: dict[str, bytes] = {}
        for name, path in sorted((result.evidence.get("files") or {}).items()):
            if archive is not None:
                content = archive.get(member_name(str(path)))
                if content is not None:
                    found[str(name)] = content
                continue
            located = resolve(record, str(path))
            if located is not None:
                found[str(name)] = located.read_bytes()
        out[result.key] = found
    return out


def check_digest(result: CheckResult, files: dict[str, bytes]) -> str:
    """The digest of one check's evidence (its result and its files)."""
    return digest_of_files({RESULT_NAME: result_bytes(result), **{f"files/{n}": c for n, c in files.items()}})


def check_digests(record: RunRecord, archive: dict[str, bytes] | None = None) -> dict[str, str]:
    files = evidence_files(record, archive)
    return {r.key: check_digest(r, files.get(r.key, {})) for r in record.results}


def file_digests(record: RunRecord) -> dict[str, str]:
    """Digests of ``run.json``, ``junit.xml`` and the evidence archive in the run's folder (empty: none)."""
    base = record.directory
    if base is None:
        return {"runJson": "", "junitXml": "", "archive": ""}
    return {
        "runJson": file_digest(base / "run.json"),
        "junitXml": file_digest(base / "junit.xml"),
        "archive": file_digest(base / ARCHIVE),
    }


def write_archive(files: dict[str, bytes], path: Path) -> Path:
    """A deterministic ``tar.gz`` of ``files`` (member name: content)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            info.mtime = MTIME
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[name]))
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=MTIME, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    path.write_bytes(packed.getvalue())
    return path
