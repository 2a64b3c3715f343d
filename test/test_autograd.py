"""Autograd against torch 2.x (CPU): the gradient of every differentiable op of the core Tensor API, and the
machinery — backward with an explicit gradient, accumulation, `Tensor.gradient`, detach, no_grad, and errors.

Each op check runs the same float32 inputs through torch and tgrad (the `compare_with_torch` fixture in conftest)
and compares outputs and the gradients of a randomly weighted sum of the outputs, with the tolerances given here.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tgrad import Tensor, dtypes

ATOL, RTOL = 1e-5, 1e-5                 # float32 arithmetic; gradients get 10× (the fixture's default)
TRANSCENDENTAL_ATOL, TRANSCENDENTAL_RTOL = 1e-5, 3e-5   # exp/log/sin polynomials are within a few ulp

UNARY = [  # name, torch fn, tgrad fn, input range
  ("neg", lambda x: -x, None, -2, 2),
  ("exp", torch.exp, Tensor.exp, -2, 2),
  ("log", torch.log, Tensor.log, 0.1, 3),
  ("exp2", torch.exp2, Tensor.exp2, -2, 2),
  ("log2", torch.log2, Tensor.log2, 0.1, 3),
  ("sqrt", torch.sqrt, Tensor.sqrt, 0.1, 3),
  ("rsqrt", torch.rsqrt, Tensor.rsqrt, 0.2, 3),
  ("reciprocal", torch.reciprocal, Tensor.reciprocal, 0.5, 3),
  ("sin", torch.sin, Tensor.sin, -3, 3),
  ("cos", torch.cos, Tensor.cos, -3, 3),
  ("tan", torch.tan, Tensor.tan, -1.2, 1.2),
  ("square", torch.square, Tensor.square, -2, 2),
  ("sigmoid", torch.sigmoid, Tensor.sigmoid, -4, 4),
  ("tanh", torch.tanh, Tensor.tanh, -3, 3),
  ("relu", torch.relu, Tensor.relu, -2, 2),
  ("relu6", F.relu6, Tensor.relu6, -3, 9),
  ("leaky_relu", lambda x: F.leaky_relu(x, 0.1), lambda x: x.leaky_relu(0.1), -2, 2),
  ("elu", F.elu, Tensor.elu, -2, 2),
  ("gelu", lambda x: F.gelu(x, approximate="tanh"), Tensor.gelu, -3, 3),
  ("quick_gelu", lambda x: x * torch.sigmoid(1.702 * x), Tensor.quick_gelu, -3, 3),
  ("silu", F.silu, Tensor.silu, -3, 3),
  ("softplus", lambda x: F.softplus(x, beta=2.0), lambda x: x.softplus(2.0), -3, 3),
  ("mish", F.mish, Tensor.mish, -3, 3),
  ("abs", torch.abs, Tensor.abs, -2, 2),
  ("clip", lambda x: x.clamp(-0.5, 0.7), lambda x: x.clip(-0.5, 0.7), -2, 2),
  ("pow_int", lambda x: x ** 3, lambda x: x ** 3, -2, 2),
  ("pow_float", lambda x: x ** 1.7, lambda x: x ** 1.7, 0.1, 2),
  ("pow_negative", lambda x: x ** -2, lambda x: x ** -2, 0.5, 2),
]

@pytest.mark.parametrize("name, torch_fn, tgrad_fn, low, high", UNARY, ids=[u[0] for u in UNARY])
def test_unary(compare_with_torch, name, torch_fn, tgrad_fn, low, high):
  compare_with_torch(torch_fn, tgrad_fn, [(3, 5)], low=low, high=high, atol=TRANSCENDENTAL_ATOL,
                     rtol=TRANSCENDENTAL_RTOL)

BINARY = [
  ("add", lambda x, y: x + y, (4, 5), (5,)),
  ("sub", lambda x, y: x - y, (4, 1), (1, 5)),
  ("mul", lambda x, y: x * y, (2, 4, 5), (4, 5)),
  ("div", lambda x, y: x / (y.abs() + 0.5), (4, 5), (4, 5)),
  ("pow", lambda x, y: (x.abs() + 0.5) ** y, (4, 5), (4, 5)),
  ("rpow", lambda x, y: 2.0 ** x + y, (4, 5), (4, 5)),
  ("maximum", lambda x, y: x.maximum(y) if isinstance(x, Tensor) else torch.maximum(x, y), (4, 5), (5,)),
  ("minimum", lambda x, y: x.minimum(y) if isinstance(x, Tensor) else torch.minimum(x, y), (4, 5), (4, 1)),
  ("lerp", lambda x, y: x.lerp(y, 0.3) if isinstance(x, Tensor) else torch.lerp(x, y, 0.3), (4, 5), (4, 5)),
]

@pytest.mark.parametrize("name, fn, shape_x, shape_y", BINARY, ids=[b[0] for b in BINARY])
def test_binary(compare_with_torch, name, fn, shape_x, shape_y):
  compare_with_torch(fn, None, [shape_x, shape_y], atol=TRANSCENDENTAL_ATOL, rtol=TRANSCENDENTAL_RTOL)

def test_where_and_broadcast_condition(compare_with_torch):
  condition = np.array([[True, False, True, True, False]])
  compare_with_torch(lambda x, y: torch.where(torch.tensor(condition), x, y),
                     lambda x, y: Tensor(condition).where(x, y), [(3, 5), (3, 1)])

def test_maximum_ties_split_the_gradient(compare_with_torch):
  values = [np.array([1.0, 2.0, 3.0, -1.0], np.float32), np.array([1.0, 1.0, 3.0, -1.0], np.float32)]
  compare_with_torch(torch.maximum, Tensor.maximum, values=values)
  compare_with_torch(torch.minimum, Tensor.minimum, values=values)

def test_clip_gradient_includes_the_bounds(compare_with_torch):
  values = [np.array([-2.0, -0.5, 0.0, 0.7, 2.0], np.float32)]   # exactly on both bounds: torch's gradient is 1 there
  compare_with_torch(lambda x: x.clamp(-0.5, 0.7), lambda x: x.clip(-0.5, 0.7), values=values)

def test_cast_passes_the_gradient_through(compare_with_torch):
  compare_with_torch(lambda x: x.half().float() * 3, lambda x: x.half().float() * 3, [(4, 4)], atol=2e-3, rtol=1e-3,
                     grad_atol=1e-5, grad_rtol=1e-5)
  compare_with_torch(lambda x: x.double().exp().float(), lambda x: x.cast(dtypes.float64).exp().float(), [(6,)])

REDUCTIONS = [
  ("sum", lambda x: x.sum(), None),
  ("sum_axis", lambda x: x.sum(1), None),
  ("sum_keepdim", lambda x: x.sum((0, 2), keepdim=True), lambda x: x.sum((0, 2), keepdim=True)),
  ("mean", lambda x: x.mean(-1), None),
  ("prod", lambda x: x.prod(1), None),
  ("var", lambda x: x.var(1), None),
  ("std", lambda x: x.std(0, correction=0), lambda x: x.std(0, correction=0)),
  ("max", lambda x: torch.amax(x, 1), lambda x: x.max(1)),
  ("min", lambda x: torch.amin(x, (0, 2)), lambda x: x.min((0, 2))),
  ("logsumexp", lambda x: x.logsumexp(2), lambda x: x.logsumexp(2)),
  ("softmax", lambda x: x.softmax(1), None),
  ("log_softmax", lambda x: x.log_softmax(-1), None),
  ("cumsum", lambda x: x.cumsum(1), None),
  ("cumprod", lambda x: x.cumprod(2), None),
]

@pytest.mark.parametrize("name, torch_fn, tgrad_fn", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reduction(compare_with_torch, name, torch_fn, tgrad_fn):
  compare_with_torch(torch_fn, tgrad_fn, [(2, 3, 4)], low=0.5, high=1.5, atol=TRANSCENDENTAL_ATOL,
                     rtol=TRANSCENDENTAL_RTOL)

def test_max_min_ties_split_evenly_like_amax(compare_with_torch):
  ties = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0], [5.0, 5.0, 5.0]], np.float32)
  compare_with_torch(lambda x: torch.amax(x, 1), lambda x: x.max(1), values=[ties])
  compare_with_torch(lambda x: torch.amin(x, 0), lambda x: x.min(0), values=[ties])
  compare_with_torch(lambda x: x.max(), lambda x: x.max(), values=[ties])

MOVEMENT = [
  ("reshape", lambda x: x.reshape(4, 6), None),
  ("permute", lambda x: x.permute(2, 0, 1), None),
  ("transpose", lambda x: x.transpose(0, 2), None),
  ("expand", lambda x: x[:, :1].expand(2, 5, 4), lambda x: x[:, :1].expand(2, 5, 4)),
  ("pad", lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), lambda x: x.pad(((0, 0), (0, 1), (1, 2)), value=0.5)),
  ("pad_negative", lambda x: F.pad(x, (-1, 2)), lambda x: x.pad((-1, 2))),
  ("shrink", lambda x: x[:, 1:3, 0:2], lambda x: x.shrink((None, (1, 3), (0, 2)))),
  ("flip", lambda x: x.flip(0, 2), lambda x: x.flip((0, 2))),
  ("getitem_negative_step", lambda x: x[1].flip(0)[::2, 1:], lambda x: x[1, ::-2, 1:]),
  ("getitem_steps", lambda x: x[:, ::2, ::3], None),
  ("getitem_none_ellipsis", lambda x: x[None, ..., 1], None),
  ("getitem_tensor", lambda x: x[:, [2, 0, 2]], None),
  ("getitem_two_tensors", lambda x: x[[0, 1, 1], :, [3, 0, 3]], None),
  ("cat", lambda x: torch.cat([x, x * 2, x[:, :1]], 1), lambda x: x.cat(x * 2, x[:, :1], dim=1)),
  ("stack", lambda x: torch.stack([x, x.exp()], 1), lambda x: Tensor.stack(x, x.exp(), dim=1)),
  ("split", lambda x: x.split([1, 2], 1)[1] * 2, lambda x: x.split([1, 2], 1)[1] * 2),
  ("repeat", lambda x: x.repeat(2, 1, 3), None),
  ("squeeze_unsqueeze", lambda x: x[:1].squeeze(0).unsqueeze(-1), None),
  ("flatten", lambda x: x.flatten(1), None),
]

@pytest.mark.parametrize("name, torch_fn, tgrad_fn", MOVEMENT, ids=[m[0] for m in MOVEMENT])
def test_movement(compare_with_torch, name, torch_fn, tgrad_fn):
  compare_with_torch(torch_fn, tgrad_fn, [(2, 3, 4)])

MATMUL = [
  ("2d", [(3, 4), (4, 5)], lambda x, y: x @ y, None),
  ("batched_broadcast", [(2, 1, 3, 4), (3, 4, 2)], lambda x, y: x @ y, None),
  ("vector_matrix", [(4,), (4, 3)], lambda x, y: x @ y, None),
  ("matrix_vector", [(3, 4), (4,)], lambda x, y: x @ y, None),
  ("einsum", [(2, 3, 4), (2, 4, 5)], lambda x, y: torch.einsum("bij,bjk->bik", x, y),
   lambda x, y: Tensor.einsum("bij,bjk->bik", x, y)),
]

@pytest.mark.parametrize("name, shapes, torch_fn, tgrad_fn", MATMUL, ids=[m[0] for m in MATMUL])
def test_matmul(compare_with_torch, name, shapes, torch_fn, tgrad_fn):
  compare_with_torch(torch_fn, tgrad_fn, shapes, atol=1e-5, rtol=1e-5)

def test_composite_chain(compare_with_torch):
  compare_with_torch(lambda x, w, b: ((x @ w + b).relu().softmax(-1) * (x @ w).tanh()).sum(0), None,
                     [(5, 4), (4, 3), (3,)])

# ---- the machinery

def test_backward_with_explicit_gradient():
  x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
  (x * x).backward(Tensor([1.0, 0.5, -1.0]))
  np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0, -6.0])

def test_gradients_accumulate_across_backward_calls():
  values = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
  x, tx = Tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
  for fn in (lambda v: (v * v).sum(), lambda v: v.exp().mean()):
    fn(x).backward()
    fn(tx).backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5)

def test_gradient_returns_without_touching_grad():
  x, y = Tensor([0.5, -1.0], requires_grad=True), Tensor([2.0], requires_grad=True)
  unused = Tensor([[1.0, 2.0]], requires_grad=True)
  loss = (x.exp() * y).sum()
  dx, dy, du = loss.gradient(x, y, unused)
  np.testing.assert_allclose(dx.numpy(), 2 * np.exp([0.5, -1.0]), rtol=1e-6)
  np.testing.assert_allclose(dy.numpy(), [np.exp(0.5) + np.exp(-1.0)], rtol=1e-6)
  assert du.tolist() == [[0.0, 0.0]]
  assert x.grad is None and y.grad is None and unused.grad is None
  assert not dx.requires_grad

def test_detach_stops_the_gradient():
  x = Tensor([1.0, 2.0], requires_grad=True)
  (x * x.detach() * 3).sum().backward()   # d/dx of 3·x·c with c = x held constant
  np.testing.assert_allclose(x.grad.numpy(), [3.0, 6.0])

def test_no_grad_records_nothing():
  x = Tensor([1.0, 2.0], requires_grad=True)
  with Tensor.no_grad():
    y = x * 2
  assert y._ctx is None
  z = (x * 3 + y).sum()   # y is a constant here
  z.backward()
  np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])
  @Tensor.no_grad()
  def inference(t): return (t * t).sum()
  assert inference(x)._ctx is None and Tensor.grad_enabled

def test_requires_grad_false_blocks_the_path():
  x, w = Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0, 4.0], requires_grad=False)
  (x * w).sum().backward()
  assert w.grad is None and x.grad.tolist() == [3.0, 4.0]

def test_shared_input_used_twice(compare_with_torch):
  compare_with_torch(lambda x: x * x.sin() + x.exp().sum(), None, [(4,)], atol=TRANSCENDENTAL_ATOL,
                     rtol=TRANSCENDENTAL_RTOL)

def test_backward_errors():
  x = Tensor([1.0, 2.0], requires_grad=True)
  with pytest.raises(RuntimeError, match=r"\(2,\)"): (x * 2).backward()
  with pytest.raises(RuntimeError, match=r"\(3,\).*\(2,\)"): (x * 2).backward(Tensor([1.0, 1.0, 1.0]))
  with pytest.raises(RuntimeError): (x.detach() * 2).sum().backward()
  assert x.grad is None   # nothing ran

def test_backward_of_a_graph_built_under_no_grad_raises_like_torch():
  """torch: "element 0 of tensors does not require grad and does not have a grad_fn". Here the same RuntimeError
  from backward, and nothing is written into .grad; `gradient` is functional and gives zeros (nothing recorded)."""
  w = Tensor([1.0, 2.0], requires_grad=True)
  with Tensor.no_grad(): loss = (w * w).sum()
  assert loss.requires_grad is False and loss._ctx is None
  with pytest.raises(RuntimeError, match="does not require grad.*no_grad"): loss.backward()
  with pytest.raises(RuntimeError, match="does not require grad"):
    Tensor([1.0, 2.0], requires_grad=False).sum().backward()
  assert loss.gradient(w)[0].tolist() == [0.0, 0.0]   # functional: no recorded op leads from w to loss
  assert w.grad is None
  tw = torch.tensor([1.0, 2.0], requires_grad=True)
  with torch.no_grad(): torch_loss = (tw * tw).sum()
  with pytest.raises(RuntimeError, match="does not require grad"): torch_loss.backward()
  w.sum().backward()   # a leaf that requires grad still works (torch too)
  assert w.grad.tolist() == [1.0, 1.0]

# ---- functional gradients, as tinygrad: `loss.gradient(*tensors)` for tensors made with no requires_grad flag
# (undecided, None), the way tinygrad's op tests take gradients; backward() fills .grad only where requires_grad=True
# when any tensor in the graph says so (else every undecided float tensor, as tinygrad 0.14)

FUNCTIONAL = [(name, torch_fn, tgrad_fn, [(3, 5)], low, high) for name, torch_fn, tgrad_fn, low, high in UNARY] + \
  [(name, fn, None, [shape_x, shape_y], -2, 2) for name, fn, shape_x, shape_y in BINARY] + \
  [(name, torch_fn, tgrad_fn, [(2, 3, 4)], 0.5, 1.5) for name, torch_fn, tgrad_fn in REDUCTIONS] + \
  [(name, torch_fn, tgrad_fn, [(2, 3, 4)], -2, 2) for name, torch_fn, tgrad_fn in MOVEMENT] + \
  [(name, torch_fn, tgrad_fn, shapes, -2, 2) for name, shapes, torch_fn, tgrad_fn in MATMUL]

@pytest.mark.parametrize("name, torch_fn, tgrad_fn, shapes, low, high", FUNCTIONAL, ids=[f[0] for f in FUNCTIONAL])
def test_functional_gradient_of_undecided_inputs(compare_with_torch, name, torch_fn, tgrad_fn, shapes, low, high):
  compare_with_torch(torch_fn, tgrad_fn, shapes, low=low, high=high, atol=TRANSCENDENTAL_ATOL,
                     rtol=TRANSCENDENTAL_RTOL, functional=True)

def test_functional_gradient_through_nn_ops(compare_with_torch):
  compare_with_torch(lambda x, w, b: F.max_pool2d(F.conv2d(x, w, b, padding=1).relu(), 2),
                     lambda x, w, b: x.conv2d(w, b, padding=1).relu().max_pool2d(2), [(2, 3, 6, 6), (4, 3, 3, 3), (4,)],
                     atol=1e-4, rtol=1e-4, functional=True)
  labels = torch.tensor([2, 0, 1])
  compare_with_torch(lambda x: F.cross_entropy(x, labels), lambda x: x.cross_entropy(Tensor(labels.numpy())),
                     [(3, 4)], functional=True)
  compare_with_torch(lambda x: F.layer_norm(x, (5,)), lambda x: x.layernorm(), [(3, 5)], atol=1e-4, rtol=1e-4,
                     functional=True)

def test_gradient_reaches_any_tensor_whatever_its_flag():
  """x requires grad, y is undecided, c said requires_grad=False, h is an intermediate: gradient returns each one's
  gradient, as torch.autograd.grad does when they all require grad; backward fills only x.grad."""
  values = [np.array(v, np.float32) for v in ([0.5, -1.0, 2.0], [1.5, 0.25, -0.5], [2.0, 3.0, -1.0])]
  x, y, c = Tensor(values[0], requires_grad=True), Tensor(values[1]), Tensor(values[2], requires_grad=False)
  tx, ty, tc = (torch.tensor(v, requires_grad=True) for v in values)
  h, th = x * y, tx * ty
  loss, torch_loss = (h.sin() * c + y.exp()).sum(), (th.sin() * tc + ty.exp()).sum()
  for got, want in zip(loss.gradient(x, y, c, h), torch.autograd.grad(torch_loss, (tx, ty, tc, th), retain_graph=True)):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
  assert x.grad is None and y.grad is None and c.grad is None
  loss.backward()
  np.testing.assert_allclose(x.grad.numpy(), torch.autograd.grad(torch_loss, tx)[0].numpy(), rtol=1e-5)
  assert y.grad is None and c.grad is None   # undecided and opted-out tensors get no .grad (tinygrad up to 0.12)

def test_undecided_graph_records_and_optimizer_marks_parameters():
  x, w = Tensor([[1.0, 2.0]]), Tensor([[0.5], [-1.0]])
  loss = (x @ w).square().sum()
  assert loss.requires_grad is None and loss._ctx is not None
  np.testing.assert_allclose(loss.gradient(w)[0].numpy(), [[-3.0], [-6.0]])   # 2·(x·w)·xᵀ, x·w = −1.5
  loss.backward()   # no tensor requires grad: every undecided float tensor in the graph gets .grad (tinygrad 0.14)
  np.testing.assert_allclose(w.grad.numpy(), [[-3.0], [-6.0]])
  np.testing.assert_allclose(x.grad.numpy(), [[-1.5, 3.0]])     # 2·(x·w)·wᵀ
  w.grad = x.grad = None
  from tgrad.nn.optim import SGD
  SGD([w], lr=0.1)
  assert w.requires_grad is True
  (x @ w).square().sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), [[-3.0], [-6.0]])
  assert x.grad is None   # with a tensor that requires grad present, only such tensors are filled (as torch)
  assert x.grad is None

def test_comparison_gradients_are_zero():
  a, b = Tensor([1.0, -2.0, 3.0]), Tensor([2.0, -3.0, 3.0], requires_grad=True)
  da, db = (a < b).sum().gradient(a, b)   # an int loss that depends on a and b only through a comparison
  assert da.tolist() == [0.0, 0.0, 0.0] and db.tolist() == [0.0, 0.0, 0.0] and da.dtype == dtypes.float32
  ta, tb = torch.tensor(a.numpy(), requires_grad=True), torch.tensor(b.numpy(), requires_grad=True)
  fns = [lambda p, q: ((p < q).float() * 3 + (p >= q).float() * p + (p == q).float()).sum(),
         lambda p, q: ((p != q).where(p * q, q) if isinstance(p, Tensor) else torch.where(p != q, p * q, q)).sum()]
  for fn in fns:
    for got, want in zip(fn(a, b).gradient(a, b), torch.autograd.grad(fn(ta, tb), (ta, tb), allow_unused=True)):
      np.testing.assert_allclose(got.numpy(), np.zeros(3) if want is None else want.numpy())

def test_gradient_targets_must_be_float():
  x = Tensor([1, 2, 3])
  with pytest.raises(RuntimeError, match="only float tensors have gradients"): (x * 2.0).sum().gradient(x)

def test_gradient_builds_nothing_for_inputs_off_the_path():
  """Undecided inputs no target depends on get no gradient graph: an op learns which of its inputs need one."""
  x, data = Tensor([1.0, 2.0]), Tensor([3.0, 4.0])
  product = x * data.exp()
  loss = product.sum()
  assert loss.gradient(x)[0].numpy().tolist() == pytest.approx(np.exp([3.0, 4.0]).tolist(), rel=1e-6)
  assert product._ctx.needs_input_grad == [True, False]

def test_ops_on_tensors_that_opted_out_record_nothing():
  """requires_grad=False inputs with scalar operands (made False too, as tinygrad) record no graph; undecided do."""
  constant, undecided = Tensor([1.0, 2.0], requires_grad=False), Tensor([1.0, 2.0])
  assert (constant * 2 + 1)._ctx is None and (constant * 2 + 1).requires_grad is False
  assert (undecided * 2)._ctx is not None and (undecided * 2).requires_grad is None
  assert (constant.detach() * 2).requires_grad is False

def test_inplace_update_under_no_grad_keeps_requires_grad():
  w = Tensor([1.0, 2.0], requires_grad=True)
  with Tensor.no_grad(): w -= 0.5
  assert w.requires_grad is True and w._ctx is None
  (w * w).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), [1.0, 3.0])

# ---- deep graphs: 100,000 lazy ops. Graph building and the autograd walk (tensor.py, function.py) are iterative:
# they run here under Python's default recursion limit, and the gradient's graph (a 50,000-op chain) realizes. The
# forward chain's realize is test_deep_graphs.py's (the same 50,000 multiply-add steps, one kernel, against numpy).

DEEP_CHAIN_STEPS = 50_000          # two ops per step: 100,000 lazy ops
DEEP_SCALE, DEEP_SHIFT = 1.0001, 0.0001
DEFAULT_RECURSION_LIMIT = 1000     # CPython's default

@pytest.fixture(scope="module")
def deep_chain():
  """x = x·1.0001 + 0.0001 repeated on w (requires grad), then backward: built with the default recursion limit."""
  import sys
  saved = sys.getrecursionlimit()
  sys.setrecursionlimit(DEFAULT_RECURSION_LIMIT)
  try:
    w = Tensor([1.0, -2.0], requires_grad=True)
    x = w
    for _ in range(DEEP_CHAIN_STEPS): x = x * DEEP_SCALE + DEEP_SHIFT
    x.sum().backward(retain_graph=True)   # the record is kept, so the test below can walk it
  finally: sys.setrecursionlimit(saved)
  return w, x

@pytest.mark.slow
def test_deep_chain_builds_and_backprops_iteratively(deep_chain):
  w, x = deep_chain
  assert x.shape == (2,) and w.grad is not None and w.grad.shape == (2,)
  depth, node = 0, x   # the recorded graph really is 100,000 ops deep
  while node._ctx is not None:
    node, depth = node._ctx.parents[0], depth + 1
  assert depth == 2 * DEEP_CHAIN_STEPS

@pytest.mark.slow
def test_deep_chain_gradient_realizes(deep_chain):
  w, _ = deep_chain
  growth = float(np.float32(DEEP_SCALE)) ** DEEP_CHAIN_STEPS   # the constant as float32 holds it
  try: got = w.grad.numpy()
  except RecursionError as error:   # re-raised without its ~1000 frames, which pytest would take minutes to format
    raise RecursionError(str(error)) from None
  np.testing.assert_allclose(got, [growth, growth], rtol=1e-3)   # 50,000 float32 roundings
