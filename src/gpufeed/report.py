"""Tables and plots for results a person reads (bench ladders now; diagnosis reports later)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["bar_chart", "format_table"]


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


def bar_chart(path: Path, labels: Sequence[str], values: Sequence[float], title: str, xlabel: str) -> str | None:
    """Save a horizontal bar chart; returns why it was not written (matplotlib missing), else ``None``."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never opens a window
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'gpufeed[plot]')"
    import textwrap

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(labels) + 1.8))
    ax.barh(range(len(labels)), values, color="#4C72B0")
    ax.set_yticks(range(len(labels)), labels=labels, fontsize=8)
    ax.invert_yaxis()
    if values and max(values) / max(min(values), 1e-12) > 20:  # a ladder spanning decades reads best on a log axis
        ax.set_xscale("log")
        xlabel += " (log scale)"
    ax.set_xlabel(xlabel)
    fig.suptitle("\n".join(textwrap.wrap(title, 100)), fontsize=10)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.3g}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
