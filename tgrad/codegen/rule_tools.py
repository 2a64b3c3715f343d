"""What every default-optimization rule uses: trying an opt on a kernel (it may refuse: KernelOptError) and the
largest split of an axis a rule may take. Shared by codegen/heuristics.py and the rule families it calls
(codegen/matvec_rules.py)."""
from __future__ import annotations
from typing import Optional
from tgrad.codegen.axes import AxisState, KernelOptError, Opt
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.opts import apply_opt, apply_opts
from tgrad.shape.sint import divides, sint, vmax_of

def try_opt(kernel: Kernel, opt: Opt) -> bool:
  """Apply the opt if the kernel takes it; whether it did."""
  try: kernel.state = apply_opt(kernel.state, opt)
  except KernelOptError: return False
  return True

def tried(state: AxisState, opts: list[Opt]) -> Optional[AxisState]:
  """The state with every opt of the list applied, or None if one is refused."""
  try: return apply_opts(state, opts)
  except KernelOptError: return None

def try_opts(kernel: Kernel, opts: list[Opt]) -> bool:
  """Apply every opt of the list, or none of them (the kernel is unchanged if one is refused)."""
  if (state := tried(kernel.state, opts)) is None: return False
  kernel.state = state
  return True

def divisor_at_most(size: sint, limit: int) -> int:
  """The largest divisor of size that is <= limit (1 if none is bigger); of a symbolic size, the largest that divides it
  for every value of its variables (4 of n*4, 1 of n)."""
  if isinstance(size, int): return max(d for d in range(1, min(size, limit) + 1) if size % d == 0)
  return max(d for d in range(1, min(vmax_of(size), limit) + 1) if divides(d, size))
