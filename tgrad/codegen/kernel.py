"""Kernel: a kernel being optimized in place, for callers that apply opts one at a time (realize, benchmarks, tests).

A Kernel holds one AxisState (axes.py: the AST, the target, the axes and their roles) and replaces it with each opt
(opts.py: one function per OptOp). A refused opt raises KernelOptError and leaves the state as it was; `copy()` is a
second Kernel on the same state. Every fact of the state (full_shape, first_reduce, memops, launch_dims, ...) reads
through; anything that only reads a kernel (the linearizer, linearizer.py) takes a Kernel or an AxisState alike.

  kernel = Kernel(ast, renderer)            # the unoptimized layout: AxisState.of(ast, renderer)
  kernel.apply_opt(Opt(OptOps.UPCAST, 0, 4))   # kernel.state = opts.apply_opt(kernel.state, opt)
"""
from __future__ import annotations
from typing import Any
from tgrad.ops import UOp, is_gather_load
from tgrad.codegen.axes import AxisState, KernelOptError, Opt, OptOps, fold_dims, memory_extent
from tgrad.codegen.opts import MAX_UPCAST, apply_opt, reduce_ignores_padding

# re-exported: the vocabulary of opts lives in axes.py and opts.py; callers import it from here too
__all__ = ["Kernel", "AxisState", "KernelOptError", "Opt", "OptOps", "MAX_UPCAST", "fold_dims", "memory_extent",
           "reduce_ignores_padding", "is_gather_load"]

class Kernel:
  def __init__(self, ast: UOp, renderer):
    self.state: AxisState = AxisState.of(ast, renderer)

  @staticmethod
  def of_state(state: AxisState) -> Kernel:
    """A Kernel that continues from `state`."""
    kernel = object.__new__(Kernel)
    kernel.state = state
    return kernel

  def __getattr__(self, name: str) -> Any:
    """The state's fields and facts (only names a Kernel doesn't have itself get here)."""
    state = self.__dict__.get("state")
    if state is None: raise AttributeError(name)
    return getattr(state, name)

  def __setattr__(self, name: str, value: Any) -> None:
    if name != "state": raise AttributeError(f"Kernel.{name} belongs to its AxisState: apply an opt, or set .state")
    object.__setattr__(self, name, value)

  @property
  def applied_opts(self) -> list[Opt]: return list(self.state.applied_opts)

  def apply_opt(self, opt: Opt) -> None:
    """Apply one Opt or raise KernelOptError; the kernel is unchanged when it raises."""
    self.state = apply_opt(self.state, opt)

  def copy(self) -> Kernel: return Kernel.of_state(self.state)
