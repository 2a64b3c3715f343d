"""Plots of the benchmark database: for each graph, time against max relative error of every path, as SVG.

Input: the runs of one graph (tgrad/paths/db.py) and the tolerances to show. Output: an `<svg>` element, log-log:
min time across, max relative error up; every path a dot (a cross when it failed), with its description as a tooltip;
the Pareto front (the verified paths no other path beats on both time and error) as a line; and for each tolerance
a dashed line at that error with the path it selects ringed and named. An error of exactly 0 is drawn at ZERO_ERROR.
"""
from __future__ import annotations
import math
from dataclasses import dataclass
from typing import Optional, Sequence
from xml.sax.saxutils import escape
from tgrad.paths.db import PathSummary, Selection

WIDTH, HEIGHT = 680, 380
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 20, 46   # px of margin around the plotting area (the right one holds labels)
ZERO_ERROR = 1e-16   # where a path with no error at all is drawn (the float64 roundoff of a value near 1)
FRONT_COLOUR, POINT_COLOUR, FAILED_COLOUR, CHOSEN_COLOUR = "#1565c0", "#444444", "#c62828", "#2e7d32"

@dataclass(frozen=True)
class PlotPoint:
  path_id: str
  description: str
  seconds: float
  error: float
  ok: bool

def points_of(summaries: Sequence[PathSummary]) -> list[PlotPoint]:
  """A point per path with a timing and a known error (a path that never ran, or whose error is NaN, has none)."""
  return [PlotPoint(s.path_id, s.path_desc, s.min_time, max(s.max_rel_error, ZERO_ERROR), s.status == "ok")
          for s in summaries if math.isfinite(s.min_time) and s.min_time > 0 and not math.isnan(s.max_rel_error)]

def pareto_front(points: Sequence[PlotPoint]) -> list[PlotPoint]:
  """The verified points no other verified point matches or beats on both time and error, fastest first."""
  front: list[PlotPoint] = []
  for p in sorted((p for p in points if p.ok), key=lambda p: (p.seconds, p.error)):
    if not front or p.error < front[-1].error: front.append(p)
  return front

def _decades(low: float, high: float) -> tuple[int, int]:
  lo, hi = math.floor(math.log10(low)), math.ceil(math.log10(high))
  return lo, hi if hi > lo else lo + 1

def plot_svg(title: str, summaries: Sequence[PathSummary], selections: Sequence[tuple[float, Selection]]) -> str:
  """The plot of one graph's paths (`selections`: (tolerance, what it selects), drawn as dashed lines)."""
  points = points_of(summaries)
  if not points:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="40"><text x="10" y="24">'
            f'{escape(title)}: no path with a timing and an error</text></svg>')
  tolerances = [t for t, _ in selections if t > 0]
  t_lo, t_hi = _decades(min(p.seconds for p in points), max(p.seconds for p in points))
  e_lo, e_hi = _decades(min([p.error for p in points] + tolerances), max([p.error for p in points] + tolerances))
  plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
  def x(seconds: float) -> float: return LEFT + (math.log10(seconds) - t_lo) / (t_hi - t_lo) * plot_w
  def y(error: float) -> float: return TOP + plot_h - (math.log10(error) - e_lo) / (e_hi - e_lo) * plot_h
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{WIDTH}" height="{HEIGHT}" '
         f'font-family="Helvetica, Arial, sans-serif" font-size="11">',
         '<rect width="100%" height="100%" fill="white"/>',
         f'<text x="{LEFT}" y="13" font-size="12">{escape(title)}</text>',
         f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']
  for d in range(t_lo, t_hi + 1):
    out.append(f'<line x1="{x(10.0 ** d):.1f}" y1="{TOP}" x2="{x(10.0 ** d):.1f}" y2="{TOP + plot_h}" stroke="#eee"/>'
               f'<text x="{x(10.0 ** d):.1f}" y="{TOP + plot_h + 14}" text-anchor="middle">{_time_label(d)}</text>')
  for d in range(e_lo, e_hi + 1):
    out.append(f'<line x1="{LEFT}" y1="{y(10.0 ** d):.1f}" x2="{LEFT + plot_w}" y2="{y(10.0 ** d):.1f}" '
               f'stroke="#eee"/><text x="{LEFT - 6}" y="{y(10.0 ** d) + 4:.1f}" text-anchor="end">1e{d}</text>')
  out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 8}" text-anchor="middle">min time per run</text>'
             f'<text transform="translate(14,{TOP + plot_h / 2}) rotate(-90)" text-anchor="middle">max relative '
             f'error</text>')
  front = pareto_front(points)
  if len(front) > 1:
    steps = [f"{x(front[0].seconds):.1f},{y(front[0].error):.1f}"]
    for previous, p in zip(front, front[1:]):
      steps += [f"{x(p.seconds):.1f},{y(previous.error):.1f}", f"{x(p.seconds):.1f},{y(p.error):.1f}"]
    out.append(f'<polyline class="front" points="{" ".join(steps)}" fill="none" stroke="{FRONT_COLOUR}" '
               f'stroke-width="1.5"/>')
  on_front = {p.path_id for p in front}
  for p in points:
    tip = f"<title>{escape(p.path_id)} {escape(p.description)}: {p.seconds * 1e6:.1f} us, rel {p.error:.2e}</title>"
    if p.ok:
      colour = FRONT_COLOUR if p.path_id in on_front else POINT_COLOUR
      out.append(f'<circle class="path" cx="{x(p.seconds):.1f}" cy="{y(p.error):.1f}" r="4" fill="{colour}">'
                 f'{tip}</circle>')
    else:
      cx, cy = x(p.seconds), y(p.error)
      out.append(f'<path class="failed" d="M{cx - 4:.1f},{cy - 4:.1f} L{cx + 4:.1f},{cy + 4:.1f} M{cx - 4:.1f},'
                 f'{cy + 4:.1f} L{cx + 4:.1f},{cy - 4:.1f}" stroke="{FAILED_COLOUR}" stroke-width="2">{tip}</path>')
  by_id = {p.path_id: p for p in points}
  for tolerance, selection in selections:
    if tolerance <= 0 or not e_lo <= math.log10(tolerance) <= e_hi: continue
    chosen: Optional[PlotPoint] = by_id.get(selection.chosen.path_id) if selection.chosen else None
    label = f"TOLERANCE {tolerance:g}: " + (chosen.path_id[:10] if chosen else "default (guess)")
    out.append(f'<line x1="{LEFT}" y1="{y(tolerance):.1f}" x2="{LEFT + plot_w}" y2="{y(tolerance):.1f}" '
               f'stroke="{CHOSEN_COLOUR}" stroke-dasharray="4,3"/><text x="{LEFT + plot_w + 6}" '
               f'y="{y(tolerance) + 4:.1f}" fill="{CHOSEN_COLOUR}">{escape(label)}</text>')
    if chosen:
      out.append(f'<circle class="chosen" cx="{x(chosen.seconds):.1f}" cy="{y(chosen.error):.1f}" r="8" '
                 f'fill="none" stroke="{CHOSEN_COLOUR}" stroke-width="2"/>')
  out.append("</svg>")
  return "\n".join(out)

def _time_label(decade: int) -> str:
  seconds = 10.0 ** decade
  for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
    if seconds >= scale: return f"{seconds / scale:g} {unit}"
  return f"1e{decade} s"
