"""CPU kernels compute a reduce's row-invariant input once per thread (codegen/scratch.py) and what varies along no
loop before their output loops (emit.py): values against numpy on odd sizes, and the programs' structure."""
import numpy as np
import pytest
import torch
from tgrad import Tensor
from tgrad.ops import Ops
from tgrad.schedule import create_schedule
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.linearizer import linearize
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.runtime.llvm.renderer import LLVMRenderer

EPS = 1e-6

def programs(*outs: Tensor) -> list[list]:
  """The linear programs of the kernels that realize `outs`, with the default heuristics for the LLVM renderer."""
  out = []
  for item in create_schedule([o.lazydata for o in outs]):
    if item.ast.op is not Ops.SINK: continue
    kernel = Kernel(item.ast, LLVMRenderer())
    hand_coded_optimizations(kernel)
    out.append(linearize(kernel))
  return out

def before_first_loop(program: list) -> list:
  """The program before its loop over axis 0 (the rows)."""
  return program[:next(i for i, u in enumerate(program) if u.op is Ops.RANGE and u.arg == 0)]

def gelu_tanh(x: np.ndarray) -> np.ndarray:
  return torch.nn.functional.gelu(torch.tensor(x, dtype=torch.float64), approximate="tanh").numpy()

@pytest.mark.parametrize("rows,k", [(7, 37), (64, 640), (33, 129), (1, 5)])
def test_gelu_times_up_matvec(rows, k):
  """down(gelu(gate)·up): the GELU vector in a scratch array, filled before the rows' loop; values within float32."""
  rng = np.random.default_rng(rows * k)
  w, gate, up = (rng.standard_normal(s).astype(np.float32) for s in ((rows, k), (1, k), (1, k)))
  out = (Tensor(gate).gelu() * Tensor(up)) @ Tensor(w).T
  want = (gelu_tanh(gate) * up) @ w.T.astype(np.float64)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
  (program,) = programs((Tensor(gate).gelu() * Tensor(up)) @ Tensor(w).T)
  scratch = [u for u in program if u.op is Ops.DEFINE_LOCAL]
  if rows == 1: assert not scratch   # no loop over rows: nothing is computed twice
  else:   # the rows are a loop of each thread: GELU's polynomial is computed before it, once
    assert len(scratch) == 1 and scratch[0].arg[1] == k
    head = before_first_loop(program)
    assert any(u.op is Ops.STORE and u.src[0] is scratch[0] for u in head)
    assert not any(u.op is Ops.STORE and u.src[0] is scratch[0] for u in program[len(head):])

def test_batch_rows_vary_so_no_scratch_across_them():
  """x of several rows (batch 2×3): the vector varies along the batch axes, so every batch row gets its own values."""
  rng = np.random.default_rng(1)
  w, x = rng.standard_normal((5, 40)).astype(np.float32), rng.standard_normal((2, 3, 40)).astype(np.float32)
  out = (Tensor(x).gelu() * 2.0 + 1.0) @ Tensor(w).T
  want = (gelu_tanh(x) * 2.0 + 1.0) @ w.T.astype(np.float64)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())

@pytest.mark.parametrize("rows,n", [(11, 640), (6, 11), (3, 129)])
def test_normed_residual_matvec(rows, n):
  """W · e / rms(e), e = h + a / rms(a) (a decode step's residual sum and norm inside the next projection): the sums
  of squares vary along no loop and come before the rows' loop; values against numpy."""
  rng = np.random.default_rng(rows + n)
  h, a, w = (rng.standard_normal(s).astype(np.float32) for s in ((n,), (n,), (rows, n)))
  def spread(x: Tensor) -> Tensor: return x.reshape(1, n).expand(rows, n)
  def normed_matvec() -> Tensor:
    e = spread(Tensor(h)) + spread(Tensor(a)) * (spread(Tensor(a)).square().mean(-1, keepdim=True) + EPS).rsqrt()
    return (e * Tensor(w)).sum(-1) * (e.square().mean(-1) + EPS).rsqrt()
  out = normed_matvec()
  e_np = h.astype(np.float64) + a / np.sqrt((a.astype(np.float64) ** 2).mean() + EPS)
  want = (w @ e_np) / np.sqrt((e_np * e_np).mean() + EPS)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
  (program,) = programs(normed_matvec())
  head = before_first_loop(program)
  # both sums of squares (a's, and e's) are reduced before the loop over the rows; only W·e inside it
  assert sum(1 for u in head if u.op is Ops.REDUCE) == 2
  assert sum(1 for u in program[len(head):] if u.op is Ops.REDUCE) == 1
