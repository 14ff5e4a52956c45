"""docs/real-clusters.md: every gpuconf command line in it parses, and where it says the reference
agent runs agrees with the manifests users apply (enforcement/deploy/) and the reference
implementation's description, which the suite reads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from conformance.cli import build_parser
from enforcement.implementations import builtins
from fixtures.suite.frame import RunOptions

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "real-clusters.md"


def command_lines() -> list[list[str]]:
    """The gpuconf command lines of the doc's shell blocks and inline code, as argv (no ``gpuconf``)."""
    text = DOC.read_text()
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" # ", 1)[0].strip()
            if line.startswith("gpuconf "):
                lines.append(line)
    lines += re.findall(r"`(gpuconf [^`]+)`", text.replace("\n", " "))
    # "..." stands for the options of the line above it
    return [[w for w in shlex.split(line)[1:] if w != "..."] for line in lines]


def test_every_command_line_parses() -> None:
    parser = build_parser()
    lines = command_lines()
    assert len(lines) >= 12, lines
    for argv in lines:
        parser.parse_args(argv)  # SystemExit (a test error) on an unknown option


def test_the_reference_agent_is_where_the_manifests_put_it() -> None:
    daemonset = yaml.safe_load((ROOT / "enforcement" / "deploy" / "daemonset.yaml").read_text())
    namespace = daemonset["metadata"]["namespace"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    part = builtins()["gpuconf-reference"].node
    assert part is not None
    assert part.agent.namespace == namespace
    selector = dict(term.split("=", 1) for term in (part.agent.selector or "").split(","))
    assert selector and selector.items() <= labels.items()  # the selector finds the agent's Pods
    # the suite's defaults (no preflight: the default node part, the reference's) and the doc
    assert (RunOptions.agent_namespace, RunOptions.agent_selector) == (namespace, part.agent.selector)
    text = DOC.read_text()
    assert f"--agent-namespace {namespace} --agent-selector {part.agent.selector}" in text
    assert "gpu-fractioning --agent-selector" not in text and "gpuconf-agent`" not in text
