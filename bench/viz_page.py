"""Time to render the viz page, and its screenshots for docs/viz.md.

Records a small run (test/viz_run.py: a traced matmul + softmax and a TinyJit) and a benchmark database of GRAPHS
graphs with PATHS paths each (or uses `--db FILE`, e.g. a real database after `python -m tgrad.paths profile`), then
times each page: built by the server (Python, median of REPEATS) and loaded by headless Chromium (the whole process:
start, fetch, layout, exit). `--screenshots DIR` saves a PNG of each page there.
Usage: python bench/viz_page.py [--graphs 40] [--paths 16] [--db FILE] [--screenshots docs]
"""
from __future__ import annotations
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from viz_run import make_paths_db, make_run  # noqa: E402
from tgrad.viz.pages import Site, graphs_page, kernels_page, paths_page, trace_page  # noqa: E402
from tgrad.viz.server import serve_in_thread  # noqa: E402

REPEATS = 5
PAGES = {"kernels": ("/", kernels_page), "graphs": ("/graphs", graphs_page), "trace": ("/trace", trace_page),
         "paths": ("/paths", paths_page)}
WINDOW = "1280,900"

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--graphs", type=int, default=40)
  parser.add_argument("--paths", type=int, default=16)
  parser.add_argument("--db", default=None)
  parser.add_argument("--screenshots", default="")
  args = parser.parse_args()
  browser = shutil.which("chromium") or shutil.which("chromium-browser")
  with tempfile.TemporaryDirectory() as folder:
    make_run(folder)
    db = args.db or make_paths_db(folder, args.graphs, args.paths)
    site = Site(folder, db_path=db)
    report: dict = {"graphs": args.graphs if not args.db else "from --db", "paths per graph": args.paths}
    for name, (_, build) in PAGES.items():
      samples = []
      for _ in range(REPEATS):
        start = time.perf_counter()
        html = build(site)
        samples.append(time.perf_counter() - start)
      report[f"{name} page built ms"] = round(statistics.median(samples) * 1e3, 2)
      report[f"{name} page bytes"] = len(html.encode())
    if browser:
      server, url = serve_in_thread(site)
      try:
        for name, (route, _) in PAGES.items():
          start = time.perf_counter()
          subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", url + route],
                         capture_output=True, timeout=120, check=True)
          report[f"{name} page in Chromium ms"] = round((time.perf_counter() - start) * 1e3, 1)
          if args.screenshots:
            shot = os.path.abspath(os.path.join(args.screenshots, f"viz_{name}.png"))
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            f"--window-size={WINDOW}", "--virtual-time-budget=2000", f"--screenshot={shot}",
                            url + route], capture_output=True, timeout=120, check=True)
      finally: server.shutdown()
    print(json.dumps(report, indent=1))

if __name__ == "__main__": main()
