"""The viz folder: what a run leaves for the viz page, and the switches that fill it (GRAPH=1, VIZ=1).

Layout (TGRAD_VIZ_DIR, else ~/.cache/tgrad/viz): `trace.json` (the run's trace-event JSON), `kernels.json` (each
kernel launched while recording: name, device, source, UOps, opts, launches and time), `graphs/realize_NNNN.svg`
and `.dot` (GRAPH=1: one picture per realize, at most MAX_GRAPH_FILES per run). `apply_environment()`, called when
tgrad is imported, starts the profiler for PROFILE or VIZ and installs the GRAPH=1 observer.
"""
from __future__ import annotations
import dataclasses, glob, json, os, sys
from typing import Any, Callable, Optional, Sequence
from tgrad import profiler

from tgrad.viz.files import GRAPHS_FOLDER, KERNELS_FILE, TRACE_FILE, viz_folder

GRAPH_ENV = "GRAPH"
MAX_GRAPH_FILES = 200   # a decode loop realizes every step: the first pictures say what the rest would

def save_run(trace: profiler.Trace, folder: Optional[str] = None) -> str:
  """Write the trace and its kernels into the viz folder; returns the folder."""
  folder = folder or viz_folder()
  os.makedirs(folder, exist_ok=True)
  profiler.write(trace, os.path.join(folder, TRACE_FILE))
  kernels = [{k: v for k, v in dataclasses.asdict(record).items()} for record in trace.kernels.values()]
  with open(os.path.join(folder, KERNELS_FILE), "w") as f: json.dump(kernels, f)
  return folder

class GraphWriter:
  """The GRAPH=1 observer: a picture of every realize's graph and kernels, written to the viz folder's graphs/."""
  def __init__(self, folder: Optional[str] = None):
    self.folder = os.path.join(folder or viz_folder(), GRAPHS_FOLDER)
    self.count = 0
  def __call__(self, lbs: Sequence[Any]) -> Optional[Callable[[list], None]]:
    from tgrad.viz.graph import Snapshot, names_of_items
    if self.count >= MAX_GRAPH_FILES or all(lb.base.buffer is not None for lb in lbs): return None
    if self.count == 0:   # this run's pictures replace the last run's
      os.makedirs(self.folder, exist_ok=True)
      for old in glob.glob(os.path.join(self.folder, "realize_*")): os.remove(old)
    self.count += 1
    number = self.count
    snapshot = Snapshot(lbs, f"realize {number}")
    def finish(items: list) -> None:
      picture = snapshot.picture(lambda lb: lb.buffer, names_of_items(items))
      base = os.path.join(self.folder, f"realize_{number:04d}")
      picture.write(base + ".dot")
      picture.write(base + ".svg")
      if number == MAX_GRAPH_FILES:
        print(f"GRAPH=1: wrote {MAX_GRAPH_FILES} pictures to {self.folder}; later realizes are not drawn",
              file=sys.stderr)
    return finish

def _serve_at_exit(trace: profiler.Trace) -> None:
  folder = save_run(trace)
  from tgrad.viz.server import serve
  serve(folder)

def apply_environment() -> None:
  """PROFILE=path / VIZ=1: record from now on (VIZ=1 serves the page when the program ends); GRAPH=1 (and VIZ=1,
  unless GRAPH=0): a picture of every realize."""
  viz = os.environ.get(profiler.VIZ_ENV, "").strip() not in ("", "0")
  graph = os.environ.get(GRAPH_ENV, "").strip()
  if (graph not in ("", "0") or (viz and graph != "0")) and profiler.graph_observer is None:
    profiler.graph_observer = GraphWriter()
  if viz and _serve_at_exit not in profiler.at_exit_hooks:
    profiler.at_exit_hooks.append(_serve_at_exit)
  profiler.start_from_environment()
