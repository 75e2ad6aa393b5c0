"""Memory pictures for `launcher plan` and `launcher diagnose`: one stacked bar per GPU.

Renders :class:`~launcher.memory.estimate.GpuBar` as rich ``Text`` built with ``append`` only
(no markup is parsed, so no text from a host or a log can inject any). Part of the CLI layer:
it returns renderables and prints nothing.

    weights | KV pool | CUDA graphs | activations/warmup | other processes | free

(a LoRA server's adapter pool is drawn between the weights and the KV pool).

Each part has its own glyph as well as its colour, so the picture reads without colour too.

The static budget's end (``--mem-fraction-static`` x the free memory before loading, counted
from the bar's left end where the weights start) is marked with ``┃`` and labelled below.
"""

from __future__ import annotations

from rich.text import Text

from launcher.memory.estimate import GpuBar

__all__ = ["BAR_WIDTH", "PARTS", "bar_text", "legend"]

BAR_WIDTH = 60

# (field, label, glyph, style): the bar's parts in drawing order.
PARTS: tuple[tuple[str, str, str, str], ...] = (
    ("weights_gib", "weights", "█", "blue"),
    ("lora_gib", "LoRA pool", "▚", "cyan"),
    ("kv_gib", "KV pool", "▓", "green"),
    ("graphs_gib", "graphs", "▒", "magenta"),
    ("activations_gib", "activations", "░", "yellow"),
    ("other_gib", "other", "#", "red"),
    ("context_gib", "context", ":", "bright_black"),
    ("free_gib", "free", "·", "bright_black"),
)


def _cells(bar: GpuBar, width: int) -> list[tuple[str, str]]:
    """(glyph, style) per cell; parts rounded so the cells add up to ``width``."""
    # a deficit (parts above the total) widens the scale so that no part is cut off
    parts = sum(max(0.0, float(getattr(bar, name))) for name, _, _, _ in PARTS)
    total = max(bar.total_gib, parts, 1e-9)
    cells: list[tuple[str, str]] = []
    acc = 0.0
    for name, _, glyph, style in PARTS:
        gib = max(0.0, float(getattr(bar, name)))
        acc += gib
        upto = min(width, round(acc / total * width))
        cells += [(glyph, style)] * max(0, upto - len(cells))
    cells += [("·", "bright_black")] * (width - len(cells))
    return cells[:width]


def bar_text(bar: GpuBar, *, label: str = "", mfs: float | None = None,
             width: int = BAR_WIDTH, deficit_gib: float | None = None) -> Text:
    """``GPU n  [bar]  total`` and, under it, the fraction's line (and a deficit, if any)."""
    cells = _cells(bar, width)
    line_col: int | None = None
    if mfs is not None and bar.line_gib > 0:
        parts = sum(max(0.0, float(getattr(bar, name))) for name, _, _, _ in PARTS)
        scale = max(bar.total_gib, parts, 1e-9)
        line_col = min(width - 1, max(0, round(bar.line_gib / scale * width) - 1))
        cells[line_col] = ("┃", "bold white")
    head = label or f"GPU {bar.index}"
    t = Text()
    t.append(f"  {head:<7}")
    for glyph, style in cells:
        t.append(glyph, style=style)
    t.append(f"  {bar.total_gib:.1f} GiB")
    if bar.free_gib < 0:
        t.append(f"  short by {-bar.free_gib:.2f} GiB", style="bold red")
    if line_col is not None and mfs is not None:
        t.append("\n" + " " * (9 + line_col))
        held = "weights + LoRA pool + KV" if bar.lora_gib else "weights + KV"
        t.append(f"└ mem_fraction_static {mfs:.3f}: static budget ({held}) "
                 f"{bar.line_gib:.1f} GiB")
    if deficit_gib is not None:
        t.append("\n" + " " * 9)
        t.append(f"deficit: {deficit_gib:.2f} GiB more than was free", style="bold red")
    return t


def legend(bar: GpuBar) -> Text:
    """The parts' sizes in GiB, each in its colour."""
    t = Text("         ")
    first = True
    for name, label, glyph, style in PARTS:
        gib = float(getattr(bar, name))
        if name in ("context_gib", "lora_gib") and gib == 0:
            continue
        if not first:
            t.append(" | ")
        first = False
        t.append(glyph, style=style)
        t.append(f" {label} {gib:.2f}")
    return t
