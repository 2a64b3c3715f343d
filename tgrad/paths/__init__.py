"""Execution paths: the ways to realize a graph, measured for time and accuracy, and selected within a tolerance.

  iterate(*tensors)        the PathSpace of realizing them: iterate it for Paths (.id, .description); .count
  realize_path(path)       realize the tensors along one path
  register_kernel(name, reference=, devices=, source=, language=, launch=, numpy=)   a user fused kernel as a path
  python -m tgrad.paths profile|show|best   record a program's paths, inspect the database, list the selection
See docs/paths.md: composite regions and their lowerings (tgrad/tensor_ops/composite.py), paths (path.py), the
float64 reference and graph keys (graph.py), the benchmark database (db.py, fingerprint.py), selection at realize
time (select.py), the profiler (profile.py), user kernels (user_kernels.py), copy coalescing (coalesce.py) and the
graph-equivalence checker (equivalence.py).
  equivalent(f, g, *example_inputs)   proven / numeric / different, with the max error and a counterexample
  register_kernel(name, reference=..., ...)   a user's fused kernel, used wherever its reference's graph appears
"""
from tgrad.paths.path import Path, PathSpace, iterate, realize_path, measure
from tgrad.paths.equivalence import equivalent, Verdict
from tgrad.paths.user_kernels import register_kernel, unregister_kernel, find_sites

__all__ = ["Path", "PathSpace", "iterate", "realize_path", "measure", "equivalent", "Verdict", "register_kernel",
           "unregister_kernel", "find_sites"]
