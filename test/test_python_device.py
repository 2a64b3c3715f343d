"""The PYTHON device (tgrad/runtime/python/): a third backend written against the plug-in interface alone, running
elementwise, reduce, matmul, movement and a small model's forward against numpy, on odd sizes, broadcasting, 0-d and
size-1 tensors. Sizes stay small: every element of every kernel is interpreted in Python.
"""
import numpy as np
import pytest
from tgrad import Tensor, TinyJit, Variable, dtypes
from tgrad.backend import Backend, DeviceTraits, register_backend, unregister_backend
from tgrad.custom import Launch, SourceKernel
from tgrad.device import Buffer, Compiled, Device

DEVICE = "PYTHON"
RNG = np.random.default_rng(7)
ATOL, RTOL = 1e-6, 1e-5   # float32 arithmetic

def rand(*shape, low=-2.0, high=2.0) -> np.ndarray: return RNG.uniform(low, high, shape).astype(np.float32)
def on_device(x: np.ndarray) -> Tensor: return Tensor(x, device=DEVICE)

def check(got: Tensor, want: np.ndarray, atol=ATOL, rtol=RTOL) -> None:
  assert got.device == DEVICE
  np.testing.assert_allclose(got.numpy(), want, atol=atol, rtol=rtol)
  assert got.numpy().shape == want.shape

@pytest.mark.parametrize("shape_a,shape_b", [((3, 5), (3, 5)), ((4, 1), (1, 7)), ((), (2, 3)), ((1,), (1,))])
def test_elementwise_with_broadcasting(shape_a, shape_b):
  a, b = rand(*shape_a), rand(*shape_b, low=0.5, high=2.0)
  x, y = on_device(a), on_device(b)
  check(x + y * 3 - 1, a + b * 3 - 1)
  check(x / y, a / b)
  check(x.maximum(y), np.maximum(a, b))
  check((x < y).where(x, -y), np.where(a < b, a, -b))
  check(y.sqrt() + y.log() + x.exp(), np.sqrt(b) + np.log(b) + np.exp(a), rtol=1e-5)
  check(x.sin(), np.sin(a), atol=1e-6)

def test_integer_and_bool_semantics():
  a = np.array([7, -7, 5, -5, 2**31 - 1], np.int32)
  b = np.array([2, 2, -3, -3, 1], np.int32)
  x, y = on_device(a), on_device(b)
  np.testing.assert_array_equal((x // y).numpy(), a // b)   # floor division, as numpy
  np.testing.assert_array_equal((x % y).numpy(), a % b)
  np.testing.assert_array_equal((x + y).numpy(), (a.astype(np.int64) + b).astype(np.int32))   # wraps
  np.testing.assert_array_equal(((x > 0) & (y > 0)).numpy(), (a > 0) & (b > 0))
  np.testing.assert_array_equal((x ^ y).numpy(), a ^ b)

def test_casts_and_narrow_floats():
  a = np.array([-2.75, -0.5, 0.0, 1.5, 3.99, 100.25], np.float32)
  x = on_device(a)
  np.testing.assert_array_equal(x.cast(dtypes.int32).numpy(), np.trunc(a).astype(np.int32))
  np.testing.assert_array_equal(x.cast(dtypes.bool).numpy(), a != 0)
  np.testing.assert_array_equal(x.cast(dtypes.float16).numpy(), a.astype(np.float16))
  bf16 = x.cast(dtypes.bfloat16).cast(dtypes.float32).numpy()
  np.testing.assert_allclose(bf16, a, rtol=2 ** -8)   # bfloat16 keeps 8 significant bits
  half = on_device(a.astype(np.float16))
  np.testing.assert_allclose((half * half).numpy(), (a.astype(np.float16) * a.astype(np.float16)), rtol=1e-3)
  np.testing.assert_array_equal(x.bitcast(dtypes.int32).numpy(), a.view(np.int32))

@pytest.mark.parametrize("shape,axis", [((5, 7), 1), ((5, 7), 0), ((3, 4, 5), (0, 2)), ((6,), None), ((), None)])
def test_reduces(shape, axis):
  a = rand(*shape)
  x = on_device(a)
  check(x.sum(axis), a.sum(axis), atol=1e-5)
  check(x.max(axis), a.max(axis))
  check(x.mean(axis), a.mean(axis), atol=1e-5)

def test_softmax_and_cumulative():
  a = rand(4, 9)
  e = np.exp(a - a.max(1, keepdims=True))
  check(on_device(a).softmax(1), e / e.sum(1, keepdims=True), atol=1e-6)
  check(on_device(a).cumsum(1), np.cumsum(a, 1), atol=1e-5)

@pytest.mark.parametrize("shape_a,shape_b", [((3, 5), (5, 4)), ((1, 7), (7, 1)), ((2, 3, 4), (4, 5)), ((6,), (6, 3))])
def test_matmul(shape_a, shape_b):
  a, b = rand(*shape_a), rand(*shape_b)
  check(on_device(a) @ on_device(b), a @ b, atol=1e-5)

def test_movement():
  a = rand(2, 3, 4)
  x = on_device(a)
  check(x.reshape(6, 4).permute(1, 0), a.reshape(6, 4).T)
  check(x[:, 1:, ::2], a[:, 1:, ::2])
  check(x.flip(2), a[:, :, ::-1])
  check(x.pad(((0, 0), (1, 2), (0, 1))), np.pad(a, ((0, 0), (1, 2), (0, 1))))
  check(x[:, :1].expand(2, 5, 4), np.broadcast_to(a[:, :1], (2, 5, 4)))
  check(Tensor.cat(x, x * 2, dim=1), np.concatenate([a, a * 2], 1))
  check(x.contiguous().reshape(24), a.reshape(24))

def test_gather_and_arange():
  table, ids = rand(10, 3), np.array([[4, 0], [9, 9], [1, 2]], np.int32)
  check(on_device(table)[on_device(ids)], table[ids])
  np.testing.assert_array_equal(Tensor.arange(2, 17, 3, device=DEVICE).numpy(), np.arange(2, 17, 3))

def test_small_model_forward():
  x, w1, b1, w2, b2 = rand(4, 6), rand(6, 8), rand(8), rand(8, 3), rand(3)
  hidden = np.maximum(x @ w1 + b1, 0)
  logits = hidden @ w2 + b2
  want = np.exp(logits - logits.max(1, keepdims=True))
  got = ((on_device(x) @ on_device(w1) + on_device(b1)).relu() @ on_device(w2) + on_device(b2)).softmax(1)
  check(got, want / want.sum(1, keepdims=True), atol=1e-5)

def test_backward():
  a, b = rand(3, 4), rand(4, 2)
  x, y = Tensor(a, device=DEVICE, requires_grad=True), Tensor(b, device=DEVICE, requires_grad=True)
  (x @ y).sum().backward()
  check(x.grad, np.ones((3, 2), np.float32) @ b.T, atol=1e-5)
  check(y.grad, a.T @ np.ones((3, 2), np.float32), atol=1e-5)

def test_copies_to_and_from_the_host_device():
  a = rand(5, 3)
  x = Tensor(a).to(DEVICE) * 2
  check(x, a * 2)
  back = x.to("LLVM") + 1
  assert back.device == "LLVM"
  np.testing.assert_allclose(back.numpy(), a * 2 + 1, atol=ATOL)

def test_jit_replays_on_the_plain_runner():
  step = TinyJit(lambda x, y: (x * y + 1).sum(1))
  for _ in range(3):
    a, b = rand(3, 4), rand(3, 4)
    check(step(on_device(a), on_device(b)), (a * b + 1).sum(1), atol=1e-5)

def test_symbolic_size_and_scalar_parameters():
  """One kernel for every length (a DEFINE_VAR) and every float constant (a scalar parameter passed as its bits)."""
  a = rand(7)
  x, n = on_device(a).realize(), Variable("n", 1, 7)
  for size, scale in ((2, 1.5), (7, -0.3), (5, 2.0 ** -20)):
    got = (x[:n.bind(size)] * scale).sum()
    np.testing.assert_allclose(got.numpy(), (a[:size] * np.float32(scale)).sum(), atol=1e-5, rtol=RTOL)

def test_python_source_kernel_is_its_custom_language():
  source = ("def axpy(out, x, y, scale, core):\n"
            "  o, a, b = out.view(np.float32), x.view(np.float32), y.view(np.float32)\n"
            "  for i in range(len(o)): o[i] = scale * a[i] + b[i]\n")
  kernel = SourceKernel("axpy", "python", source, "axpy", lambda *shapes: Launch((1,), scalars=(3,)), ((4,), (4,)),
                        (4,))
  a, b = rand(4), rand(4)
  bufs = [Buffer(DEVICE, 4, dtypes.float32), Buffer(DEVICE, 4, dtypes.float32).copyin(a),
          Buffer(DEVICE, 4, dtypes.float32).copyin(b)]
  kernel.runner(DEVICE)(bufs)
  np.testing.assert_allclose(bufs[0].copyout(), 3 * a + b, rtol=RTOL)
  with pytest.raises(ValueError, match="is python source: it runs on PYTHON, not LLVM"): kernel.runner("LLVM")

def test_a_device_registered_by_a_test_runs_kernels():
  """A device defined here, from the contract's parts alone, is usable by name as soon as it is registered."""
  from tgrad.runtime.python.renderer import PythonRenderer
  from tgrad.runtime.python.runtime import PythonAllocator, PythonCompiler, PythonProgram
  class ToyRenderer(PythonRenderer): device = "TOY"
  def start() -> Compiled: return Compiled("TOY", PythonAllocator(), PythonCompiler(), ToyRenderer(), PythonProgram)
  register_backend(Backend("TOY", start, DeviceTraits(has_local=False), aliases=("PLAYGROUND",)))
  try:
    a, b = rand(3, 4), rand(4, 2)
    got = (Tensor(a, device="playground:0") @ Tensor(b, device="toy")).relu()
    assert got.device == "TOY" and Device["toy"].name == "TOY"
    np.testing.assert_allclose(got.numpy(), np.maximum(a @ b, 0), atol=1e-5)
  finally: unregister_backend("TOY")
  with pytest.raises(ValueError, match="unknown device 'toy'"): Tensor([1.0], device="toy")
