"""The result model: one run (or one probe) as plain data.

The model imports no other ``reports`` module (an import-linter contract keeps it so): the
renderings import the model, never the other way; the files a run writes are ``reports.records``.

Everything that shows a result (the terminal lines and summary, the per-check JSON, JUnit, and the
renderings that build on them) reads these values; nothing renders from pytest's own reports. The
pytest plugin fills the model on the controller, so it is whole under pytest-xdist.

What else the model holds, beside each check's result: the implementation under test as the run
saw it (``Environment``: scheduler, node agent and backend, GPUs, driver, CUDA and Kubernetes
versions where the nodes say), the catalog's profiles and features (``Catalog``), who submits
the report (``Implementation``, given as options; required only for a ConformanceReport meant as a
submission), how good the suite that made the run is (``suite_validation``: the mutation score
of its version, ``reports.validation``), and, since ``v1alpha2``, what exactly ran, by whom, on
what: the suite's identity (``suite``), the invocation (``invocation``) and the components under
test by digest (``components``). Every field added after the first release has a default,
so older ``run.json`` files still load. ``source`` says whether a record comes from ``gpuconf run``
or ``gpuconf probe``.

Outcomes: ``passed``, ``failed`` (the implementation broke the rule), ``skipped`` (a feature it
does not support, with the reason) and ``error`` (the suite could not judge). Exit codes follow
from them: 0 when no MUST check failed or errored, 1 when a MUST check failed, 3 when none failed
but one could not be judged (2 is for usage and preflight errors, before any check runs).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, TypeVar

Outcome = Literal["passed", "failed", "skipped", "error"]
OUTCOMES: Final[tuple[Outcome, ...]] = ("passed", "failed", "skipped", "error")
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOT_JUDGED: Final = 3
EXIT_PARTIAL: Final = 4
"""No MUST check failed or errored, but a core check was skipped or not judged, or no check was judged."""
SCHEMA: Final = "gpuconf.io/v1alpha2"
"""The apiVersion this release writes (``run.json`` and the ConformanceReport)."""
SCHEMA_V1ALPHA1: Final = "gpuconf.io/v1alpha1"
"""The first release's apiVersion: still read and rendered."""
SCHEMAS: Final = (SCHEMA_V1ALPHA1, SCHEMA)
Target = Literal["sandbox", "cluster", "probe"]
IMPLEMENTATION_TYPES: Final = ("scheduler", "node agent", "stack")
Source = Literal["run", "probe"]
NOT_JUDGED: Final = "not judged: "
"""How a check's note starts when it names part of its rule not judged for the implementation under
test (``fixtures.suite.frame`` ``not_judged``): the check's verdict stands, and every report names it."""
_T = TypeVar("_T")


def gpuconf_version() -> str:
    """The installed gpuconf's version (``0+unknown`` when run from a tree that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpuconf")
    except PackageNotFoundError:
        return "0+unknown"


def _known(cls: type[_T], data: dict[str, Any] | None) -> _T:
    """``cls(**data)`` with only the fields ``cls`` has: a newer writer's extra keys do not break a read."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in (data or {}).items() if k in names})


@dataclass
class Implementation:
    """Who submits which product version: the submitter file (``--submitter FILE``) or options
    (``--organization`` ...); required for a submission. Not the implementation *description*
    (how a stack behaves)."""

    organization: str = ""
    project: str = ""
    url: str = ""
    version: str = ""
    contact: list[str] = field(default_factory=list)
    type: str = ""
    """What the product is: ``scheduler``, ``node agent`` or ``stack`` (``IMPLEMENTATION_TYPES``)."""
    repository: str = ""
    """The product's source repository (URL)."""
    documentation: str = ""
    """The product's documentation (URL)."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("organization", "project", "url", "version", "contact")

    def missing(self) -> list[str]:
        """The fields a submission needs and this one lacks (the first release's five; ``type``
        and the URLs are checked by ``gpuconf report verify``)."""
        return [name for name in self.REQUIRED if not getattr(self, name)]


@dataclass
class Environment:
    """The implementation under test and where it ran, as far as the run could tell (empty: unknown)."""

    scheduler_name: str = ""
    scheduler_version: str = ""
    node_agent: str = ""
    """The node agent's name (``gpuconf-reference-agent``, a vendor's), when known."""
    agent_backend: str = ""
    """How the agent enforces: ``sim``, ``mps``, a vendor's."""
    simulated: bool | None = None
    """Whether the GPUs are simulated (the embedded sandbox, ``gpuconf probe --backend sim``)."""
    gpu_product: str = ""
    gpu_count: int = 0
    """GPUs across the nodes the run could use."""
    gpu_memory_mib: int = 0
    """Memory of one GPU (the first node's)."""
    driver_version: str = ""
    cuda_version: str = ""
    kubernetes_version: str = ""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """One entry per GPU node: name, gpus, memoryMiB, product, and whatever else the run read."""


@dataclass
class Catalog:
    """The catalog the run judged against: its profiles and features (name: description)."""

    profiles: list[str] = field(default_factory=list)
    features: dict[str, str] = field(default_factory=dict)


@dataclass
class CheckResult:
    """One check item's verdict, with what it judged and the evidence."""

    key: str
    """``<profile>/<id>`` (plus ``[form]`` for a per-form check)."""
    id: str
    profile: str
    party: str
    level: str
    statement: str
    capability: str
    outcome: Outcome
    reason: str = ""
    """One line: why it failed, errored or was skipped (empty when it passed)."""
    detail: str = ""
    duration_s: float = 0.0
    features: list[str] = field(default_factory=list)
    seed: str = ""
    form: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    nodeid: str = ""
    rules: list[str] = field(default_factory=list)
    """The contract rules (``enforcement.rules`` ids) this check judges; empty: the report's default table."""
    core: bool = False
    """One of the MUST checks that define its profile: skipped or not judged, the profile is partial."""
    figures: dict[str, float] = field(default_factory=dict)
    """Named measurements a later run is compared on (``reports.figures``: eviction seconds, boundary
    error, throughput per mode, density); more are derived from the evidence."""
    started: float = 0.0
    """Epoch seconds when the check began (0: unknown)."""
    source: str = ""
    """Where the judged object came from, ``path:line`` (``gpuconf lint``); empty for cluster checks."""

    def line(self) -> str:
        """What ``gpuconf run`` prints as the check finishes."""
        mark = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP", "error": "ERROR"}[self.outcome]
        level = "" if self.level == "MUST" else f" ({self.level})"
        text = f"{mark:<5} {self.key}{level}  {self.duration_s:.1f}s"
        return f"{text}  {self.reason}" if self.reason else text

    def not_judged(self) -> list[str]:
        """The parts of the rule this check did not judge (its ``not judged: `` notes, without the
        prefix): a passed check stays passed, but no report may let it read as wholly judged."""
        return [n.removeprefix(NOT_JUDGED) for n in self.notes if n.startswith(NOT_JUDGED)]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunRecord:
    """One run: what was judged, against what, with which options, and every check's result."""

    run_id: str
    started: float
    finished: float
    target: dict[str, Any]
    options: dict[str, Any]
    results: list[CheckResult]
    preflight: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False
    source: Source = "run"
    environment: Environment = field(default_factory=Environment)
    catalog: Catalog = field(default_factory=Catalog)
    implementation: Implementation = field(default_factory=Implementation)
    under_test: dict[str, Any] = field(default_factory=dict)
    """The implementation judged (``--implementation`` or detected; ``enforcement.implementations``):
    its node and scheduler parts and how each was chosen, where each feature came from, and what
    it does not claim and so was not judged. Not the submitter (``implementation``)."""
    gpuconf_version: str = field(default_factory=gpuconf_version)
    suite_validation: dict[str, Any] = field(default_factory=dict)
    """The mutation score of the suite version that made the run: ``conformance/mutation-score.json``
    (``gpuconf mutate --write-score``) as it is; empty when none was recorded (``reports.validation``)."""
    suite: dict[str, Any] = field(default_factory=dict)
    """The suite that made the run (``reports.provenance.suite_identity``): version, source commit,
    whether the tree was modified, digests of the distribution, the catalog and the mutation score."""
    invocation: dict[str, Any] = field(default_factory=dict)
    """How the run was started (``fixtures.suite.invocation``): the redacted command line, profiles,
    request forms and features with their source, every filter, preflight, timeout scale, workers."""
    components: dict[str, Any] = field(default_factory=dict)
    """The components under test as the cluster runs them: scheduler, node agent and workload image by
    digest, which are gpuconf's reference ones, and per node (name hashed) its versions."""
    api_version: str = SCHEMA
    """The apiVersion the record was written with (a loaded ``v1alpha1`` one keeps it)."""
    directory: Path | None = field(default=None, compare=False, repr=False)
    """Where the record was loaded from (evidence files are found relative to it); not written."""

    def counts(self) -> Counter[str]:
        return Counter(r.outcome for r in self.results)

    def exit_code(self) -> int:
        must = [r for r in self.results if r.level == "MUST"]
        if any(r.outcome == "failed" for r in must):
            return EXIT_FAILED
        if any(r.outcome == "error" for r in must) or self.interrupted:
            return EXIT_NOT_JUDGED
        if self.core_not_judged() or not any(r.outcome in ("passed", "failed") for r in self.results):
            return EXIT_PARTIAL
        return EXIT_OK

    def core_not_judged(self) -> list[CheckResult]:
        """The core checks (``CheckResult.core``) of this run that were skipped or not judged."""
        return core_not_judged(self.results)

    def verdict_line(self) -> str:
        c = self.counts()
        parts = ", ".join(f"{c[o]} {o}" for o in OUTCOMES if c[o])
        code = self.exit_code()
        if code == EXIT_PARTIAL:
            core = self.core_not_judged()
            verdict = (
                f"PARTIAL: {len(core)} core check(s) not judged ("
                + "; ".join(f"{r.key}: {r.reason or r.outcome}" for r in core)
                + ")"
                if core
                else "PARTIAL: no check was judged"
            )
        else:
            verdict = {
                EXIT_OK: "CONFORMANT: every MUST check that ran passed",
                EXIT_FAILED: "NOT CONFORMANT: a MUST check failed",
                EXIT_NOT_JUDGED: "NOT JUDGED: a MUST check could not be judged (error)",
            }[code]
        warned = [r.key for r in should_failures(self.results)]
        if warned and code == EXIT_OK:
            verdict += f", with warnings: SHOULD check(s) failed: {', '.join(warned)}"
        if self.interrupted:
            verdict += " (the run was interrupted)"
        return f"{verdict}; {parts} in {self.finished - self.started:.0f} s"

    @property
    def target_kind(self) -> Target:
        """How the implementation was reached: ``sandbox``, ``cluster`` or ``probe``."""
        if self.source == "probe":
            return "probe"
        return "sandbox" if self.target.get("kind") == "gpuconf-sandbox" else "cluster"

    @property
    def mode(self) -> Target:
        """The first release's name of ``target_kind``."""
        return self.target_kind

    def profiles(self) -> list[str]:
        """The profiles this run judged: those asked for, then any a result names."""
        asked = [str(p) for p in self.options.get("profiles") or []]
        return list(dict.fromkeys([*asked, *(r.profile for r in self.results)]))

    def as_dict(self) -> dict[str, Any]:
        c = self.counts()
        return {
            "apiVersion": SCHEMA,
            "kind": "ConformanceRun",
            "suite": self.suite,
            "invocation": self.invocation,
            "components": self.components,
            "runId": self.run_id,
            "date": datetime.fromtimestamp(self.started, UTC).isoformat(timespec="seconds"),
            "durationSeconds": round(self.finished - self.started, 1),
            "target": self.target,
            "options": self.options,
            "preflight": self.preflight,
            "interrupted": self.interrupted,
            "statistics": {o: c[o] for o in OUTCOMES},
            "exitCode": self.exit_code(),
            "source": self.source,
            "gpuconfVersion": self.gpuconf_version,
            "environment": asdict(self.environment),
            "catalog": asdict(self.catalog),
            "implementation": asdict(self.implementation),
            "implementationUnderTest": self.under_test,
            "suiteValidation": self.suite_validation,
            "results": [r.as_dict() for r in self.results],
        }


def core_not_judged(results: list[CheckResult]) -> list[CheckResult]:
    """The core checks among ``results`` that were skipped or not judged: each makes its profile partial."""
    return [r for r in results if r.core and r.outcome in ("skipped", "error")]


def not_judged_parts(results: list[CheckResult]) -> list[tuple[CheckResult, str]]:
    """Every part of a rule not judged among ``results``, with its check, in the results' order."""
    return [(r, part) for r in results for part in r.not_judged()]


def should_failures(results: list[CheckResult]) -> list[CheckResult]:
    """The SHOULD checks among ``results`` that failed: warnings, which never change a verdict."""
    return [r for r in results if r.level == "SHOULD" and r.outcome == "failed"]


def load_run(directory: Path) -> RunRecord:
    """Read back a run written by ``write_run`` (a run directory, or its ``run.json``)."""
    path = directory / "run.json" if directory.is_dir() else directory
    data = json.loads(path.read_text())
    return record_from_dict(data, directory=path.parent)


def record_from_dict(data: dict[str, Any], directory: Path | None = None) -> RunRecord:
    """A ``RunRecord`` from ``RunRecord.as_dict()`` (any release: missing keys take their defaults)."""
    results = [_known(CheckResult, r) for r in data["results"]]
    started = datetime.fromisoformat(data["date"]).timestamp()
    return RunRecord(
        run_id=data["runId"],
        started=started,
        finished=started + float(data["durationSeconds"]),
        target=data.get("target") or {},
        options=data.get("options") or {},
        results=results,
        preflight=data.get("preflight") or {},
        interrupted=bool(data.get("interrupted")),
        source="probe" if data.get("source") == "probe" else "run",
        environment=_known(Environment, data.get("environment")),
        catalog=_known(Catalog, data.get("catalog")),
        implementation=_known(Implementation, data.get("implementation")),
        under_test=dict(data.get("implementationUnderTest") or {}),
        gpuconf_version=str(data.get("gpuconfVersion") or gpuconf_version()),
        suite_validation=score if isinstance(score := data.get("suiteValidation"), dict) else {},
        suite=_dict(data.get("suite")),
        invocation=_dict(data.get("invocation")),
        components=_dict(data.get("components")),
        api_version=str(data.get("apiVersion") or SCHEMA_V1ALPHA1),
        directory=directory,
    )


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def check_file_name(key: str) -> str:
    """The name of a check's file under ``checks/``."""
    return key.replace("/", ".").replace("[", "-").replace("]", "") + ".json"
