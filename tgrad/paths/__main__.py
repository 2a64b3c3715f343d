"""`python -m tgrad.paths profile|show|best`: record a program's paths, inspect the database, list the selection.

  profile [--budget S] [--max-paths N] [--device D] [--beam] [--repeats R] [--composites N,..] SCRIPT [ARGS...]
      run SCRIPT (with ARGS as its sys.argv) and measure the paths of every graph it realizes (resumable)
  show [GRAPH]      every recorded graph (or those whose key starts with GRAPH): each path's timings (min, median),
                    errors and status, which path each tolerance selects, and why foreign records are not used
  best [--tolerance T]   the path each graph's selection takes at T (default: each graph's dtype default)
A bad command line (a number out of range, a missing script) prints one `error: ...` line and exits with 2; profile
exits with the profiled program's status.
"""
from __future__ import annotations
import argparse, math, os, runpy, sys
from typing import Optional
from tgrad.paths.db import PathsDB, summarize
from tgrad.paths.report import SHOWN_TOLERANCES, graph_dtype_tolerance, selection_here

USAGE_ERROR_STATUS = 2   # argparse's exit status for a bad command line

class UsageError(Exception):
  """A command line that can't run (a bad number, a missing script): one `error: ...` line, exit status 2."""

class OneLineParser(argparse.ArgumentParser):
  """argparse that reports a bad command line as one `error: ...` line on stderr, without the usage block."""
  def error(self, message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USAGE_ERROR_STATUS)

def _number(kind: type, lowest: float, inclusive: bool):
  """An argparse type: a finite `kind` (int or float) at least (inclusive) or above `lowest`."""
  def parse(text: str):
    try: value = kind(text)
    except ValueError: raise argparse.ArgumentTypeError(f"{text!r} is not a{'n int' if kind is int else ' number'}")
    if not (math.isfinite(value) and (value >= lowest if inclusive else value > lowest)):
      raise argparse.ArgumentTypeError(f"must be a finite number {'>=' if inclusive else '>'} {lowest:g}, got {text}")
    return value
  return parse

positive_float, nonnegative_float = _number(float, 0, False), _number(float, 0, True)
positive_int = _number(int, 1, True)

def _profile(args: argparse.Namespace) -> int:
  """Run the script under the profiler; the exit status is the script's own (0 when it ends normally)."""
  if not os.path.isfile(args.script): raise UsageError(f"profile: script {args.script!r}: no such file")
  if args.device: os.environ["DEVICE"] = args.device
  from tgrad.paths.profile import Profiler, watching
  profiler = Profiler(budget=args.budget, max_paths=args.max_paths, repeats=args.repeats,
                      opts=("heuristic", "beam2") if args.beam else ("heuristic",),
                      composites=args.composites.split(",") if args.composites else None)
  sys.argv = [args.script, *args.args]
  status: object = 0
  with watching(profiler):
    try: runpy.run_path(args.script, run_name="__main__")
    except SystemExit as exit_:
      status = 0 if exit_.code is None else exit_.code
      if status != 0: print(f"the profiled program exited with {status}")
  print(f"profiled {len(profiler.graphs_seen)} graphs: {profiler.measured} paths measured "
        f"({profiler.failed} failed), {profiler.skipped} already recorded")
  if isinstance(status, int): return status
  print(status, file=sys.stderr)   # sys.exit("message"): Python prints it and exits with 1
  return 1

def _show(args: argparse.Namespace) -> int:
  db = PathsDB()
  graphs = [(k, d) for k, d in db.graphs() if not args.graph or k.startswith(args.graph)]
  if not graphs: print("no recorded graphs" + (f" with a key starting {args.graph}" if args.graph else ""))
  for key, desc in graphs:
    device = desc.get("device", "")
    print(f"graph {key[:16]} on {device}: outputs {desc.get('outputs')}, composites {desc.get('composites')}, "
          f"{desc.get('nodes')} nodes")
    runs = db.runs(key, device)
    chosen = {t: selection_here(db, key, device, t) for t in SHOWN_TOLERANCES}
    reasons = {summary.path_id: why for summary, why in chosen[SHOWN_TOLERANCES[0]].rejected}
    for s in sorted(summarize(runs), key=lambda s: (s.status != "ok", s.min_time)):
      picks = [f"{t:g}" for t, sel in chosen.items() if sel.chosen is not None and sel.chosen.path_id == s.path_id]
      note = f"selected at TOLERANCE {', '.join(picks)}" if picks else reasons.get(s.path_id, "")
      print(f"  {s.path_id}  {s.min_time*1e6:10.1f} us min {s.median_time*1e6:10.1f} us median  "
            f"rel {s.max_rel_error:9.2e} abs {s.max_abs_error:9.2e}  {s.status:6s} runs {s.runs}  {s.path_desc}"
            + (f"\n      {note}" if note else ""))
  return 0

def _best(args: argparse.Namespace) -> int:
  db = PathsDB()
  for key, desc in db.graphs():
    device = desc.get("device", "")
    tolerance = args.tolerance if args.tolerance is not None else graph_dtype_tolerance(desc)
    sel = selection_here(db, key, device, tolerance)
    what = f"{sel.chosen.path_id} {sel.chosen.path_desc}" if sel.chosen else "default (guess)"
    print(f"graph {key[:16]} on {device} at TOLERANCE {tolerance:g}: {what} — {sel.reason}")
  return 0

def main(argv: Optional[list[str]] = None) -> int:
  parser = OneLineParser(prog="python -m tgrad.paths", description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  profile = sub.add_parser("profile", help="measure the paths of the graphs a Python script realizes")
  profile.add_argument("--budget", type=positive_float, default=600.0, help="seconds of measuring (default 600)")
  profile.add_argument("--max-paths", type=positive_int, default=64, help="paths measured per graph (default 64)")
  profile.add_argument("--device", default=None, help="DEVICE for the script (CUDA, LLVM)")
  profile.add_argument("--beam", action="store_true", help="also measure paths whose kernels are searched (BEAM=2)")
  profile.add_argument("--repeats", type=positive_int, default=5, help="timed runs per path (default 5)")
  profile.add_argument("--composites", default=None, metavar="NAME[,NAME]",
                       help="measure only the uniform paths that lower these composites (e.g. dequantize)")
  profile.add_argument("script")
  profile.add_argument("args", nargs=argparse.REMAINDER)
  show = sub.add_parser("show", help="the recorded paths of every graph")
  show.add_argument("graph", nargs="?", default="", help="a graph key or its prefix")
  best = sub.add_parser("best", help="the path each graph's selection takes")
  best.add_argument("--tolerance", type=nonnegative_float, default=None)
  args = parser.parse_args(argv)
  try: return {"profile": _profile, "show": _show, "best": _best}[args.command](args)
  except UsageError as error: parser.error(str(error))

if __name__ == "__main__": sys.exit(main())
