"""All-gather, reduce-scatter and broadcast of sharded values as collective steps (ops.CollectiveSpec, schedule rule 4,
tgrad/multi/runners.py) on CPU devices LLVM:0..2: each is one COLLECTIVE step (no copy between devices), equal to
numpy and bit for bit to CopyCollectives' lazy copies and kernels, along outermost and inner axes, for float, int and
bool values (-0.0 and NaN payloads kept); a kind's own library (a host stand-in here, NCCL on CUDA) runs each as one
call; a TinyJit replays them. The same on two GPUs at the end (skipped without them)."""
import numpy as np
import pytest
from tgrad import Tensor, TinyJit
from tgrad.dtype import dtypes
from tgrad.multi.collectives import COPY_COLLECTIVES, STEP_COLLECTIVES
from tgrad.multi.runners import CopyCollective, LibraryCollective
from tgrad.ops import Ops
from tgrad.realize import lower_schedule
from tgrad.schedule import create_schedule

TWO = ("LLVM", "LLVM:1")
THREE = ("LLVM", "LLVM:1", "LLVM:2")
BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

NAN_WITH_PAYLOAD = np.array([0x7fc01234], np.uint32).view(np.float32)[0]

def values(rng: np.random.Generator, shape: tuple, dtype) -> np.ndarray:
  """Random values of `dtype`; floats carry a -0.0 and a NaN (float32: with a payload), bits a sum or a select by
  comparison would change."""
  if dtype == np.bool_: return rng.integers(0, 2, shape).astype(np.bool_)
  if np.issubdtype(dtype, np.integer): return rng.integers(-50, 50, shape).astype(dtype)
  a = rng.standard_normal(shape).astype(dtype)
  flat = a.reshape(-1)
  flat[0] = -0.0
  if flat.size > 1: flat[-1] = NAN_WITH_PAYLOAD if dtype == np.float32 else np.nan
  return a

def bits(a: np.ndarray) -> np.ndarray: return a.view(BITS[a.itemsize]) if a.dtype != np.bool_ else a

def shard_arrays(t: Tensor) -> list[np.ndarray]:
  return [Tensor(s, requires_grad=False).numpy() for s in t.lazydata.shards]

def steps_of(t: Tensor) -> list:
  return create_schedule(list(t.lazydata.shards))

def collective_kinds(t: Tensor) -> list[str]: return [s.ast.arg.kind for s in steps_of(t) if s.ast.op is Ops.COLLECTIVE]

def copies_between_devices(t: Tensor) -> list:
  return [s for s in steps_of(t) if s.ast.op is Ops.COPY and s.host_data is None and
          s.bufs[0].device != s.bufs[1].device]

def from_shards(lazy_values) -> list[np.ndarray]: return [Tensor(v, requires_grad=False).numpy() for v in lazy_values]

# ---- all-gather

@pytest.mark.parametrize("devices", [TWO, THREE], ids=["two", "three"])
@pytest.mark.parametrize("shape, axis, dtype", [((6, 5), 0, np.float32), ((4, 6, 5), 1, np.float32),
                                                ((3, 2, 12), 2, np.float32), ((1, 6, 7), 1, np.float32),
                                                ((1, 1, 12), 2, np.float32), ((12,), 0, np.float32),
                                                ((4, 6, 5), 1, np.int32), ((2, 6), 1, np.float16),
                                                ((6, 6), 1, np.bool_)])
def test_all_gather_is_one_step_and_keeps_every_bit(devices, shape, axis, dtype):
  rng = np.random.default_rng(sum(shape) + axis)
  a = values(rng, shape, dtype)
  x = Tensor(a).shard(devices, axis).realize()
  whole = x.shard(devices, None)
  assert collective_kinds(whole) == ["all_gather"] and not copies_between_devices(whole)
  expected = [bits(v) for v in from_shards(COPY_COLLECTIVES.all_gather(x.lazydata.shards, axis))]
  for got, want in zip(shard_arrays(whole), expected):
    np.testing.assert_array_equal(bits(got), bits(a))
    np.testing.assert_array_equal(bits(got), want)

@pytest.mark.parametrize("devices", [TWO, THREE], ids=["two", "three"])
def test_resharding_to_another_axis_gathers_in_one_step_and_slices(devices):
  rng = np.random.default_rng(3)
  a = values(rng, (6, 12, 5), np.float32)
  x = Tensor(a).shard(devices, 1).realize()
  for axis in (0, 1, 2, None) if len(devices) == 2 else (0, None):
    if axis is not None and a.shape[axis] % len(devices): continue
    y = x.shard(devices, axis)
    assert y.lazydata.axis == axis
    assert collective_kinds(y) == ([] if axis == 1 else ["all_gather"])
    np.testing.assert_array_equal(bits(y.numpy()), bits(a))
  # an elementwise op of operands split along two axes gathers the later one in one step
  b = values(rng, (6, 12, 5), np.float32)
  z = x + Tensor(b).shard(devices, 0).realize()
  assert collective_kinds(z) == ["all_gather"]
  np.testing.assert_array_equal(z.numpy(), a + b)

# ---- reduce-scatter

@pytest.mark.parametrize("devices", [TWO, THREE], ids=["two", "three"])
@pytest.mark.parametrize("op, shape, axis", [("sum", (6, 12), 0), ("max", (6, 12), 1), ("sum", (4, 3, 6), 2),
                                             ("sum", (1, 6, 5), 1)])
def test_an_all_reduce_resplit_is_one_reduce_scatter(devices, op, shape, axis):
  rng = np.random.default_rng(len(shape) + axis)
  n = len(devices)
  partial_rows = 2 * n
  a = rng.standard_normal((partial_rows, *shape)).astype(np.float32)
  x = Tensor(a).shard(devices, 0).realize()
  reduced = getattr(x, op)(0)                      # replicated: an all-reduce of each device's partial
  split = reduced.shard(devices, axis)
  assert split.lazydata.axis == axis and collective_kinds(split) == ["reduce_scatter"]
  want = getattr(a, op)(0)
  np.testing.assert_allclose(split.numpy(), want, rtol=1e-5, atol=1e-5)
  # bit for bit the all-reduce's slice (both fold the partials in device order) and CopyCollectives' reduce-scatter
  np.testing.assert_array_equal(bits(split.numpy()), bits(reduced.numpy()))
  partials = [getattr(Tensor(s), op)(0).lazydata for s in x.lazydata.shards]
  reduce_op = Ops.ADD if op == "sum" else Ops.MAX
  parts = from_shards(COPY_COLLECTIVES.reduce_scatter(reduce_op, partials, axis))
  for got, want_part in zip(shard_arrays(split), parts): np.testing.assert_array_equal(bits(got), bits(want_part))

def test_a_realized_all_reduce_is_sliced_not_reduced_again():
  a = np.random.default_rng(4).standard_normal((4, 6)).astype(np.float32)
  reduced = Tensor(a).shard(TWO, 0).sum(0).realize()
  split = reduced.shard(TWO, 0)
  assert collective_kinds(split) == [] and split.lazydata.axis == 0
  np.testing.assert_allclose(split.numpy(), a.sum(0), rtol=1e-5, atol=1e-6)

def test_reduce_scatter_of_a_length_that_does_not_divide_raises():
  a = np.random.default_rng(5).standard_normal((4, 5)).astype(np.float32)
  with pytest.raises(ValueError, match="does not divide"):
    Tensor(a).shard(TWO, 0).sum(0).shard(TWO, 0)
  shards = [Tensor(a, device=d).lazydata for d in TWO]
  with pytest.raises(ValueError, match="does not divide"): STEP_COLLECTIVES.reduce_scatter(Ops.ADD, shards, 1)

# ---- broadcast

@pytest.mark.parametrize("devices, root", [(TWO, 0), (TWO, 1), (THREE, 1), (THREE, 2)])
@pytest.mark.parametrize("shape", [(5, 3), (), (1,)])
def test_replicating_a_value_on_one_of_the_devices_is_one_broadcast(devices, root, shape):
  rng = np.random.default_rng(root + len(shape))
  a = values(rng, shape, np.float32)
  source = Tensor(a, device=devices[root]).realize()
  replicated = source.to(devices)
  [step] = [s for s in steps_of(replicated) if s.ast.op is Ops.COLLECTIVE]
  assert step.ast.arg.kind == "broadcast" and step.ast.arg.root == root
  assert [b.device for b in step.outputs] == [d for d in devices if d != devices[root]]
  assert [b.device for b in step.inputs] == [devices[root]]
  assert replicated.lazydata.shards[root] is source.lazydata   # the root keeps its own buffer
  for got in shard_arrays(replicated): np.testing.assert_array_equal(bits(got), bits(a))

def test_a_value_off_the_device_set_is_copied_to_each():
  a = np.arange(6, dtype=np.float32)
  replicated = Tensor(a, device="LLVM:2").realize().to(TWO)
  assert collective_kinds(replicated) == [] and len(copies_between_devices(replicated)) == 2
  for got in shard_arrays(replicated): np.testing.assert_array_equal(got, a)

# ---- runners: the copy runner and a kind's library

def test_every_kind_lowers_to_the_copy_runner_on_cpu_devices():
  a = np.random.default_rng(6).standard_normal((6, 9)).astype(np.float32)
  x = Tensor(a).shard(THREE, 0).realize()
  for value, kind in ((x.shard(THREE, None), "all_gather"), (x.sum(0).shard(THREE, 0), "reduce_scatter"),
                      (Tensor(a, device=THREE[0]).realize().to(THREE), "broadcast")):
    [step] = [s for s in steps_of(value) if s.ast.op is Ops.COLLECTIVE]
    [lowered] = lower_schedule([step])
    assert isinstance(lowered.runner, CopyCollective) and lowered.runner.name.startswith(kind)

def test_a_kinds_library_runs_each_collective_as_one_call(host_library):
  rng = np.random.default_rng(7)
  a = rng.standard_normal((4, 6)).astype(np.float32)
  x = Tensor(a).shard(TWO, 1).realize()
  gathered = x.shard(TWO, None)
  np.testing.assert_array_equal(gathered.numpy(), a)
  scattered = x.sum(1, keepdim=True).expand(4, 2).contiguous().sum(1).shard(TWO, 0)
  reduced = Tensor(a).shard(TWO, 0).realize().max(0).shard(TWO, 0)
  np.testing.assert_array_equal(reduced.numpy(), a.max(0))
  broadcast = Tensor(a, device="LLVM:1").realize().to(TWO)
  for got in shard_arrays(broadcast): np.testing.assert_array_equal(got, a)
  calls = [call for library in host_library for call in library.calls]
  kinds = [(kind, op, count) for kind, op, _, count, _ in calls]
  assert ("all_gather", None, 12) in kinds and ("reduce_scatter", "max", 3) in kinds and ("broadcast", 1, 24) in kinds
  np.testing.assert_allclose(scattered.numpy(), a.sum(1) * 2, rtol=1e-5, atol=1e-5)

def test_library_collective_calls_nccl_with_each_ranks_buffers():
  """The runner through nccl.NCCLCollectives' own code to the C calls (recorded, not made: no GPU needed): one group,
  one call per rank with that rank's buffers; gathers and broadcasts move bytes, in place on a broadcast's root."""
  from types import SimpleNamespace
  from tgrad.ops import CollectiveSpec
  from tgrad.runtime.cuda.nccl import BYTES_TYPE, NCCL_TYPES, REDUCE_OPS, NCCLCollectives
  calls = []
  class Lib:
    def __getattr__(self, name): return lambda *args: calls.append((name, args)) or 0
  library = SimpleNamespace(lib=Lib(), check=lambda result, call, comm=None: None)
  nccl = NCCLCollectives.__new__(NCCLCollectives)
  nccl.devices, nccl.ordinals = ["gpu0", "gpu1"], (0, 1)
  nccl.comms = SimpleNamespace(library=library, comms=["comm0", "comm1"], graph_launched=False)
  def buffers(first: int, size: int, count: int = 2):
    return [SimpleNamespace(handle=first + i, dtype=dtypes.float32, size=size, device=f"D{i}") for i in range(count)]
  def run(spec, bufs):
    calls.clear()
    LibraryCollective(spec, ["D0", "D1"], nccl, 0)(bufs)
    assert calls[0][0] == "ncclGroupStart" and calls[-1][0] == "ncclGroupEnd"
    return [args for name, args in calls[1:-1]], {name for name, _ in calls[1:-1]}
  float32 = NCCL_TYPES["float32"]
  args, names = run(CollectiveSpec("all_gather"), buffers(100, 12) + buffers(200, 6))
  assert names == {"ncclAllGather"} and args == [(200, 100, 24, BYTES_TYPE, "comm0", 0), (201, 101, 24, BYTES_TYPE,
                                                                                         "comm1", 0)]
  args, names = run(CollectiveSpec("reduce_scatter", Ops.MAX), buffers(100, 3) + buffers(200, 6))
  assert names == {"ncclReduceScatter"} and args == [(200, 100, 3, float32, REDUCE_OPS["max"], "comm0", 0),
                                                     (201, 101, 3, float32, REDUCE_OPS["max"], "comm1", 0)]
  args, names = run(CollectiveSpec("broadcast", root=1), buffers(100, 5, 1) + buffers(200, 5, 1))
  assert names == {"ncclBroadcast"} and args == [(100, 100, 20, BYTES_TYPE, 1, "comm0", 0),
                                                 (200, 200, 20, BYTES_TYPE, 1, "comm1", 0)]

def test_a_jitted_gather_replays_with_new_inputs():
  rng = np.random.default_rng(8)
  @TinyJit
  def gather_and_scale(x: Tensor) -> Tensor: return (x.shard(THREE, None) * 2).realize()
  for _ in range(4):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    got = gather_and_scale(Tensor(a).shard(THREE, 1).realize())
    for part in shard_arrays(got): np.testing.assert_array_equal(part, a * 2)
  kinds = [ins.runner.name for ins in gather_and_scale.captured.instructions if len(ins.devices) > 1]
  assert kinds and all(name.startswith("all_gather") for name in kinds)

# ---- on two GPUs (skipped with fewer): NCCL's calls give the bits of the copy path

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.bool_])
def test_all_gather_and_broadcast_on_two_gpus_keep_every_bit(dtype, two_gpus):
  gpus = two_gpus
  rng = np.random.default_rng(9)
  for shape, axis in (((64, 33), 0), ((5, 64, 3), 1)):
    a = values(rng, shape, dtype)
    whole = Tensor(a, device=gpus[0]).shard(gpus, axis).realize().shard(gpus, None)
    [step] = [s for s in steps_of(whole) if s.ast.op is Ops.COLLECTIVE]
    [lowered] = lower_schedule([step])
    assert isinstance(lowered.runner, LibraryCollective) and lowered.runner.per_device
    for got in shard_arrays(whole): np.testing.assert_array_equal(bits(got), bits(a))
  a = values(rng, (7, 9), dtype)
  replicated = Tensor(a, device=gpus[1]).realize().to(gpus)
  assert collective_kinds(replicated) == ["broadcast"]
  for got in shard_arrays(replicated): np.testing.assert_array_equal(bits(got), bits(a))

@pytest.mark.gpu
@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce_scatter_on_two_gpus_equals_the_copy_path(op, two_gpus):
  gpus = two_gpus
  a = np.random.default_rng(10).standard_normal((4, 6, 40)).astype(np.float32)
  for axis in (0, 1):
    split = getattr(Tensor(a, device=gpus[0]).shard(gpus, 0).realize(), op)(0).shard(gpus, axis)
    assert collective_kinds(split) == ["reduce_scatter"]
    cpu = getattr(Tensor(a).shard(TWO, 0).realize(), op)(0).shard(TWO, axis)   # the copy runner's bits
    np.testing.assert_array_equal(bits(split.numpy()), bits(cpu.numpy()))

@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [1, 0])
def test_jitted_collectives_on_two_gpus_are_captured_into_each_gpus_graph(graphs, two_gpus):
  from tgrad.helpers import Context
  gpus = two_gpus
  rng = np.random.default_rng(11)
  with Context(CUDA_GRAPH=graphs):
    @TinyJit
    def step(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
      return (x.shard(gpus, None) * 2).realize(), y.sum(0).shard(gpus, 0).realize()
    for _ in range(4):
      a, b = rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
      gathered, scattered = step(Tensor(a, device=gpus[0]).shard(gpus, 1).realize(),
                                 Tensor(b, device=gpus[0]).shard(gpus, 0).realize())
      for part in shard_arrays(gathered): np.testing.assert_array_equal(part, a * 2)
      np.testing.assert_array_equal(scattered.numpy(), b[:2].sum(0) + b[2:].sum(0))
  names = [ins.runner.name for ins in step.captured.instructions if isinstance(ins.runner, LibraryCollective)]
  assert any(n.startswith("all_gather") for n in names) and any(n.startswith("reduce_scatter") for n in names)
  if graphs: assert len(step.captured.runners) == 2   # one graph runner per GPU, the collectives inside
