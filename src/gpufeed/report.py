"""Tables, text and plots for results a person reads: the bench ladder, the diagnosis."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["bar_chart", "diagnosis_text", "format_table", "table_rows", "timeline_plot"]


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """A plain-text table: ``columns`` are (key, header, format spec); ``None`` values print as ``-``."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append(["-" if r.get(k) is None else format(r[k], spec) for k, _, spec in columns])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = [
        "  ".join(c[i].ljust(widths[i]) if i == 0 else c[i].rjust(widths[i]) for i in range(len(columns)))
        for c in cells
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def table_rows(columns: Sequence[tuple[str, str, str]], width: int = 11) -> tuple[str, Callable[[dict[str, Any]], str]]:
    """A header, and a function that formats one row, for a table printed as its rows arrive."""

    def cell(i: int, text: str) -> str:
        return text.ljust(width) if i == 0 else text.rjust(width)

    header = "  ".join(cell(i, h) for i, (_, h, _) in enumerate(columns))

    def row(r: dict[str, Any]) -> str:
        values = ["-" if r.get(k) is None else format(r[k], spec) for k, _, spec in columns]
        return "  ".join(cell(i, v) for i, v in enumerate(values))

    return f"{header}\n{'-' * len(header)}", row


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; never opens a window
    import matplotlib.pyplot as plt

    return plt


def bar_chart(
    path: Path,
    labels: Sequence[str],
    parts: Sequence[tuple[str, Sequence[float], str]],
    title: str,
    xlabel: str,
    marks: Sequence[str] = (),
    lines: Sequence[tuple[float, str]] = (),
) -> None:
    """Save a horizontal stacked bar chart on a linear axis.

    ``parts``: (legend label, one value per bar, colour) segments, stacked left to right; ``marks``:
    a note printed after each bar; ``lines``: (x, label) dashed vertical reference lines.
    """
    import textwrap

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(labels) + 2.2))
    left = [0.0] * len(labels)
    for name, values, colour in parts:
        ax.barh(range(len(labels)), values, left=left, color=colour, label=name)
        left = [a + b for a, b in zip(left, values, strict=True)]
    for x, name in lines:
        ax.axvline(x, color="#333333", linestyle="--", linewidth=1)
        ax.text(x, -0.7, f" {name}", fontsize=8, va="bottom")
    for i, (total, mark) in enumerate(zip(left, marks or [""] * len(labels), strict=True)):
        ax.text(total, i, f" {total:.3g} s {mark}", va="center", fontsize=8)
    ax.set_yticks(range(len(labels)), labels=labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_xlim(0, max(left) * 1.35 if left else 1)
    ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("\n".join(textwrap.wrap(title, 110)), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def diagnosis_text(report: Any) -> str:
    """A :class:`gpufeed.Report` as a person reads it: the verdict, the figures, the findings with their fixes."""
    import statistics

    med = statistics.median
    lines = [
        f"verdict: {report.verdict}  ({report.steps} steps, {report.wall_s:.2f} s on {report.device})",
        f"  waiting for data: {report.data_wait_fraction:.1%} of wall time "
        f"(median {med(report.wait_s) * 1e3:.2f} ms per batch; step median {med(report.step_s) * 1e3:.2f} ms)",
    ]
    if report.idle_step_s is not None:
        loop = med(report.step_s)
        lines.append(
            f"  step with the loader idle: {report.idle_step_s * 1e3:.2f} ms; in the loop: {loop * 1e3:.2f} ms "
            f"({loop / max(report.idle_step_s, 1e-9):.1f}x), contention {report.contention_fraction:.1%} of wall time"
        )
    if report.gpu_busy_fraction is not None:
        lines.append(f"  GPU busy: {report.gpu_busy_fraction:.0%}")
    if report.cpu_percent is not None:
        lines.append(f"  CPU (this process and its workers): {report.cpu_percent:.0f}% of one core")
    for f in report.findings:
        lines += [f"- {f.kind}: {f.message}", f"    fix:  {f.fix}", f"    gain: {f.expected_gain}"]
    if not report.findings:
        lines.append("- no findings: nothing in the data pipeline to fix")
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def timeline_plot(report: Any, path: Path) -> None:
    """Per step: the wait for data stacked under the step, and GPU busy % where NVML measured it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    x = range(report.steps)
    wait_ms = [w * 1e3 for w in report.wait_s]
    step_ms = [s * 1e3 for s in report.step_s]
    ax.bar(x, wait_ms, color="#C44E52", label="waiting for data")
    ax.bar(x, step_ms, bottom=wait_ms, color="#4C72B0", label="in the step")
    if report.idle_step_s is not None:
        ax.axhline(report.idle_step_s * 1e3, color="#333333", linestyle="--", linewidth=1, label="step, loader idle")
    ax.set_xlabel("step")
    ax.set_ylabel("milliseconds")
    ax.set_title(f"gpufeed diagnose: {report.verdict}, {report.data_wait_fraction:.0%} of time waiting for data")
    if report.gpu_timeline:
        twin = ax.twinx()
        elapsed = [t for t, _, _ in report.gpu_timeline]
        scale = report.steps / max(elapsed[-1], 1e-9)
        twin.plot(
            [t * scale for t in elapsed], [u for _, u, _ in report.gpu_timeline], color="#55A868", label="GPU busy %"
        )
        twin.set_ylim(0, 105)
        twin.set_ylabel("GPU busy %")
        twin.legend(loc="upper right")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
