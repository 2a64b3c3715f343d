"""The viz page's HTML: kernels, graph pictures, the trace and the benchmark database, from a viz folder.

Input: a `Site` (the viz folder, the trace file, the paths database). Output: one HTML string per page, built here on
the server (no data reaches the browser any other way), every value from a file or the database through
`html.escape`. The one script on a page is a fixed text: after the page loads it marks <body> with the number of
pictures that failed to load (what the browser test reads). Graph pictures are <img> elements of SVG files, which a
browser never lets run scripts.
"""
from __future__ import annotations
import glob, json, os
from dataclasses import dataclass
from html import escape
from typing import Optional
from urllib.parse import quote
from tgrad.viz.files import GRAPHS_FOLDER, KERNELS_FILE, TRACE_FILE, viz_folder
from tgrad.viz.trace_format import summarize_trace, validate_trace

NAV = (("/", "Kernels"), ("/graphs", "Graphs"), ("/trace", "Trace"), ("/paths", "Paths database"))
MAX_GRAPHS_SHOWN = 24          # pictures on the graphs page (the rest are listed as links)
MAX_TIMELINE_EVENTS = 4000     # duration events drawn in the trace page's timeline
TIMELINE_WIDTH, TIMELINE_ROW = 1100, 22
STYLE = """body{font-family:Helvetica,Arial,sans-serif;margin:0;color:#222}nav{background:#263238;padding:8px 16px}
nav a{color:#eceff1;margin-right:18px;text-decoration:none;font-weight:bold}main{padding:12px 16px}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}pre{background:#f5f5f5;padding:8px;overflow:auto;
font-size:12px;max-height:600px}figure{margin:0 0 24px 0}img.graph{max-width:100%;border:1px solid #ccc}
.note{color:#666;font-size:13px}"""
LOAD_CHECK = """window.addEventListener("load", function () {
  var images = document.querySelectorAll("img"), broken = 0;
  for (var i = 0; i < images.length; i++) if (!(images[i].complete && images[i].naturalWidth > 0)) broken++;
  document.body.setAttribute("data-broken-images", String(broken));
  document.body.setAttribute("data-loaded", "yes");
});"""

@dataclass
class Site:
  """Where the page reads from: the viz folder, a trace file (default: the folder's), a paths database file
  (default: tgrad's cache file)."""
  folder: str = ""
  trace_path: str = ""
  db_path: Optional[str] = None
  def __post_init__(self):
    self.folder = self.folder or viz_folder()
    self.trace_path = self.trace_path or os.path.join(self.folder, TRACE_FILE)
  def kernels(self) -> list[dict]:
    path = os.path.join(self.folder, KERNELS_FILE)
    if not os.path.exists(path): return []
    with open(path) as f: return json.load(f)
  def graph_files(self) -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(self.folder, GRAPHS_FOLDER, "*.svg")))
  def graph_path(self, name: str) -> Optional[str]:
    """The path of graph picture `name`, only if it is one of the folder's pictures (nothing else is served)."""
    return os.path.join(self.folder, GRAPHS_FOLDER, name) if name in self.graph_files() else None

def page(title: str, body: str) -> str:
  links = "".join(f'<a href="{href}">{escape(label)}</a>' for href, label in NAV)
  return (f'<!doctype html><html><head><meta charset="utf-8"><title>tgrad viz: {escape(title)}</title>'
          f'<style>{STYLE}</style></head><body><nav>{links}</nav><main><h1>{escape(title)}</h1>{body}</main>'
          f'<script>{LOAD_CHECK}</script></body></html>')

def _number(value: float, digits: int = 1) -> str: return f"{value:,.{digits}f}"

# ---- kernels

def kernels_page(site: Site) -> str:
  kernels = sorted(site.kernels(), key=lambda k: -k.get("seconds", 0.0))
  if not kernels:
    return page("Kernels", '<p class="note">No kernels recorded in ' + escape(site.folder) + ". Run a script with "
                "<code>VIZ=1</code> (or <code>PROFILE=trace.json</code> and save its run) first.</p>")
  total = sum(k.get("seconds", 0.0) for k in kernels) or 1.0
  rows = []
  for k in kernels:
    seconds, calls = k.get("seconds", 0.0), k.get("calls", 0)
    gbs = k.get("nbytes", 0) * calls / seconds / 1e9 if seconds > 0 else 0.0
    rows.append(f'<tr><td><a href="/kernel?id={int(k["kernel_id"])}">{escape(k["name"])}</a></td>'
                f'<td>{escape(k["device"])}</td><td class="n">{calls}</td><td class="n">{_number(seconds * 1e6)}</td>'
                f'<td class="n">{_number(100 * seconds / total)}</td><td class="n">{_number(gbs, 2)}</td>'
                f'<td>{escape(k.get("opts", ""))}</td></tr>')
  body = (f'<p>{len(kernels)} kernels, {_number(total * 1e3, 3)} ms in all (device time while recording).</p>'
          '<table class="kernels"><tr><th>kernel</th><th>device</th><th>launches</th><th>total us</th><th>%</th>'
          '<th>GB/s</th><th>opts</th></tr>' + "".join(rows) + "</table>")
  return page("Kernels", body)

def kernel_page(site: Site, kernel_id: int) -> Optional[str]:
  found = [k for k in site.kernels() if k.get("kernel_id") == kernel_id]
  if not found: return None
  k = found[0]
  facts = [("device", k["device"]), ("global size", k.get("global_size", "")), ("local size", k.get("local_size", "")),
           ("opts", k.get("opts", "") or "none"), ("launches", k.get("calls", 0)),
           ("device time", f"{k.get('seconds', 0.0) * 1e6:.1f} us"), ("FLOPs per launch", k.get("flops", 0)),
           ("bytes per launch", k.get("nbytes", 0))]
  table = "".join(f"<tr><th>{escape(name)}</th><td>{escape(str(value))}</td></tr>" for name, value in facts)
  uops = k.get("uops") or "(not recorded: the kernel was compiled before recording started)"
  body = (f'<table>{table}</table><h2>Source</h2><pre class="source">{escape(k.get("src", ""))}</pre>'
          f'<h2>UOps</h2><pre class="uops">{escape(uops)}</pre>')
  return page(f"Kernel {k['name']}", body)

# ---- graphs

def graphs_page(site: Site) -> str:
  files = site.graph_files()
  if not files:
    return page("Graphs", '<p class="note">No graph pictures in ' + escape(os.path.join(site.folder, GRAPHS_FOLDER)) +
                ". Run a script with <code>GRAPH=1</code>, or call <code>tgrad.viz.graph(tensor, path)</code>.</p>")
  shown = "".join(f'<figure><figcaption>{escape(name)}</figcaption><img class="graph" alt="{escape(name)}" '
                  f'src="/graph.svg?name={quote(name)}"></figure>' for name in files[:MAX_GRAPHS_SHOWN])
  rest = "".join(f'<li><a href="/graph.svg?name={quote(name)}">{escape(name)}</a></li>'
                 for name in files[MAX_GRAPHS_SHOWN:])
  note = ('<p class="note">Kernels are the dashed clusters; colours mark composite regions (the legend names the '
          'lowering each took); a bold border is a value the schedule realized.</p>')
  return page("Graphs", note + shown + (f"<ul>{rest}</ul>" if rest else ""))

# ---- trace

def trace_page(site: Site) -> str:
  if not os.path.exists(site.trace_path):
    return page("Trace", '<p class="note">No trace at ' + escape(site.trace_path) + ".</p>")
  with open(site.trace_path) as f: data = json.load(f)
  try: validate_trace(data)
  except ValueError as error: return page("Trace", f'<p class="note">Not a valid trace: {escape(str(error))}</p>')
  summary = summarize_trace(data)
  rows = []
  for track, names in summary["tracks"].items():
    for name, (count, micros) in sorted(names.items(), key=lambda item: -item[1][1]):
      rows.append(f'<tr><td>{escape(track)}</td><td>{escape(name)}</td><td class="n">{count}</td>'
                  f'<td class="n">{_number(micros / 1e3, 3)}</td></tr>')
  body = (f'<p>{summary["events"]} events over {_number(summary["span_us"] / 1e3, 3)} ms, from '
          f'<code>{escape(site.trace_path)}</code> ({os.path.getsize(site.trace_path):,} bytes). '
          '<a href="/trace.json" download="trace.json">Download it</a> and open it in ui.perfetto.dev or '
          'chrome://tracing for the full timeline.</p>' + timeline_svg(data, summary) +
          '<table class="phases"><tr><th>track</th><th>event</th><th>count</th><th>total ms</th></tr>' +
          "".join(rows) + "</table>")
  return page("Trace", body)

def timeline_svg(data: dict, summary: dict) -> str:
  """The first MAX_TIMELINE_EVENTS duration events as bars, one row per track."""
  events = [e for e in data["traceEvents"] if e.get("ph") == "X"][:MAX_TIMELINE_EVENTS]
  if not events: return ""
  tracks = list(dict.fromkeys((e["pid"], e["tid"]) for e in events))
  start = min(e["ts"] for e in events)
  span = max(e["ts"] + e["dur"] for e in events) - start or 1.0
  label_width = 200
  scale = (TIMELINE_WIDTH - label_width) / span
  height = len(tracks) * TIMELINE_ROW + 24
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{TIMELINE_WIDTH}" height="{height}" '
         'font-family="Helvetica, Arial, sans-serif" font-size="11">']
  for row, track in enumerate(tracks):
    name = summary["track_names"].get(track, f"{track[0]}/{track[1]}")
    out.append(f'<text x="4" y="{row * TIMELINE_ROW + 15}">{escape(name)}</text>')
  for e in events:
    row = tracks.index((e["pid"], e["tid"]))
    colour = "#1e88e5" if e.get("cat") in ("kernel", "jit replay") else "#fb8c00"
    out.append(f'<rect x="{label_width + (e["ts"] - start) * scale:.2f}" y="{row * TIMELINE_ROW + 3}" '
               f'width="{max(e["dur"] * scale, 0.5):.2f}" height="{TIMELINE_ROW - 6}" fill="{colour}">'
               f'<title>{escape(e["name"])}: {e["dur"]:.1f} us</title></rect>')
  out.append(f'<text x="{label_width}" y="{height - 6}">0</text><text x="{TIMELINE_WIDTH - 4}" y="{height - 6}" '
             f'text-anchor="end">{span / 1e3:.3f} ms</text></svg>')
  return "".join(out)

# ---- the paths database

def paths_page(site: Site) -> str:
  from tgrad.paths.db import PathsDB, summarize
  from tgrad.paths.report import SHOWN_TOLERANCES, graph_dtype_tolerance, selection_here
  from tgrad.viz.plots import plot_svg
  db = PathsDB(site.db_path)
  graphs = db.graphs()
  if not graphs: return page("Paths database", '<p class="note">No recorded graphs in the benchmark database. '
                             "Record some with <code>python -m tgrad.paths profile SCRIPT</code>.</p>")
  sections = []
  for key, desc in graphs:
    device = desc.get("device", "")
    runs = db.runs(key, device)
    summaries = summarize(runs)
    tolerances = sorted(set(SHOWN_TOLERANCES) | {graph_dtype_tolerance(desc)}, reverse=True)
    selections = [(t, selection_here(db, key, device, t)) for t in tolerances]
    chosen_at: dict[str, list[str]] = {}
    for t, selection in selections:
      if selection.chosen is not None: chosen_at.setdefault(selection.chosen.path_id, []).append(f"{t:g}")
    title = f"graph {key[:16]} on {device}: {desc.get('composites')}, outputs {desc.get('outputs')}"
    rows = "".join(
      f'<tr><td>{escape(s.path_id[:16])}</td><td>{escape(s.path_desc)}</td><td class="n">{_number(s.min_time * 1e6)}'
      f'</td><td class="n">{s.max_rel_error:.2e}</td><td>{escape(s.status)}</td>'
      f'<td>{escape(", ".join(chosen_at.get(s.path_id, [])))}</td></tr>'
      for s in sorted(summaries, key=lambda s: (s.status != "ok", s.min_time)))
    picks = "".join(f"<li>TOLERANCE {t:g}: {escape(sel.chosen.path_desc if sel.chosen else 'default (guess)')} — "
                    f"{escape(sel.reason)}</li>" for t, sel in selections)
    sections.append(f'<section class="graph-paths"><h2>{escape(title)}</h2>{plot_svg(title, summaries, selections)}'
                    f'<ul>{picks}</ul><table><tr><th>path</th><th>description</th><th>min us</th><th>max rel err</th>'
                    f'<th>status</th><th>selected at</th></tr>{rows}</table></section>')
  return page("Paths database", f"<p>{len(graphs)} graphs. The blue line is the Pareto front; a dashed line is a "
              "tolerance, and the ringed point the path it selects.</p>" + "".join(sections))
