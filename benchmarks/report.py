"""Presenting a run: the text table (also used for RESULTS.md), the scaling grid and the PNG plot."""

from __future__ import annotations

from typing import Any

from .common import Report, Row, fmt

HEADERS = ("scenario", "backend", "figure", "value", "anchor", "ratio", "goal", "met")


def _cells(row: Row) -> tuple[str, ...]:
    met = "" if row.met is None else ("yes" if row.met else "NO")
    return (row.scenario, row.backend, row.figure, f"{fmt(row.value)} {row.unit}",
            f"{row.anchor}: {fmt(row.anchor_value)} {row.anchor_unit}", f"{row.ratio:.3g}", row.goal or "", met)


def text_table(rows: list[Row]) -> str:
    cells = [HEADERS] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADERS))]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(HEADERS))).rstrip() for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: list[Row]) -> str:
    out = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    out += ["| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |" for r in rows]
    return "\n".join(out)


def scaling_grid(s7: dict[str, Any]) -> str:
    """Rows/s (and ratio to the set-based UPDATE) per batch size and worker count."""
    cells = s7["cells"]
    workers = sorted({c["workers"] for c in cells})
    batches = sorted({c["batch"] for c in cells})
    by = {(c["batch"], c["workers"]): c for c in cells}
    head = "batch \\ workers " + "".join(f"{w:>20}" for w in workers)
    lines = [f"scaling (rows/s, ratio to set-based UPDATE {s7['anchor_rows_per_s']:,.0f} rows/s)", head]
    for b in batches:
        line = f"{b:>15} " + "".join(f"{by[(b, w)]['rate']:>12,.0f} ({by[(b, w)]['ratio']:.3f})" for w in workers)
        lines.append(line)
    return "\n".join(lines)


def plot(report: Report, path: str) -> None:
    """Throughput against workers, one line per batch size, with the set-based anchor as a line."""
    s7 = report.extra.get("s7")
    if not s7:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = s7["cells"]
    workers = sorted({c["workers"] for c in cells})
    batches = sorted({c["batch"] for c in cells})
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    for b in batches:
        pts = sorted((c["workers"], c["rate"], c["ratio"]) for c in cells if c["batch"] == b)
        left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"batch {b}")
        right.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=f"batch {b}")
    left.axhline(s7["anchor_rows_per_s"], color="grey", linestyle="--", label="set-based UPDATE")
    left.set_yscale("log")
    left.set_ylabel("rows/s (claim+complete)")
    left.set_title("Throughput (log scale)")
    right.axhline(0.25, color="red", linestyle=":", label="goal 1 (0.25)")
    right.set_yscale("log")
    right.set_ylabel("ratio to set-based UPDATE, same run")
    right.set_title("Throughput / set-based UPDATE")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(workers)
        ax.set_xticklabels([str(w) for w in workers])
        ax.set_xlabel("worker processes")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    meta = report.extra.get("meta", {})
    fig.suptitle(f"controltable claim+complete on PostgreSQL {meta.get('postgres_version', '')} "
                 f"({meta.get('machine', {}).get('cpus', '?')} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
