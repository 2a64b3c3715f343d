"""Set the code generator's integer rule constants from the command line, for sweeps of a benchmark.

A setting is `[module.]NAME=VALUE`: an integer constant of a module of tgrad/codegen (matvec_rules when no module is
named), e.g. `ROW_MATVEC_GROUP=80` or `heuristics.GPU_ROW_MAX_GROUP=64`. `parse` checks every name and value before
anything is set (an unknown module or constant, or a value that is not an integer, is a SystemExit naming it); `apply`
sets them and clears the compiled-runner cache, whose kernels were lowered under the previous values. The heuristics
read the constants when they lower a kernel, so a setting applies to every kernel compiled after it.
Usage (in a bench): `--set NAME=V` (repeatable) → `apply(parse(args.set))`.
"""
from __future__ import annotations
import importlib
from types import ModuleType
import tgrad.realize as realize_module

DEFAULT_MODULE = "matvec_rules"

def parse(items: list[str]) -> list[tuple[ModuleType, str, int]]:
  """(module, constant name, value) for each `[module.]NAME=VALUE`, checked."""
  out = []
  for item in items:
    name, sep, value = item.partition("=")
    module_name, _, constant = name.rpartition(".")
    if not sep or not constant: raise SystemExit(f"setting {item!r}: expected [module.]NAME=VALUE")
    try: module = importlib.import_module(f"tgrad.codegen.{module_name or DEFAULT_MODULE}")
    except ModuleNotFoundError:
      raise SystemExit(f"setting {item!r}: tgrad.codegen has no module {module_name!r}") from None
    if not isinstance(getattr(module, constant, None), int) or isinstance(getattr(module, constant), bool):
      raise SystemExit(f"setting {item!r}: {module.__name__} has no integer constant {constant}")
    try: out.append((module, constant, int(value)))
    except ValueError: raise SystemExit(f"setting {item!r}: {value!r} is not an integer") from None
  return out

def apply(settings: list[tuple[ModuleType, str, int]]) -> None:
  """Set each constant and drop the kernels compiled under the old values."""
  for module, constant, value in settings: setattr(module, constant, value)
  if settings: realize_module._runner_cache.clear()

def describe(settings: list[tuple[ModuleType, str, int]]) -> str:
  return " ".join(f"{m.__name__.rsplit('.', 1)[-1]}.{c}={v}" for m, c, v in settings) or "the rules as they are"
