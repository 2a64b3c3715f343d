"""tgrad's import graph, read from the source with `ast`: import circles and imports that go up the layers.

    python tools/import_graph.py            a summary: circles, upward imports, function-level imports
    python tools/import_graph.py --list     the same, every import named
    python tools/import_graph.py --dot      the module graph in Graphviz's dot language, grouped by floor

An import is *module-level* when it runs as the module loads, *function-level* when it sits in a function body
(it runs on the first call: how a circle is hidden), and *type-only* under `if TYPE_CHECKING:` (never runs; not
counted). `from tgrad.a import b` where b is a module counts as an import of tgrad.a.b, and importing tgrad.a.b
counts as importing the package tgrad.a too (its __init__.py runs first), unless the importer lies inside it.
A *circle* is a strongly connected component of more than one module: over module-level imports alone, and over
all imports that run. An import is *upward* when it reaches a higher floor than the importer's (FLOORS: lowest
first). Imports within one floor are not upward; circles among them still show.
"""
from __future__ import annotations
import argparse, ast, sys
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Iterator, Optional

PACKAGE = "tgrad"
ROOT = FilePath(__file__).resolve().parent.parent / PACKAGE

# The floors of the house, lowest first: a module may import its own floor and the floors below. A module belongs to
# the floor of the longest prefix that names it.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
  ("core", ("tgrad.dtype", "tgrad.helpers", "tgrad.ops", "tgrad.scalars", "tgrad.cache", "tgrad.memory_planner",
            "tgrad.side_kernels", "tgrad.backend", "tgrad.profiler")),
  ("shape", ("tgrad.shape",)),
  ("device", ("tgrad.device",)),
  ("codegen", ("tgrad.codegen",)),
  ("runtime", ("tgrad.runtime", "tgrad.custom")),
  ("lazy graph", ("tgrad.lazy", "tgrad.regions", "tgrad.graph_simplify", "tgrad.multi", "tgrad.attention_kernel",
                  "tgrad.packed_gemm_kernel")),
  ("schedule", ("tgrad.schedule", "tgrad.schedule_cache", "tgrad.schedule_riders")),
  ("realize", ("tgrad.realize", "tgrad.bounds", "tgrad.traced_run", "tgrad.kept_copies")),
  ("front end", ("tgrad.function", "tgrad.tensor_ops", "tgrad.tensor", "tgrad.jit")),
  ("paths", ("tgrad.paths",)),
  ("nn", ("tgrad.nn",)),
  ("models", ("tgrad.models",)),
  ("viz", ("tgrad.viz",)),   # pictures and the local page: read everything, imported by nothing below
  ("package", ("tgrad",)),   # tgrad/__init__.py: the facade over everything
]

@dataclass(frozen=True)
class Import:
  importer: str
  imported: str
  line: int
  kind: str   # "module", "function" or "type"

def module_name(path: FilePath) -> str:
  parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
  if parts[-1] == "__init__": parts.pop()
  return ".".join(parts)

def all_modules() -> dict[str, FilePath]:
  return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}

def floor_of(module: str) -> int:
  best, best_length = len(FLOORS) - 1, -1
  for rank, (_, prefixes) in enumerate(FLOORS):
    for prefix in prefixes:
      if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
        best, best_length = rank, len(prefix)
  return best

def _is_type_checking(test: ast.expr) -> bool:
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
    (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")

def _walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.AST, str]]:
  """Every import node under `node` with its kind: inside a def it is function-level, under TYPE_CHECKING type-only."""
  for child in ast.iter_child_nodes(node):
    if isinstance(child, (ast.Import, ast.ImportFrom)): yield child, kind
    elif isinstance(child, ast.If) and _is_type_checking(child.test):
      for part in child.body: yield from _walk(ast.Module(body=[part], type_ignores=[]), "type")
      for part in child.orelse: yield from _walk(ast.Module(body=[part], type_ignores=[]), kind)
    elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      yield from _walk(child, "type" if kind == "type" else "function")
    else: yield from _walk(child, kind)

def _resolve(node: ast.AST, importer: str, is_package: bool, modules: dict[str, FilePath]) -> list[str]:
  if isinstance(node, ast.Import): return [a.name for a in node.names if a.name.split(".")[0] == PACKAGE]
  assert isinstance(node, ast.ImportFrom)
  base = node.module or ""
  if node.level:   # a relative import
    anchor = importer.split(".") if is_package else importer.split(".")[:-1]
    anchor = anchor[:len(anchor) - (node.level - 1)]
    base = ".".join(anchor + ([base] if base else []))
  if base.split(".")[0] != PACKAGE: return []
  # `from a import b`: b is a module of its own when there is one, else a name defined in a
  return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]

def read_imports(modules: Optional[dict[str, FilePath]] = None) -> list[Import]:
  modules = modules or all_modules()
  found: set[Import] = set()
  for name, path in modules.items():
    tree = ast.parse(path.read_text(), filename=str(path))
    for node, kind in _walk(tree, "module"):
      for imported in _resolve(node, name, path.name == "__init__.py", modules):
        # importing tgrad.a.b runs tgrad/a/__init__.py first (the root package's is running already)
        for parent in _parent_packages(imported, modules): found.add(Import(name, parent, node.lineno, kind))
  return sorted((i for i in found if i.importer != i.imported and not _is_parent(i.imported, i.importer)),
                key=lambda i: (i.importer, i.line, i.imported))

def _parent_packages(module: str, modules: dict[str, FilePath]) -> list[str]:
  """module and the packages above it that run when it is imported, the root package excluded."""
  parts = module.split(".")
  return [m for n in range(2, len(parts) + 1) if (m := ".".join(parts[:n])) in modules]

def _is_parent(package: str, module: str) -> bool:
  """Whether `package` is a package above `module` (already running while module loads, as a package's submodule)."""
  return module.startswith(package + ".")

def circles(imports: list[Import], kinds: tuple[str, ...]) -> list[list[str]]:
  """The strongly connected components of more than one module over imports of `kinds` (Tarjan, iteratively)."""
  graph: dict[str, list[str]] = {}
  for i in imports:
    if i.kind in kinds: graph.setdefault(i.importer, []).append(i.imported); graph.setdefault(i.imported, [])
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  on_stack: set[str] = set()
  stack: list[str] = []
  components: list[list[str]] = []
  for start in sorted(graph):
    if start in index: continue
    work = [(start, 0)]
    while work:
      node, next_child = work.pop()
      if next_child == 0:
        index[node] = low[node] = len(index)
        stack.append(node); on_stack.add(node)
      children = graph[node]
      for i in range(next_child, len(children)):
        child = children[i]
        if child not in index:
          work.append((node, i + 1)); work.append((child, 0))
          break
        if child in on_stack: low[node] = min(low[node], index[child])
      else:
        if low[node] == index[node]:
          component = []
          while True:
            member = stack.pop(); on_stack.discard(member); component.append(member)
            if member == node: break
          if len(component) > 1: components.append(sorted(component))
        if work: low[work[-1][0]] = min(low[work[-1][0]], low[node])
  return sorted(components, key=lambda c: (-len(c), c))

def upward(imports: list[Import]) -> list[Import]:
  return [i for i in imports if i.kind != "type" and floor_of(i.imported) > floor_of(i.importer)]

def report(imports: list[Import], verbose: bool) -> str:
  running = [i for i in imports if i.kind != "type"]
  function_level = [i for i in running if i.kind == "function"]
  module_circles = circles(imports, ("module",))
  all_circles = circles(imports, ("module", "function"))
  up = upward(imports)
  def named(i: Import) -> str:
    return f"    {i.importer}:{i.line} -> {i.imported} ({i.kind}-level; {FLOORS[floor_of(i.importer)][0]} -> " \
           f"{FLOORS[floor_of(i.imported)][0]})"
  lines = [f"modules: {len(all_modules())}, imports between them: {len(running)} "
           f"(module-level {len(running) - len(function_level)}, function-level {len(function_level)}, "
           f"type-only {len(imports) - len(running)})",
           f"circles over module-level imports: {len(module_circles)}"
           + "".join(f"\n    {len(c)} modules: {' '.join(c)}" for c in module_circles),
           f"circles over all imports that run: {len(all_circles)}"
           + "".join(f"\n    {len(c)} modules: {' '.join(c)}" for c in all_circles),
           f"upward imports: {len(up)} (module-level {sum(i.kind == 'module' for i in up)}, "
           f"function-level {sum(i.kind == 'function' for i in up)})"]
  if verbose:
    lines += [named(i) for i in up]
    lines.append(f"function-level imports: {len(function_level)}")
    lines += [named(i) for i in function_level]
  return "\n".join(lines)

def dot(imports: list[Import]) -> str:
  out = ["digraph tgrad {", "  rankdir=BT; node [shape=box, fontsize=10];"]
  by_floor: dict[int, list[str]] = {}
  for name in all_modules(): by_floor.setdefault(floor_of(name), []).append(name)
  for rank, names in sorted(by_floor.items()):
    out.append(f'  subgraph cluster_{rank} {{ label="{FLOORS[rank][0]}"; ' + " ".join(f'"{n}";' for n in names) + " }")
  for i in imports:
    if i.kind == "type": continue
    style = "" if i.kind == "module" else " [style=dashed]"
    if floor_of(i.imported) > floor_of(i.importer):
      style = " [color=red]" if not style else " [style=dashed, color=red]"
    out.append(f'  "{i.importer}" -> "{i.imported}"{style};')
  out.append("}")
  return "\n".join(out)

def main(argv: Optional[list[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--list", action="store_true", help="name every upward and function-level import")
  parser.add_argument("--dot", action="store_true", help="print the graph in Graphviz dot")
  args = parser.parse_args(argv)
  imports = read_imports()
  print(dot(imports) if args.dot else report(imports, args.list))
  return 0

if __name__ == "__main__": sys.exit(main())
