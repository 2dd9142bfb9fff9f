"""The memory picture of a compiled graph: its arena over time as SVG, in a self-contained HTML page.

x is the execution step (the node's position in the final order), y the offset in the arena; each
planned buffer is a rectangle over its live steps and its bytes, colored by the hinted region of the
value that defines it (grey: no region). The step where the most planned bytes are live and the
arena's size (the planned peak) are marked. A slice loop is a dashed line at its step, and its body's
plan (one slice: the body runs once per slice in the same arena) gets a panel of its own. When a hint
changed the plan, the page shows the plan as compiled beside the same graph compiled without slicing
(bfs), on one y scale, so the heights compare.

The plan comes from CompiledGraph.memory_plan (backend/bindings/Module.cpp, plan_data); the dumps write
the page as memory.html next to memory-plan.txt.
"""

from __future__ import annotations

import colorsys
import html
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

from .dump import format_bytes

WIDTH, HEIGHT, MARGIN = 900, 300, 48


def region_color(region: int) -> str:
    if region < 0:
        return "#a7adb5"
    r, g, b = colorsys.hls_to_rgb((zlib.crc32(str(region).encode()) % 360) / 360, 0.58, 0.62)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def live_profile(plan: dict) -> List[int]:
    """Planned bytes live at each step."""
    live = [0] * max(1, plan["steps"])
    for b in plan["buffers"]:
        for s in range(b["start"], min(b["end"], len(live) - 1) + 1):
            live[s] += b["size"]
    return live


def svg(plan: dict, title: str, scale_bytes: Optional[int] = None) -> str:
    """One plan as an SVG panel; `scale_bytes` is the y axis' top (the largest arena among panels shown
    together), else this plan's own arena."""
    steps = max(1, plan["steps"])
    top = max(1, scale_bytes or plan["arena_bytes"])
    w, h = WIDTH, HEIGHT

    def x(step: float) -> float:
        return MARGIN + step * w / steps

    def y(offset: float) -> float:
        return MARGIN + h - offset * h / top

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w + 2 * MARGIN}" height="{h + 2 * MARGIN}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{MARGIN}" y="18" font-size="13" font-weight="bold">{html.escape(title)}</text>',
           f'<rect x="{MARGIN}" y="{MARGIN}" width="{w}" height="{h}" fill="none" stroke="#444"/>',
           f'<text x="{MARGIN}" y="{h + MARGIN + 16}">step 0</text>',
           f'<text x="{MARGIN + w}" y="{h + MARGIN + 16}" text-anchor="end">step {steps}</text>',
           f'<text x="{MARGIN - 4}" y="{MARGIN + h}" text-anchor="end">0</text>']
    for b in plan["buffers"]:
        x0, x1 = x(b["start"]), x(b["end"] + 1)
        y0, y1 = y(b["offset"] + b["size"]), y(b["offset"])
        tip = (f'{", ".join(b["values"])} ({b["op"]}): {format_bytes(b["size"])} at offset {b["offset"]}, '
               f'live steps {b["start"]}..{b["end"]}' + (f', region {b["region"]}' if b["region"] >= 0 else ""))
        out.append(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{max(0.5, x1 - x0):.1f}" height="{max(0.5, y1 - y0):.1f}" '
                   f'fill="{region_color(b["region"])}" stroke="#333" stroke-width="0.4">'
                   f'<title>{html.escape(tip)}</title></rect>')
    for loop in plan.get("slice_loops", []):
        lx = x(loop["step"] + 0.5)
        out.append(f'<line x1="{lx:.1f}" y1="{MARGIN}" x2="{lx:.1f}" y2="{MARGIN + h}" stroke="#2a6" '
                   f'stroke-dasharray="4 3"><title>{html.escape(loop["node"])}: {loop["slices"]} slices of '
                   f'{html.escape(loop["body"])}</title></line>')
        out.append(f'<text x="{lx + 3:.1f}" y="{MARGIN + 12}" fill="#2a6">{html.escape(loop["node"])} '
                   f'x{loop["slices"]}</text>')
    if plan["arena_bytes"] > 0:
        ay = y(plan["arena_bytes"])
        out.append(f'<line x1="{MARGIN}" y1="{ay:.1f}" x2="{MARGIN + w}" y2="{ay:.1f}" stroke="#c33" '
                   f'stroke-dasharray="6 3"/>')
        out.append(f'<text x="{MARGIN + w}" y="{ay - 3:.1f}" text-anchor="end" fill="#c33">arena (planned peak) '
                   f'{format_bytes(plan["arena_bytes"])}</text>')
        live = live_profile(plan)
        peak_step = max(range(len(live)), key=live.__getitem__)
        px = x(peak_step + 0.5)
        out.append(f'<line x1="{px:.1f}" y1="{MARGIN}" x2="{px:.1f}" y2="{MARGIN + h}" stroke="#c33" '
                   f'stroke-width="1.5"><title>most planned bytes live: {format_bytes(live[peak_step])} at step '
                   f'{peak_step}</title></line>')
        out.append(f'<text x="{px + 3:.1f}" y="{MARGIN + h - 4}" fill="#c33">peak {format_bytes(live[peak_step])} '
                   f'@ step {peak_step}</text>')
    else:
        out.append(f'<text x="{MARGIN + w / 2}" y="{MARGIN + h / 2}" text-anchor="middle">nothing placed in an '
                   f'arena</text>')
    out.append("</svg>")
    return "\n".join(out)


def _panels(plan: dict, label: str) -> List[Tuple[str, dict]]:
    """The plan and its slice bodies' plans, each with a title."""
    out = [(f"{label}: graph {plan['graph']} ({plan['device'] or 'no device'}, {plan['strategy']})", plan)]
    loops = {loop["body"]: loop for loop in plan.get("slice_loops", [])}
    for name, body in plan.get("bodies", {}).items():
        runs = loops.get(name, {}).get("slices", "?")
        out.append((f"{label}: slice body {name} (one slice; it runs {runs} times in this arena)", body))
    return out


def _summary(plan: dict) -> str:
    return (f"arena {format_bytes(plan['arena_bytes'])}, most live at once {format_bytes(plan['live_peak_bytes'])}, "
            f"every buffer on its own {format_bytes(plan['no_reuse_bytes'])}, {len(plan['buffers'])} buffers")


def page(name: str, plans: Sequence[Tuple[str, dict]]) -> str:
    """A self-contained HTML page: each (label, plan) as panels (its graph, then its slice bodies), the
    labels side by side; all panels of the page share one y scale."""
    columns = [_panels(plan, label) for label, plan in plans]
    scale = max((p["arena_bytes"] for col in columns for _, p in col), default=0)
    rows: List[str] = []
    for col, (label, plan) in zip(columns, plans):
        cells = "".join(f"<div>{svg(p, title, scale)}</div>" for title, p in col)
        rows.append(f'<div class="col"><h2>{html.escape(label)}</h2><p>{html.escape(_summary(plan))}</p>{cells}</div>')
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>hintbackend memory: {html.escape(name)}</title>"
            "<style>body{font-family:sans-serif;margin:16px} .cols{display:flex;gap:24px;flex-wrap:wrap}"
            " h2{font-size:15px}</style></head><body>"
            f"<h1>Memory plan of {html.escape(name)}</h1>"
            "<p>x: execution step; y: offset in the arena; one rectangle per planned buffer (hover for its values),"
            " colored by hinted region (grey: none); red: the arena's size and the step with the most live bytes;"
            " green dashes: slice loops. Values the plan does not place (inputs, outputs, views, ops without out=)"
            " are not drawn: memory-plan.txt lists them.</p>"
            f"<div class='cols'>{''.join(rows)}</div></body></html>")


def write_index(root: str, graphs: Dict[str, List[Tuple[str, str]]]) -> str:
    """index.html for a dump folder: per graph, its files (name, what changed)."""
    items = []
    for graph in sorted(graphs, key=_graph_order):
        links = "".join(f'<li><a href="{html.escape(graph)}/{html.escape(f)}">{html.escape(f)}</a>'
                        f'{" - " + html.escape(what) if what else ""}</li>' for f, what in graphs[graph])
        items.append(f"<h2>{html.escape(graph)}</h2><ul>{links}</ul>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>hintbackend dumps</title>"
            "<style>body{font-family:sans-serif;margin:16px} li{margin:2px 0}</style></head><body>"
            f"<h1>hintbackend dumps: {html.escape(root)}</h1>"
            "<p>One section per compiled graph, in compile order: what came in (fx_graph.txt, graph.json), the IR"
            " after import and after each pass (and whether the pass changed it), the kernels, the memory plan"
            " (text, and its picture in memory.html), and what the passes noted.</p>"
            f"{''.join(items)}</body></html>")


def _graph_order(name: str) -> Tuple[int, str]:
    kind, _, n = name.rpartition("_")
    return (int(n), kind) if n.isdigit() else (1 << 30, name)
