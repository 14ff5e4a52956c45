"""The verdict per profile, as every report states it.

The verdict is over the profile's MUST checks (SHOULD checks are counted apart and never change
it, but a failed one makes a success read "success with warnings" in every view): ``failure``
when one failed; ``partial`` when none failed but one was skipped (an unsupported feature) or
could not be judged (error), or none passed; ``success`` when every one passed. An error is never
a failure of the implementation (docs/architecture.md §5), but a profile with one was not wholly
judged, so it is not a success either.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Final, Literal

from reports.model import OUTCOMES, CheckResult, RunRecord, core_not_judged, should_failures

Result = Literal["success", "partial", "failure"]
RESULTS: Final[tuple[Result, ...]] = ("success", "partial", "failure")


@dataclass
class ProfileResult:
    name: str
    result: Result
    results: list[CheckResult]
    counts: Counter[str] = field(default_factory=Counter)
    by_level: dict[str, Counter[str]] = field(default_factory=dict)
    """Outcomes per level (``MUST``, ``SHOULD``, ...)."""
    supported_features: list[str] = field(default_factory=list)
    unsupported_features: list[str] = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        """The SHOULD checks that failed: they never change the result, and every view names them."""
        return [r.key for r in should_failures(self.results)]

    @property
    def core_not_judged(self) -> list[str]:
        """The profile's core checks that were skipped or not judged (its result is then partial)."""
        return [r.key for r in core_not_judged(self.results)]

    @property
    def headline(self) -> str:
        """The result as a person reads it: ``success with warnings`` when a SHOULD check failed."""
        if self.result == "success" and self.warnings:
            return "success with warnings"
        return self.result

    def keys(self, outcome: str) -> list[str]:
        return [r.key for r in self.results if r.outcome == outcome]

    def summary(self) -> str:
        parts = ", ".join(f"{self.counts[o]} {o}" for o in OUTCOMES if self.counts[o])
        return f"{self.name}: {self.headline.upper()} ({parts or 'no checks'})"


def verdict_of(results: list[CheckResult]) -> Result:
    """Over a profile's MUST results: a core check skipped or not judged is always partial."""
    outcomes = {r.outcome for r in results}
    if "failed" in outcomes:
        return "failure"
    if outcomes & {"skipped", "error"} or not results or not any(r.outcome == "passed" for r in results):
        return "partial"
    return "success"


def supported_features(record: RunRecord) -> tuple[list[str], list[str]]:
    """The run's (supported, unsupported) features: from its options, else the catalog."""
    supported = [str(f) for f in record.options.get("supportedFeatures") or []]
    unsupported = [str(f) for f in record.options.get("unsupportedFeatures") or []]
    if not unsupported and record.catalog.features:
        unsupported = [f for f in record.catalog.features if f not in supported]
    return sorted(supported), sorted(unsupported)


def profile_results(record: RunRecord) -> list[ProfileResult]:
    supported, unsupported = supported_features(record)
    out = []
    for name in record.profiles():
        results = [r for r in record.results if r.profile == name]
        if not results:
            continue
        needed = {f for r in results for f in r.features}
        out.append(
            ProfileResult(
                name=name,
                result=verdict_of([r for r in results if r.level == "MUST"]),
                results=results,
                counts=Counter(r.outcome for r in results),
                by_level={
                    level: Counter(r.outcome for r in results if r.level == level)
                    for level in sorted({r.level for r in results})
                },
                supported_features=[f for f in supported if f in needed] if needed else supported,
                unsupported_features=[f for f in unsupported if f in needed] if needed else unsupported,
            )
        )
    return out
