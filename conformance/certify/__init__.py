"""Certification: ``gpuconf report bundle``, ``gpuconf report verify`` and ``gpuconf report attest``.

A vendor bundles a recorded run into a submission folder; a reviewer (or a bot on the pull request
to a submissions repository) verifies it with one command. docs/certification.md says why each
requirement exists. Here, because completeness is judged against the catalog of the claimed suite
version (``conformance/catalog.yaml``), which only this part may read.

- ``bundle(run_dir, out)`` (``bundling``): ``<gpuconf major.minor>/<org>-<project>/<profiles>-<version>/``
  with ``report.yaml`` (rendered from the bundled ``run.json``), a redacted ``run.json``, ``junit.xml``,
  ``evidence.tar.gz`` (deterministic), ``README.md`` (with a Reproduce section) and ``SHA256SUMS``;
  an interrupted run is refused.
- ``verify(folder)`` (``verification``): every requirement as PASS or FAIL with the file, field,
  expected and found value and how to fix it; exit 0 submittable, 1 not, 2 usage.
- ``attest(folder)`` (``attestation``): an in-toto Statement (test-result predicate) over
  ``SHA256SUMS``, for the vendor to sign with their own tooling (``cosign attest-blob``).

The file names and the folder layout all three share are in ``layout``, the commands in ``cli``.
The modules are named for what they do, not after the functions re-exported here, so that
``conformance.certify.bundle`` is always the function and never, depending on import order, a module.
"""

# What importers (tests/unit/test_certify.py) use; the rest is imported from its module.
from conformance.certify.attestation import PREDICATE_TYPE, STATEMENT_TYPE, attest, statement
from conformance.certify.bundling import VENDOR_STEPS, BundleError, bundle, render_readme, sums_text
from conformance.certify.layout import (
    FILES,
    JUNIT,
    README,
    REPORT,
    REPRODUCE,
    RUN,
    STATEMENT,
    SUMS,
)
from conformance.certify.verification import (
    REQUIREMENTS,
    Finding,
    Requirement,
    SuiteFacts,
    Verification,
    accepted_minors,
    verify,
)

__all__ = [
    "FILES",
    "JUNIT",
    "PREDICATE_TYPE",
    "README",
    "REPORT",
    "REPRODUCE",
    "REQUIREMENTS",
    "RUN",
    "STATEMENT",
    "STATEMENT_TYPE",
    "SUMS",
    "VENDOR_STEPS",
    "BundleError",
    "Finding",
    "Requirement",
    "SuiteFacts",
    "Verification",
    "accepted_minors",
    "attest",
    "bundle",
    "render_readme",
    "statement",
    "sums_text",
    "verify",
]
