"""Comparing tgrad against torch (CPU): one helper for the op, autograd and nn tests.

`compare_with_torch` runs a function on torch and on tgrad with the same random float32 inputs, compares the outputs,
then the gradients of sum(output · random weights) for every input. Integer and bool results compare exactly.
"""
import numpy as np
import torch
from tgrad import Tensor

def to_numpy(x) -> np.ndarray:
  if isinstance(x, torch.Tensor):
    x = x.detach()
    return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
  return x.numpy()

def compare(name: str, got, want, atol: float, rtol: float) -> None:
  got, want = to_numpy(got), to_numpy(want)
  assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
  if want.dtype.kind in "biu": np.testing.assert_array_equal(got, want, err_msg=name)
  else: np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=name)

def compare_with_torch(torch_fn, tgrad_fn=None, shapes=(), values=None, atol=1e-5, rtol=1e-5, grad_atol=None,
                       grad_rtol=None, low=-2.0, high=2.0, grad=True, rng=None, seed=0, functional=False):
  """Compare tgrad_fn (default: torch_fn) with torch_fn on float32 inputs (random in [low, high) of `shapes`, drawn
  from `rng` or a generator seeded with `seed`; or the given arrays). Gradient tolerances default to 10× the forward
  ones. With `functional`, the tgrad inputs are made with no requires_grad flag (undecided) and their gradients come
  from `loss.gradient(*inputs)`, as tinygrad's op tests take them; else from `backward()` on inputs that require
  grad. Returns the tgrad output."""
  rng = rng if rng is not None else np.random.default_rng(seed)
  inputs = values if values is not None else [rng.uniform(low, high, size=s).astype(np.float32) for s in shapes]
  torch_inputs = [torch.tensor(x, requires_grad=grad) for x in inputs]
  tgrad_inputs = [Tensor(x) if functional else Tensor(x, requires_grad=grad) for x in inputs]
  want, got = torch_fn(*torch_inputs), (tgrad_fn or torch_fn)(*tgrad_inputs)
  compare("forward", got, want, atol, rtol)
  if not grad: return got
  # a scalar that depends on every output element with distinct weights
  weights = rng.uniform(0.5, 1.5, size=tuple(want.shape)).astype(np.float32)
  (want * torch.tensor(weights)).sum().backward()
  tgrad_loss = (got * Tensor(weights)).sum()
  if functional: tgrad_grads = tgrad_loss.gradient(*tgrad_inputs)
  else:
    tgrad_loss.backward()
    tgrad_grads = [g.grad for g in tgrad_inputs]
  for i, (t, g) in enumerate(zip(torch_inputs, tgrad_grads)):
    expected = t.grad if t.grad is not None else torch.zeros_like(t)
    assert g is not None, f"input {i} got no gradient"
    compare(f"gradient of input {i}", g, expected, grad_atol if grad_atol is not None else 10 * atol,
            grad_rtol if grad_rtol is not None else 10 * rtol)
  return got
