"""Execution paths: the ways to realize a graph, measured for time and accuracy, and selected within a tolerance.

  iterate(*tensors)        the PathSpace of realizing them: iterate it for Paths (.id, .description); .count
  realize_path(path)       realize the tensors along one path
  register_kernel(name, reference=, devices=, source=, language=, launch=, numpy=)   a user fused kernel as a path
  equivalent(f, g, *example_inputs)   proven / numeric / different, with the max error and a counterexample
  python -m tgrad.paths profile|show|best   record a program's paths, inspect the database, list the selection
See docs/paths.md: composite regions and their lowerings (tgrad/regions.py, tgrad/tensor_ops/composite.py), paths
(path.py), their error (accuracy.py), the float64 reference and graph keys (graph.py), the benchmark database (db.py,
fingerprint.py), selection at realize time (select.py, a pre-realize pass this package registers with
tgrad/realize.py), the profiler (profile.py) and the observers it installs (observers.py), user kernels
(user_kernels.py), copy coalescing (coalesce.py) and the graph-equivalence checker (equivalence.py, loaded on first
use: it brings sympy).
"""
from tgrad.realize import register_pre_realize_pass
from tgrad.paths.select import context_for
from tgrad.paths.path import ExecutionPath, PathSpace, iterate, realize_path, measure
from tgrad.paths.user_kernels import register_kernel, unregister_kernel, find_sites

register_pre_realize_pass(context_for)

__all__ = ["ExecutionPath", "PathSpace", "iterate", "realize_path", "measure", "equivalent", "Verdict",
           "register_kernel", "unregister_kernel", "find_sites"]

def __getattr__(name: str):
  """`equivalent` and `Verdict` (equivalence.py) on first use: importing it loads sympy, which selection never needs."""
  if name in ("equivalent", "Verdict"):
    from tgrad.paths import equivalence
    return getattr(equivalence, name)
  raise AttributeError(f"module 'tgrad.paths' has no attribute {name!r}")
