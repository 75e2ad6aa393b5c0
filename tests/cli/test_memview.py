"""The per-GPU memory bar of `plan`/`diagnose` (launcher/cli/memview.py): pure rendering."""

from __future__ import annotations

from launcher.cli.memview import BAR_WIDTH, PARTS, bar_text, legend
from launcher.sglang.budget import GpuBar


def bar(**kw: float) -> GpuBar:
    base = dict(index=0, total_gib=80.0, weights_gib=40.0, kv_gib=20.0, graphs_gib=4.0,
                activations_gib=2.0, other_gib=4.0, context_gib=2.0, free_gib=8.0,
                line_gib=60.0)
    base.update(kw)
    return GpuBar(**base)  # type: ignore[arg-type]


def _cells(text: str) -> str:
    first = text.splitlines()[0]
    return first[9:9 + BAR_WIDTH]


def test_parts_fill_the_bar_in_proportion_with_the_line_at_the_static_budget() -> None:
    t = bar_text(bar(), mfs=0.75).plain
    cells = _cells(t)
    assert len(cells) == BAR_WIDTH
    glyph = {label: g for _, label, g, _ in PARTS}
    assert cells.count(glyph["weights"]) == 30  # 40 of 80 GiB: half of the 60 cells
    # weights (40) + KV (20) = 60 GiB = 45 of 60 cells: the line sits on the last KV cell
    assert cells.index("┃") == 44
    assert "mem_fraction_static 0.750: static budget (weights + KV) 60.0 GiB" in t
    assert "short by" not in t


def test_a_deficit_widens_the_scale_and_is_stated() -> None:
    t = bar_text(bar(graphs_gib=16.0, free_gib=-4.0), deficit_gib=1.5).plain
    assert len(_cells(t)) == BAR_WIDTH
    assert "short by 4.00 GiB" in t and "deficit: 1.50 GiB more than was free" in t


def test_text_is_never_markup() -> None:
    """Labels are appended as text: a '[red]' in a label stays literal."""
    t = bar_text(bar(), label="[red]x")
    assert "[red]x" in t.plain
    assert "weights 40.00" in legend(bar()).plain
