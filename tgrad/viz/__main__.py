"""`python -m tgrad.viz [--port N] [--folder DIR] [--trace FILE] [--db FILE]`: serve the viz page on 127.0.0.1."""
from __future__ import annotations
import argparse
from tgrad.viz.server import DEFAULT_PORT, serve

def main() -> None:
  parser = argparse.ArgumentParser(prog="python -m tgrad.viz", description=__doc__)
  parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT})")
  parser.add_argument("--folder", default="", help="the viz folder (default: TGRAD_VIZ_DIR or ~/.cache/tgrad/viz)")
  parser.add_argument("--trace", default="", help="a trace file to show (default: the folder's trace.json)")
  parser.add_argument("--db", default=None, help="a benchmark database file (default: tgrad's cache file)")
  args = parser.parse_args()
  if not 0 <= args.port < 65536: parser.error(f"--port must be from 0 to 65535, got {args.port}")
  serve(args.folder, args.port, args.trace, args.db)

if __name__ == "__main__": main()
