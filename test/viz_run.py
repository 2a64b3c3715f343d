"""A small run for the viz tests and bench/viz_page.py: a traced eager matmul + softmax and a TinyJit replayed, with
a picture of every realize, saved to a viz folder; and a benchmark database of synthetic paths beside it."""
from __future__ import annotations
import os
import numpy as np
import tgrad
from tgrad import Tensor, TinyJit, profiler
from tgrad.viz.folder import GraphWriter, save_run

DB_FILE = "paths.db"

def make_run(folder: str, jit_calls: int = 4) -> profiler.Trace:
  """Record the run into `folder` (trace.json, kernels.json, graphs/); returns its trace."""
  saved, profiler.graph_observer = profiler.graph_observer, GraphWriter(folder)
  try:
    with tgrad.profile() as trace:
      x = Tensor(np.random.default_rng(0).standard_normal((16, 32), dtype=np.float32))
      w = Tensor(np.random.default_rng(1).standard_normal((32, 8), dtype=np.float32))
      (x @ w).softmax(-1).numpy()
      step = TinyJit(lambda a: (a * 2 + 1).relu().sum(0))
      for i in range(jit_calls): step(Tensor(np.full((8, 8), i, np.float32))).numpy()
  finally: profiler.graph_observer = saved
  save_run(trace, folder)
  return trace

def make_paths_db(folder: str, graphs: int = 2, paths: int = 7, seed: int = 0) -> str:
  """A benchmark database of `graphs` graphs with `paths` paths each (the last one failed), recorded for this
  machine so selection uses them; names carry HTML metacharacters to check the page escapes them."""
  from tgrad.paths.db import Measurement, PathsDB
  from tgrad.paths.fingerprint import hardware_fingerprint, tgrad_version
  from tgrad.helpers import code_settings
  path = os.path.join(folder, DB_FILE)
  db = PathsDB(path)
  fingerprint, version, settings = hardware_fingerprint("LLVM"), tgrad_version(), code_settings()
  rng = np.random.default_rng(seed)
  for g in range(graphs):
    for p in range(paths):
      failed = p == paths - 1
      db.add(Measurement(
        graph_key=f"{g:04d}" + "ab" * 30, graph_desc={"device": "LLVM", "outputs": [[[4, 8], "dtypes.float32"]],
                                                      "composites": ["softmax", "exp<b>"], "nodes": 9},
        path_id=f"p{g:03d}{p:03d}" + "0" * 9, path_desc=f"softmax=lowering{p} <b>&", device="LLVM",
        fingerprint=fingerprint, tgrad_version=version, settings=settings,
        times=tuple(float(t) for t in rng.uniform(1e-5, 1e-3, 3)),
        max_rel_error=float(10.0 ** rng.uniform(-8, -2)) if p else 0.0, max_abs_error=1e-6,
        input_distribution="normal(0,1)", status="failed" if failed else "ok", error="crashed" if failed else ""))
  return path
