"""Where a run comes from, and what must not leave the machine it ran on.

- ``suite_identity``: the suite that made a run, as a reviewer checks it: its version, the source
  commit and whether the tree was modified, a digest of the installed distribution (or, for an
  editable install or a plain checkout, of the source tree), and digests of the catalog and the
  mutation score it ships.
- ``redact_argv``: a command line as it may be published (secrets and local paths replaced).
- ``leaks`` and ``redact_text``: home paths, kubeconfig paths and private addresses in a file;
  ``gpuconf report bundle`` removes them and ``gpuconf report verify`` refuses any left.
- ``sha256_of`` and ``digest_of_files``: the digests every part of a submission uses
  (``sha256:<hex>``).

Plain functions of paths and strings: no pytest, no cluster.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

PACKAGES: Final = ("conformance", "fixtures", "reports", "enforcement", "workloads")
"""The five parts whose files make up the suite (docs/architecture.md §1)."""
UNKNOWN_VERSION: Final = "0+unknown"
SKIPPED_PARTS: Final = ("__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache")
REDACTED: Final = "<redacted>"
KUBECONFIG: Final = "<kubeconfig>"
HOME: Final = "<home>"
PRIVATE_ADDRESS: Final = "<private-address>"
SECRET_OPTION: Final = re.compile(r"(token|password|passwd|secret|credential|api-?key)", re.IGNORECASE)
KUBECONFIG_OPTION: Final = ("--kubeconfig",)

HOME_PATH: Final = re.compile(
    r"(?<![\w<])(/home/[^/\s\"'<>:,;]+|/Users/[^/\s\"'<>:,;]+|/root(?=[/\s\"'<>:,;]|$))"
)
KUBECONFIG_PATH: Final = re.compile(
    r"(?<![\w<])(?:~|/[^\s\"'<>,;]*)?/?\.kube/config\b|(?<![\w<])/[^\s\"'<>,;]*kubeconfig[^\s\"'<>,;]*"
)
_OCTET: Final = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
PRIVATE_IPV4: Final = re.compile(
    rf"(?<![\d.])(?:10\.{_OCTET}|172\.(?:1[6-9]|2[0-9]|3[01])|192\.168|127\.{_OCTET}|169\.254)"
    rf"\.{_OCTET}\.{_OCTET}(?![\d.])"
)
LEAKS: Final = (
    ("kubeconfig path", KUBECONFIG_PATH, KUBECONFIG),
    ("home path", HOME_PATH, HOME),
    ("private address", PRIVATE_IPV4, PRIVATE_ADDRESS),
)


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes; empty when there is no such file."""
    try:
        return sha256_of(path.read_bytes())
    except OSError:
        return ""


def digest_of_files(files: Mapping[str, bytes]) -> str:
    """One digest over named contents, as ``sha256sum`` lines sorted by name (empty: nothing)."""
    if not files:
        return ""
    lines = "".join(f"{hashlib.sha256(files[name]).hexdigest()}  {name}\n" for name in sorted(files))
    return sha256_of(lines.encode())


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def source_tree_files(root: Path) -> dict[str, bytes]:
    """The suite's files under ``root`` (the folder holding the five parts): tracked ones when
    ``root`` is a git checkout, else every file of the five parts but caches and compiled code."""
    listed = _git(root, "ls-files", "-z", "--", *PACKAGES, "pyproject.toml")
    names: Iterable[str]
    if listed is not None:
        names = [n for n in listed.split("\0") if n]
    else:
        names = [
            str(p.relative_to(root))
            for part in PACKAGES
            for p in (root / part).rglob("*")
            if p.is_file() and p.suffix != ".pyc" and not set(p.parts) & set(SKIPPED_PARTS)
        ]
    out = {}
    for name in names:
        try:
            out[name] = (root / name).read_bytes()
        except OSError:
            continue  # deleted in the work tree: git status says it is modified
    return out


def _distribution() -> tuple[str, bool]:
    """The digest of the installed distribution's RECORD (every file it installed, with its hash),
    and whether it is an editable install (whose RECORD names no source file)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("gpuconf")
    except PackageNotFoundError:
        return "", False
    direct = dist.read_text("direct_url.json")
    editable = False
    if direct:
        try:
            editable = bool(json.loads(direct).get("dir_info", {}).get("editable"))
        except ValueError:
            editable = False
    record = dist.read_text("RECORD") or ""
    return (sha256_of(record.encode()) if record else ""), editable


def suite_identity(
    version: str, source: Path | None, catalog: Path | None, score: Path | None
) -> dict[str, Any]:
    """The suite that makes a run. ``source``: the folder holding the five parts (None: unknown);
    ``catalog`` and ``score``: the catalog and mutation score it ships."""
    commit, modified = "", None
    if source is not None and (found := _git(source, "rev-parse", "HEAD")):
        commit = found.strip()
        status = _git(source, "status", "--porcelain", "--", *PACKAGES, "pyproject.toml")
        modified = None if status is None else bool(status.strip())
    digest, editable = _distribution()
    digest_of = "distribution"
    if (not digest or editable) and source is not None:
        digest, digest_of = digest_of_files(source_tree_files(source)), "source tree"
    return {
        "version": version,
        "commit": commit,
        "modified": modified,
        "digest": digest,
        "digestOf": digest_of if digest else "",
        "catalogDigest": file_digest(catalog) if catalog else "",
        "mutationScoreDigest": file_digest(score) if score else "",
    }


def redact_argv(argv: list[str]) -> list[str]:
    """A command line as it may be published: the program by its name, secret option values as
    ``<redacted>``, a kubeconfig as ``<kubeconfig>``, and other absolute paths by their last part."""
    if not argv:
        return []
    program = Path(argv[0]).name
    if program in ("__main__.py", "python", "python3") or program.startswith("python3."):
        program = "pytest" if "pytest" in argv[0] else program
    out = [program]
    pending = ""  # the option whose value comes next
    for arg in argv[1:]:
        if pending:
            out.append(_redact_value(pending, arg))
            pending = ""
            continue
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
            out.append(f"{name}={_redact_value(name, value)}")
            continue
        if arg.startswith("--") and (SECRET_OPTION.search(arg) or arg in KUBECONFIG_OPTION):
            pending = arg
        out.append(_redact_value("", arg) if not arg.startswith("-") else arg)
    return out


def _redact_value(option: str, value: str) -> str:
    if SECRET_OPTION.search(option):
        return REDACTED
    if option in KUBECONFIG_OPTION:
        return KUBECONFIG
    if " " in value.strip():  # a command line in one value (--scheduler-command): each word on its own
        return " ".join(_redact_value(option, word) if word else word for word in value.split(" "))
    if value.startswith(("/", "~")) or os.path.isabs(value):
        return Path(value).name or value
    return redact_text(value)


def leaks(text: str) -> list[tuple[str, str]]:
    """(kind, what) of every home path, kubeconfig path and private address in ``text``."""
    found = []
    for kind, pattern, placeholder in LEAKS:  # each found once: a home path inside a kubeconfig path is one
        found += [(kind, match.group(0)) for match in pattern.finditer(text)]
        text = pattern.sub(placeholder, text)
    return found


def redact_text(text: str) -> str:
    """``text`` with kubeconfig paths, home paths and private addresses replaced by placeholders."""
    for _kind, pattern, placeholder in LEAKS:
        text = pattern.sub(placeholder, text)
    return text
