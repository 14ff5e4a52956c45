"""Plots for the HTML report, drawn with matplotlib as SVG and embedded in the page.

matplotlib is the optional ``report`` extra (it is also in ``dev``): without it every function
here returns None and the report says that plots need ``pip install 'gpuconf[report]'``. Each
plot is an ``<img>`` whose source is the SVG itself (a ``data:`` URI), so the page needs no file
beside it and no network, and the SVGs' internal ids cannot collide with each other.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from reports.figures import ModeFigures

INSTALL_HINT: Final = "plots need matplotlib: pip install 'gpuconf[report]'"
COLOURS: Final = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "svg.fonttype": "none",
            "svg.hashsalt": "gpuconf",
            "font.size": 9,
            "axes.grid": True,
            "grid.alpha": 0.3,
        }
    )
    return plt


def _uri(fig: Any) -> str:
    plt = _pyplot()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue().encode()).decode()


def memory_over_time(timelines: Mapping[str, Mapping[str, Any]], title: str = "") -> str | None:
    """Memory held per workload over time, with its request (dashed) and limit (solid) lines."""
    if not available() or not timelines:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3))
    for i, (name, line) in enumerate(sorted(timelines.items())):
        colour = COLOURS[i % len(COLOURS)]
        points = [(float(t), float(m)) for t, m in line.get("points") or []]
        if points:
            ax.step([p[0] for p in points], [p[1] for p in points], where="post", color=colour, label=name)
        if line.get("requestMiB") is not None:
            ax.axhline(
                float(line["requestMiB"]), color=colour, linestyle="--", linewidth=1, label=f"{name} request"
            )
        if line.get("limitMiB") is not None:
            ax.axhline(
                float(line["limitMiB"]),
                color=colour,
                linestyle="-",
                linewidth=1.5,
                alpha=0.5,
                label=f"{name} limit",
            )
    ax.set_xlabel("seconds")
    ax.set_ylabel("GPU memory (MiB)")
    if title:
        ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return _uri(fig)


def kernel_timelines(modes: Mapping[str, ModeFigures], title: str = "") -> str | None:
    """Two (or more) neighbours' kernels per compute mode, one row each, on a shared clock."""
    shown = {m: f for m, f in sorted(modes.items()) if f.workloads}
    if not available() or not shown:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(shown), 1, figsize=(7, 1.2 + 1.0 * len(shown)), squeeze=False)
    for ax, (mode, fig_mode) in zip(axes[:, 0], shown.items(), strict=True):
        start = min((s for w in fig_mode.workloads for s, _e in w.spans), default=0.0)
        labels = []
        for row, w in enumerate(fig_mode.workloads):
            bars = [(s - start, e - s) for s, e in w.spans]
            ax.broken_barh(bars, (row - 0.35, 0.7), color=COLOURS[row % len(COLOURS)])
            labels.append(w.workload)
        ax.set_yticks(range(len(labels)), labels)
        overlap = f", overlap {fig_mode.overlap:.0%}" if fig_mode.overlap is not None else ""
        ax.set_title(f"{mode}{overlap}", fontsize=9)
        ax.set_xlabel("seconds")
        ax.grid(axis="y", visible=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _uri(fig)


def density_ramp(points: Sequence[Mapping[str, Any]], title: str = "") -> str | None:
    """Pods per GPU against time to run them (and throughput, where measured)."""
    if not available() or not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3))
    pods = [int(p.get("pods") or 0) for p in points]
    seconds = [p.get("seconds") for p in points]
    if any(s is not None for s in seconds):
        ax.plot(
            pods,
            [s if s is not None else float("nan") for s in seconds],
            marker="o",
            color=COLOURS[0],
            label="seconds to run",
        )
        ax.set_ylabel("seconds")
    rates = [p.get("throughput") for p in points]
    if any(r is not None for r in rates):
        twin = ax.twinx()
        twin.plot(
            pods,
            [r if r is not None else float("nan") for r in rates],
            marker="s",
            color=COLOURS[1],
            label="throughput",
        )
        twin.set_ylabel("throughput")
        twin.grid(False)
        twin.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("Pods")
    ax.legend(loc="upper left", fontsize=8)
    if title:
        ax.set_title(title)
    return _uri(fig)
