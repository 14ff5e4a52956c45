"""The reports as a person gets them: the HTML in real headless Chromium, the Allure site built.

Chromium is Debian's ``chromium`` (``.ci/run`` installs it); the Allure site needs the Allure 3
command line (npm package ``allure``, Node only; ``.ci/run`` installs it under
``~/.cache/gpuconf/allure``). Without them these tests are skipped and say why. Each HTML page's
screenshot is kept under the test's tmp dir and copied to ``tests/artifacts/`` (gitignored) for a
person to look at.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from reports import allure, html
from reports.model import load_run

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--enable-logging=stderr",
    "--v=0",
)


def chromium(page: Path, *args: str) -> tuple[str, list[str]]:
    """Load ``page``; (stdout, the console's messages)."""
    assert CHROMIUM is not None
    proc = subprocess.run(
        [CHROMIUM, *FLAGS, *args, page.as_uri()], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


@needs_chromium
def test_the_console_check_catches_script_errors_and_network_use(tmp_path: Path) -> None:
    """The detector itself: a page with the report's policy that breaks it is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        f'<html><head><meta http-equiv="Content-Security-Policy" content="{html.CSP}"></head>'
        '<body><img src="http://example.invalid/x.png"><script>nothing()</script></body></html>'
    )
    _dom, console = chromium(bad, "--dump-dom")
    assert any("Content Security Policy" in line for line in console)


@needs_chromium
@pytest.mark.parametrize("name", ["node-stack-handmade", "bad-scheduler-xdist"])
def test_the_html_report_renders_in_chromium(tmp_path: Path, name: str) -> None:
    page = tmp_path / "report.html"
    html.write_html(load_run(RUNS / name), page)
    dom, console = chromium(page, "--dump-dom")
    assert console == [], console
    assert "Verdict per profile" in dom and "Annotation checklist" in dom
    shot = tmp_path / f"report-{name}.png"
    _out, console = chromium(page, f"--screenshot={shot}", "--window-size=1280,4000")
    assert console == [], console
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / shot.name)


def test_the_allure_site_builds_from_a_recorded_run(tmp_path: Path) -> None:
    try:
        allure.find_cli()
    except allure.AllureUnavailable as exc:
        pytest.skip(str(exc))
    results = allure.write_results(load_run(RUNS / "node-stack-handmade"), tmp_path / "allure-results")
    index = allure.build_site(results, tmp_path / "allure-report")
    summary = json.loads((index.parent / "summary.json").read_text())
    assert summary["stats"]["total"] == 11
    assert (
        summary["stats"]["failed"] == 1
        and summary["stats"]["broken"] == 1
        and summary["stats"]["skipped"] == 1
    )
    built = [json.loads(p.read_text()) for p in (index.parent / "data" / "test-results").glob("*.json")]
    failed = next(t for t in built if t["name"] == "stack/pressure-eviction")
    assert {"name": "epic", "value": "stack"} in failed["labels"]
    assert any(a["link"]["name"] == "Events" for a in failed["attachments"])


def test_gpuconf_report_allure_says_how_to_install_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conformance.cli import main

    shutil.copytree(RUNS / "probe-no-eviction", tmp_path / "run")
    monkeypatch.setenv("GPUCONF_ALLURE", str(tmp_path / "no-such-allure"))
    monkeypatch.setattr(allure, "CLI_CACHE", tmp_path / "empty-cache")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["report", "allure", str(tmp_path / "run")]) == 2
    assert "npm install --prefix" in capsys.readouterr().err
    assert list((tmp_path / "run" / "allure-results").glob("*-result.json"))
