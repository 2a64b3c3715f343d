"""Tests for tgrad/codegen/opts.py and axes.py: an opt maps an immutable AxisState to a new one (the old state is
untouched, a refused opt raises and changes nothing), a Kernel is a handle whose state an opt replaces, every OptOp
has its function, and the opt modules import no module above them (no circle with kernel.py).
"""
import ast
import dataclasses
from pathlib import Path
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.axes import AxisState
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.codegen.heuristics import tried
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.runtime.llvm.renderer import LLVMRenderer
from tgrad.codegen.opts import OPT_FUNCTIONS, apply_opt, apply_opts
from tgrad.ops import Ops
from tgrad.schedule import create_schedule

CODEGEN = Path(__file__).resolve().parents[2] / "tgrad" / "codegen"

def matmul_ast(n: int, k: int, m: int, dtype=np.float32):
  rng = np.random.default_rng(0)
  a, b = (Tensor(rng.standard_normal(shape).astype(dtype), device="LLVM") for shape in ((n, k), (k, m)))
  return [item for item in create_schedule([(a @ b).lazydata]) if item.ast.op is Ops.SINK][-1].ast

def test_an_opt_returns_a_new_state_and_leaves_the_old_one():
  state = AxisState.of(matmul_ast(16, 24, 8), LLVMRenderer())
  shape, sts = state.full_shape, state.sts
  upcast = Opt(OptOps.UPCAST, 0, 4)
  new = apply_opt(state, upcast)
  assert new is not state and new.applied_opts == (upcast,) and new.upcasted == 1
  assert new.full_shape == (4, 8, 24, 4) and shape == (16, 8, 24)
  assert state.full_shape == shape and state.sts is sts and state.upcasted == 0 and state.applied_opts == ()
  with pytest.raises(dataclasses.FrozenInstanceError): state.upcasted = 1   # type: ignore[misc]

def test_a_refused_opt_raises_and_the_kernel_keeps_its_state():
  kernel = Kernel(matmul_ast(16, 24, 8), LLVMRenderer())
  kernel.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  before = kernel.state
  with pytest.raises(KernelOptError, match="doesn't divide"): kernel.apply_opt(Opt(OptOps.UPCAST, 1, 3))
  with pytest.raises(KernelOptError, match="LLVMRenderer"): kernel.apply_opt(Opt(OptOps.TC, 0, 0))
  assert kernel.state is before and kernel.applied_opts == [Opt(OptOps.UPCAST, 0, 4)]
  assert tried(before, [Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UPCAST, 5, 2)]) is None and kernel.state is before

def test_copy_shares_the_state_until_an_opt_replaces_it():
  kernel = Kernel(matmul_ast(16, 24, 8), LLVMRenderer())
  copy = kernel.copy()
  assert copy.state is kernel.state
  copy.apply_opt(Opt(OptOps.UNROLL, 0, 8))
  assert copy.applied_opts == [Opt(OptOps.UNROLL, 0, 8)] and kernel.applied_opts == [] and copy.upcasted == 1
  assert kernel.full_shape == (16, 8, 24) and copy.full_shape == (16, 8, 3, 8)

def test_a_kernels_fields_belong_to_its_state():
  kernel = Kernel(matmul_ast(16, 24, 8), LLVMRenderer())
  with pytest.raises(AttributeError, match="AxisState"): kernel.upcasted = 2
  assert Kernel.of_state(kernel.state).state is kernel.state

def test_every_optop_has_a_function():
  assert set(OPT_FUNCTIONS) == set(OptOps)

def test_tensor_core_and_smem_are_functions_of_the_state():
  state = AxisState.of(matmul_ast(64, 32, 64, np.float16), CUDARenderer("sm_90"))
  tc = OPT_FUNCTIONS[OptOps.TC](state, Opt(OptOps.TC, 0, 0))
  assert state.tensor_core is None and tc.tensor_core is not None and tc.tc_lane_axes == (2, 3)
  staged = OPT_FUNCTIONS[OptOps.SMEM](tc, Opt(OptOps.SMEM, 1, 8))
  assert tc.staged == () and len(staged.staged) == 1 and staged.staged[0][1] == 8
  assert apply_opts(state, [Opt(OptOps.TC, 0, 0), Opt(OptOps.SMEM, 1, 8)]).staged == staged.staged
  with pytest.raises(KernelOptError, match="TC must come before"):
    apply_opts(state, [Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.TC, 0, 0)])

def codegen_imports(module: str) -> set[str]:
  """Every tgrad.codegen module `module` imports anywhere: top level, inside functions and under TYPE_CHECKING."""
  tree = ast.parse((CODEGEN / f"{module}.py").read_text())
  names = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
  return {name.rsplit(".", 1)[1] for name in names if name.startswith("tgrad.codegen.")}

def test_the_opt_modules_form_no_import_circle():
  modules = ["kernel", "axes", "opts", "staging", "tensor_cores"]
  graph = {m: codegen_imports(m) & set(modules) for m in modules}
  def reaches(start: str, goal: str, seen=()) -> bool:
    return any(n == goal or (n not in seen and reaches(n, goal, seen + (n,))) for n in graph[start])
  assert not [m for m in modules if reaches(m, m)], graph
  assert graph["axes"] == set() and "kernel" not in graph["opts"] | graph["staging"] | graph["tensor_cores"]
