"""Data-dependent loads (GATHER): Tensor.gather, int-tensor indexing, nn.Embedding, against torch and numpy.

Also what makes a gather a gather: its kernel reads one table element per output element (no reduce over the indexed
axis), it fuses with elementwise consumers, a kernel clamps indices it was never meant to see (memory safety), opts
and search stay legal on it, and it renders to CUDA C that NVRTC compiles (no GPU needed).
"""
import numpy as np
import pytest
import torch
from tgrad import Tensor, nn
from tgrad.device import Buffer, Device
from tgrad.dtype import dtypes
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops
from tgrad.realize import compile_kernel, realize
from tgrad.schedule import create_schedule
from tgrad.codegen import search
from tgrad.codegen.kernel import Kernel, Opt, OptOps, is_gather_load
from tgrad.codegen.linearizer import linearize
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available

DEVICE = "LLVM"
FLOAT32 = dict(rtol=1e-6, atol=1e-6)
GRAD_TOLERANCE = dict(rtol=1e-5, atol=1e-5)
HALF = dict(rtol=1e-3, atol=1e-3)
RANDOM_CASES = 25

def kernels_of(out: Tensor) -> list[Kernel]:
  items = [item for item in create_schedule([out.lazydata]) if item.ast.op is Ops.SINK]
  return [Kernel(item.ast, Device[DEVICE].renderer) for item in items]

def torch_of(x: np.ndarray, grad: bool = False) -> torch.Tensor: return torch.tensor(x, requires_grad=grad)

# ---- forward against torch

@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_gather_every_dim_matches_torch(dim):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((3, 5, 7)).astype(np.float32)
  index_shape = [2, 4, 6]
  index_shape[dim] = 9   # longer than the axis: positions repeat
  index = rng.integers(0, x.shape[dim], index_shape)
  out = Tensor(x).gather(dim, Tensor(index)).numpy()
  np.testing.assert_array_equal(out, torch_of(x).gather(dim, torch.tensor(index)).numpy())

def test_gather_broadcasts_into_elementwise_consumers_in_one_kernel():
  rng = np.random.default_rng(1)
  x, bias = rng.standard_normal((5, 11)).astype(np.float32), rng.standard_normal((1, 3)).astype(np.float32)
  index = rng.integers(0, 11, (5, 3))
  out = (Tensor(x).gather(1, Tensor(index)) * 2 + Tensor(bias)).relu()
  assert len(kernels_of(out)) == 1
  expected = torch.relu(torch_of(x).gather(1, torch.tensor(index)) * 2 + torch_of(bias)).numpy()
  np.testing.assert_allclose(out.numpy(), expected, **FLOAT32)

@pytest.mark.parametrize("index_dtype", [dtypes.int8, dtypes.int32, dtypes.int64])
@pytest.mark.parametrize("table_dtype", [dtypes.float16, dtypes.float32])
@pytest.mark.parametrize("ids_shape", [(4,), (2, 3)])
def test_weight_of_ids(index_dtype, table_dtype, ids_shape):
  rng = np.random.default_rng(2)
  weight = rng.standard_normal((37, 13)).astype(table_dtype.np)
  ids = rng.integers(0, 37, ids_shape).astype(index_dtype.np)
  out = Tensor(weight)[Tensor(ids, dtype=index_dtype)]
  assert out.dtype == table_dtype and out.shape == ids_shape + (13,)
  np.testing.assert_array_equal(out.numpy(), weight[ids.astype(np.int64)])

def test_embedding_times_scale_is_one_kernel_without_a_reduce():
  weight = np.random.default_rng(3).standard_normal((100, 16)).astype(np.float32)
  ids = np.array([[5, 99, 0]], np.int32)
  out = Tensor(weight)[Tensor(ids)] * 3.0
  (kernel,) = kernels_of(out)
  assert not kernel.reduceops and any(is_gather_load(u) for u in kernel.memops)
  np.testing.assert_allclose(out.numpy(), weight[ids] * 3.0, **FLOAT32)

def test_embedding_matches_torch_forward_and_backward():
  rng = np.random.default_rng(4)
  layer = nn.Embedding(23, 6)
  reference = torch.nn.Embedding(23, 6)
  reference.weight.data = torch.tensor(layer.weight.numpy())
  layer.weight.requires_grad = True
  ids = rng.integers(0, 23, (3, 5))
  ids[0, :2] = 7   # repeated rows add their gradients
  upstream = rng.standard_normal((3, 5, 6)).astype(np.float32)
  out = layer(Tensor(ids, dtype=dtypes.int32))
  (out * Tensor(upstream)).sum().backward()
  expected = reference(torch.tensor(ids))
  (expected * torch.tensor(upstream)).sum().backward()
  np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), **FLOAT32)
  np.testing.assert_allclose(layer.weight.grad.numpy(), reference.weight.grad.numpy(), **GRAD_TOLERANCE)

def test_negative_indices_count_from_the_end():
  x = np.arange(60, dtype=np.float32).reshape(6, 10)
  ids = np.array([-1, -6, 0, 5, -3])
  np.testing.assert_array_equal(Tensor(x)[Tensor(ids)].numpy(), x[ids])
  np.testing.assert_array_equal(Tensor(x)[:, Tensor(ids)].numpy(), x[:, ids])
  np.testing.assert_array_equal(Tensor(x)[Tensor(ids), Tensor(-ids - 1)].numpy(), x[ids, -ids - 1])

@pytest.mark.parametrize("index", [
  lambda a, b: (a, b), lambda a, b: (slice(None), a, b), lambda a, b: (a, slice(None), b), lambda a, b: (1, a, 2),
  lambda a, b: (Ellipsis, a), lambda a, b: (a, None, b), lambda a, b: (slice(1, None, 2), a, slice(None, None, -1), b)])
def test_several_tensor_indices_place_dims_as_numpy(index):
  x = np.random.default_rng(5).standard_normal((4, 5, 6, 7)).astype(np.float32)
  a, b = np.array([[0], [3], [-2]]), np.array([1, -1, 2, 0])
  expected = x[index(a, b)]
  out = Tensor(x)[index(Tensor(a), Tensor(b))]
  assert out.shape == expected.shape
  np.testing.assert_array_equal(out.numpy(), expected)

def test_empty_index_and_empty_table_take_the_one_hot_path():
  x = np.ones((4, 3), np.float32)
  assert Tensor(x)[Tensor(np.zeros((0,), np.int32))].numpy().shape == (0, 3)
  assert Tensor(x).gather(0, Tensor(np.zeros((0, 3), np.int32))).numpy().shape == (0, 3)
  assert Tensor(np.ones((0, 3), np.float32))[:, Tensor(np.array([1, 2]))].numpy().shape == (0, 2)

# ---- out-of-range indices: IndexError as torch; a kernel never reads outside its table

@pytest.mark.parametrize("lookup", [lambda t, i: t[i], lambda t, i: t.gather(0, i.reshape(-1, 1).expand(-1, 4)),
                                    lambda t, i: t[:, i - 8]])
def test_out_of_range_indices_raise_index_error(lookup):
  table = Tensor(np.ones((10, 4), np.float32))
  with pytest.raises(IndexError):   # host values: at once
    lookup(table, Tensor(np.array([1, 10], np.int32))).numpy()
  computed = Tensor(np.array([1, 2], np.int32)) * 6   # device values (12 is out of range): at the next realize
  with pytest.raises(IndexError):
    lookup(table, computed).numpy()

def test_embedding_rejects_negative_indices_as_torch():
  with pytest.raises(IndexError): nn.Embedding(5, 2)(Tensor(np.array([-1], np.int32))).numpy()

def test_kernel_clamps_indices_it_was_not_meant_to_see():
  """LazyBuffer.gather without the Tensor-level checks: every loaded index lands in the table (clamped rows)."""
  table = np.arange(40, dtype=np.float32).reshape(10, 4)
  ids = np.array([-5, 3, 10**6, -(2**31), 2**31 - 1, 9], np.int32)
  index = LazyBuffer.from_host(ids, DEVICE).reshape((6, 1)).expand((6, 4))
  out = LazyBuffer.from_host(table, DEVICE).gather(index, 0)
  realize(out)
  np.testing.assert_array_equal(out.base.buffer.copyout().reshape(6, 4), table[np.clip(ids, 0, 9)])

@pytest.mark.parametrize("index_dtype,size,upper_clamp", [(dtypes.int8, 1000, False), (dtypes.int32, 1000, True),
                                                          (dtypes.uint8, 256, False), (dtypes.int64, 7, True)])
def test_clamped_index_range_is_exactly_the_table(index_dtype, size, upper_clamp):
  """The range analysis knows a loaded index only through its clamp: [0, size - 1] where the dtype can reach past it,
  the dtype's own range where it can't (an int8 index into 1000 rows needs no upper clamp)."""
  from tgrad.ops import UOp
  from tgrad.codegen.value_graph import clamp_index
  loaded = UOp(Ops.LOAD, index_dtype, (UOp(Ops.DEFINE_GLOBAL, index_dtype, (), 1), UOp.const(dtypes.index, 0)))
  row = clamp_index(loaded, size)
  assert row.vmin == 0 and row.vmax == (size - 1 if upper_clamp else dtypes.max(index_dtype))
  assert any(u.arg == 1 - size for u in row.toposort() if u.op is Ops.CONST) == upper_clamp

# ---- gradients against torch

@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather_gradient_matches_torch(dim):
  rng = np.random.default_rng(6)
  x = rng.standard_normal((4, 5, 3)).astype(np.float32)
  index_shape = [3, 4, 2]
  index_shape[dim] = 6
  index = rng.integers(0, x.shape[dim], index_shape)
  t = Tensor(x, requires_grad=True)
  (t.gather(dim, Tensor(index)).square() * 0.5).sum().backward()
  reference = torch_of(x, grad=True)
  (reference.gather(dim, torch.tensor(index)).square() * 0.5).sum().backward()
  np.testing.assert_allclose(t.grad.numpy(), reference.grad.numpy(), **GRAD_TOLERANCE)

def test_indexing_gradient_matches_torch_with_repeats_and_half():
  rng = np.random.default_rng(7)
  x = rng.standard_normal((6, 5, 7)).astype(np.float16)
  a, b = np.array([[1, 1, -1]]), np.array([[0], [4], [0]])
  t = Tensor(x, requires_grad=True)
  (t[Tensor(a), :, Tensor(b)] * 3).sum().backward()
  reference = torch_of(x.astype(np.float32), grad=True)
  (reference[torch.tensor(a), :, torch.tensor(b)] * 3).sum().backward()
  assert t.grad.dtype == dtypes.float16
  np.testing.assert_allclose(t.grad.numpy().astype(np.float32), reference.grad.numpy(), **HALF)

# ---- the work is proportional to the output

def test_one_token_of_a_big_table_reads_one_row():
  """A 262144×64 table and 1 index: the kernel iterates over the 64 outputs only (no reduce over the vocabulary) and
  reads one row of the table, one index and writes 64 values."""
  vocab, hidden = 262144, 64
  table = LazyBuffer.loadop(Ops.EMPTY, (vocab, hidden), dtypes.float32, DEVICE)
  realize(table)
  out = Tensor(table)[Tensor(np.array([vocab - 1], np.int32))]
  (kernel,) = kernels_of(out)
  assert not kernel.reduceops and np.prod(kernel.full_shape) == hidden
  assert all(vocab not in st.shape for st in kernel.sts)
  _, bytes_moved = kernel.estimate()
  assert bytes_moved <= 2 * hidden * 4 + 4
  program = linearize(kernel)
  assert sum(u.op is Ops.RANGE for u in program) == 1 and not any(u.op is Ops.REDUCE for u in program)

def test_two_dim_indices_read_rows_not_tables():
  x = Tensor(np.zeros((512, 3, 8), np.float32))
  out = x[Tensor(np.array([[1], [2]])), Tensor(np.array([0, 2]))]
  (kernel,) = kernels_of(out)
  assert not kernel.reduceops and np.prod(kernel.full_shape) == 2 * 2 * 8

# ---- opts, search and CUDA

def gather_kernel(rows: int = 33, hidden: int = 24, tokens: int = 12):
  rng = np.random.default_rng(8)
  table = rng.standard_normal((rows, hidden)).astype(np.float32)
  ids = rng.integers(0, rows, tokens).astype(np.int32)
  table_lb, ids_lb = LazyBuffer.from_host(table, DEVICE), LazyBuffer.from_host(ids, DEVICE)
  realize(table_lb, ids_lb)
  out = table_lb.gather(ids_lb.reshape((tokens, 1)).expand((tokens, hidden)), 0)
  out = out.alu(Ops.MUL, out.const(2.0))
  (item,) = create_schedule([out])
  return item, table[ids] * 2

@pytest.mark.parametrize("opts", [[Opt(OptOps.UPCAST, 1, 4)], [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 8)],
                                  [Opt(OptOps.THREAD, 0, 2), Opt(OptOps.UPCAST, 2, 4)], [Opt(OptOps.PADTO, 0, 16)]])
def test_opts_on_output_axes_stay_correct(opts):
  item, expected = gather_kernel()
  kernel = Kernel(item.ast, Device[DEVICE].renderer)
  for opt in opts: kernel.apply_opt(opt)
  out = Buffer(DEVICE, expected.size, dtypes.float32)
  compile_kernel(DEVICE, kernel)([out, *item.inputs])
  np.testing.assert_array_equal(out.copyout().reshape(expected.shape), expected)

def test_search_verifies_gather_candidates(tmp_path, monkeypatch):
  """Search runs candidates on random inputs (index values in [-16, 16), out of range too) in buffers sized by
  kernel_buffer_specs: the table buffer spans every row, and each candidate must match the unoptimized kernel."""
  monkeypatch.setenv("TGRAD_CACHE", str(tmp_path / "cache.db"))
  monkeypatch.setattr(search, "ACTIONS", [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.THREAD, 0, 2)])
  item, _ = gather_kernel()
  kernel = Kernel(item.ast, Device[DEVICE].renderer)
  specs = search.kernel_buffer_specs(kernel)
  assert sorted(specs[1:]) == sorted([(dtypes.float32, 33 * 24), (dtypes.int32, 12)])   # the table: all 33 rows
  result = search.search_kernel(kernel, 2)
  assert result.stats.timed >= 2 and result.stats.rejected == 0

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")

@needs_nvrtc
@pytest.mark.parametrize("index_dtype,table_dtype", [(dtypes.int32, dtypes.float32), (dtypes.int8, dtypes.float16),
                                                     (dtypes.int64, dtypes.bfloat16)])
@pytest.mark.parametrize("opts", [None, [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 1, 8)]])
def test_cuda_renders_the_data_dependent_load(index_dtype, table_dtype, opts):
  from tgrad.runtime.cuda.renderer import CUDARenderer
  table = LazyBuffer.from_host(np.zeros((1000, 64), table_dtype.np if table_dtype != dtypes.bfloat16 else np.uint16),
                               DEVICE, table_dtype)
  ids = LazyBuffer.from_host(np.zeros((7,), index_dtype.np), DEVICE)
  out = table.gather(ids.reshape((7, 1)).expand((7, 64)), 0)
  out = out.alu(Ops.MUL, out.const(0.5))
  (item,) = [i for i in create_schedule([out]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, CUDARenderer())
  if opts is None: hand_coded_optimizations(kernel)
  for opt in opts or []: kernel.apply_opt(opt)
  source = kernel.renderer.render("gather_check", linearize(kernel))
  assert compile_cuda(source, "sm_90")[:4] == b"\x7fELF"
  # the row is clamped to 999 unless the index dtype can't reach it (int8: the range analysis drops that clamp)
  assert ("999" in source) == (index_dtype != dtypes.int8)

# ---- randomized against numpy

def test_random_gathers_match_numpy():
  rng = np.random.default_rng(1234)
  for _ in range(RANDOM_CASES):
    ndim = int(rng.integers(1, 4))
    shape = tuple(int(s) for s in rng.integers(1, 7, ndim))
    x = rng.standard_normal(shape).astype(np.float32)
    if rng.random() < 0.5:   # torch.gather on a random dim
      dim = int(rng.integers(0, ndim))
      index_shape = tuple(int(rng.integers(1, s + 1)) if d != dim else int(rng.integers(1, 8))
                          for d, s in enumerate(shape))
      index = rng.integers(0, shape[dim], index_shape)
      np.testing.assert_array_equal(Tensor(x).gather(dim, Tensor(index)).numpy(), np.take_along_axis(
        x[tuple(slice(0, s) if d != dim else slice(None) for d, s in enumerate(index_shape))], index, dim))
    else:   # numpy indexing with tensor indices on random dims, the rest slices
      dims = sorted(rng.choice(ndim, int(rng.integers(1, ndim + 1)), replace=False).tolist())
      index_shape = tuple(int(s) for s in rng.integers(1, 4, int(rng.integers(0, 3))))
      items = tuple(rng.integers(-shape[d], shape[d], index_shape) if d in dims else slice(None) for d in range(ndim))
      tensors = tuple(Tensor(i) if isinstance(i, np.ndarray) else i for i in items)
      np.testing.assert_array_equal(Tensor(x)[tensors].numpy(), x[items])
