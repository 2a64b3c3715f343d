"""NCCL collectives and copies between GPUs (tgrad/runtime/cuda/nccl.py, peer.py, runtime.py's one device per GPU).

Without a GPU: the dtype, op and result tables against the nccl.h the wheel ships, library discovery with fake paths,
error text from the real library (`pip install nvidia-nccl-cu13`; those tests skip without it), argument errors.
Tests marked `gpu` need an NVIDIA GPU and pycuda (test/conftest.py skips them otherwise); the collective and peer-copy
tests also need two GPUs and skip with fewer. Each collective is checked against numpy on random sizes and dtypes.
"""
import ctypes, ctypes.util, os, re
import numpy as np
import pytest
from tgrad.dtype import dtypes
from tgrad.runtime.cuda import nccl

gpu = pytest.mark.gpu
RNG = np.random.default_rng(30)

def installed_header() -> str:
  """nccl.h of the installed wheel, or skip."""
  for path in nccl.library_candidates()[:-1]:
    header = os.path.join(os.path.dirname(os.path.dirname(path)), "include", "nccl.h")
    if os.path.exists(header): return open(header).read()
  pytest.skip("the nvidia-nccl wheel (with include/nccl.h) is not installed")

def enum_values(header: str, names: list[str]) -> dict[str, int]:
  """The values of those of `names` that the header defines (an older NCCL's header lacks newer result codes)."""
  found = {name: re.search(rf"\b{name}\s*=\s*(\d+)", header) for name in names}
  return {name: int(match.group(1)) for name, match in found.items() if match is not None}

def loaded_library() -> nccl.NCCLLibrary:
  try: return nccl.nccl()
  except nccl.NCCLUnavailable as error: pytest.skip(f"NCCL is not installed: {error}")

# ---- no GPU needed

def test_dtype_table_matches_nccl_h():
  header = installed_header()
  nccl_name = {"int8": "ncclInt8", "uint8": "ncclUint8", "int32": "ncclInt32", "uint32": "ncclUint32",
               "int64": "ncclInt64", "uint64": "ncclUint64", "float16": "ncclFloat16", "float32": "ncclFloat32",
               "float64": "ncclFloat64", "bfloat16": "ncclBfloat16", "bool": "ncclUint8"}
  values = enum_values(header, sorted(set(nccl_name.values())))
  assert set(nccl.NCCL_TYPES) == set(nccl_name)
  for dtype_name, enum_name in nccl_name.items():
    op = "max" if dtype_name == "bool" else "sum"
    assert nccl.nccl_type(getattr(dtypes, dtype_name), op) == values[enum_name], dtype_name
    assert nccl.itemsize(getattr(dtypes, dtype_name)) == getattr(dtypes, dtype_name).itemsize
  ops = enum_values(header, ["ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"])
  assert {op: nccl.reduce_op(op) for op in nccl.REDUCE_OPS} == {op: ops["nccl" + op.capitalize()]
                                                                 for op in nccl.REDUCE_OPS}
  results = enum_values(header, list(nccl.RESULT_NAMES.values()))
  assert "ncclSuccess" in results and "ncclInvalidArgument" in results
  assert all(nccl.RESULT_NAMES[value] == name for name, value in results.items())
  assert f"#define NCCL_UNIQUE_ID_BYTES {nccl.UNIQUE_ID_BYTES}" in header
  assert ctypes.sizeof(nccl.UniqueId) == nccl.UNIQUE_ID_BYTES

@pytest.mark.parametrize("dtype, op", [(dtypes.int16, "sum"), (dtypes.uint16, "max"), (dtypes.bool, "sum"),
                                       (dtypes.bool, "avg")])
def test_reductions_nccl_lacks_are_type_errors(dtype, op):
  with pytest.raises(TypeError, match=dtype.name): nccl.nccl_type(dtype, op)

def test_unknown_op_and_dtype():
  with pytest.raises(ValueError, match="'mean'"): nccl.reduce_op("mean")
  with pytest.raises(TypeError, match="complex64"): nccl.itemsize("complex64")

def test_candidates_put_the_wheel_first_and_the_loader_last(tmp_path):
  found = nccl.library_candidates([str(tmp_path / "a"), str(tmp_path / "b")])
  assert found == [str(tmp_path / "a" / "lib" / nccl.LIBRARY_NAME), str(tmp_path / "b" / "lib" / nccl.LIBRARY_NAME),
                   nccl.LIBRARY_NAME]

def test_missing_and_broken_libraries_name_every_path(tmp_path):
  broken = tmp_path / "broken" / "lib" / nccl.LIBRARY_NAME
  broken.parent.mkdir(parents=True)
  broken.write_bytes(b"not an ELF file")
  missing = tmp_path / "missing" / "lib" / nccl.LIBRARY_NAME
  with pytest.raises(nccl.NCCLUnavailable) as raised: nccl.load([str(missing), str(broken)])
  message = str(raised.value)
  assert str(missing) in message and "no such file" in message and str(broken) in message
  assert nccl.LIBRARY_NAME in message and "multi-gpu" in message

def test_a_library_without_nccl_symbols_is_refused():
  libc = ctypes.util.find_library("c")
  if libc is None: pytest.skip("no C library name to load")
  with pytest.raises(nccl.NCCLUnavailable, match="has no nccl"): nccl.load([libc])

def test_real_library_version_and_error_text():
  library = loaded_library()
  major, minor, patch = library.version
  assert major == 2 and minor >= 0 and patch >= 0
  header_version = re.search(r"#define NCCL_VERSION_CODE (\d+)", installed_header())
  if header_version and library.path in nccl.library_candidates()[:-1]:
    assert major * 10000 + minor * 100 + patch == int(header_version.group(1))
  assert "invalid argument" in library.error_text(4)
  with pytest.raises(nccl.NCCLError, match=r"ncclBroadcast failed: ncclInvalidUsage \(5\): invalid usage") as raised:
    library.check(5, "ncclBroadcast")
  assert raised.value.code == 5 and raised.value.call == "ncclBroadcast"
  library.check(nccl.SUCCESS, "ncclAllReduce")   # success raises nothing

def test_unique_ids_differ():
  library = loaded_library()
  first, second = library.unique_id().to_bytes(), library.unique_id().to_bytes()
  assert len(first) == nccl.UNIQUE_ID_BYTES and first != second
  assert nccl.UniqueId.from_bytes(first).to_bytes() == first
  with pytest.raises(ValueError, match="128 bytes, got 5"): nccl.UniqueId.from_bytes(b"short")

class FakeDevice:
  def __init__(self, ordinal): self.ordinal = ordinal

def test_device_sets_are_checked_before_nccl_is_asked():
  with pytest.raises(ValueError, match="at least one"): nccl.NCCLCollectives([])
  with pytest.raises(ValueError, match=r"GPUs \[0, 1, 0\]"): nccl.NCCLCollectives([FakeDevice(i) for i in (0, 1, 0)])

def test_communicators_without_a_gpu_fail_with_ncclcomminitall_named():
  loaded_library()
  from conftest import cuda_usable
  if cuda_usable(): pytest.skip("a GPU is present: the communicators would be made")
  with pytest.raises(nccl.NCCLError, match=r"ncclCommInitAll \(GPUs \[0, 1\]\) failed"):
    nccl.NCCLCollectives([FakeDevice(0), FakeDevice(1)])

def test_exit_closes_graphs_before_destroying_communicators_and_never_hangs(monkeypatch):
  """ncclCommDestroy waits for every CUDA graph that holds a captured collective: at exit the graphs go first, and a
  destroy that still does not return is left behind after the time limit instead of hanging the exit."""
  import threading, time
  from tgrad.runtime.cuda import graph
  order, release = [], threading.Event()
  class FakeCommunicators:
    ordinals, comms = (0, 1), [1, 2]
    def destroy(self):
      order.append("destroy")
      release.wait(30)   # a communicator whose graphs live on: never returns by itself
  class FakeCapture:
    def close(self): order.append("capture closed")
  capture = FakeCapture()
  monkeypatch.setattr(graph, "close_every_graph", lambda: order.append("graphs closed"))
  monkeypatch.setattr(nccl, "_communicators", {(0, 1): FakeCommunicators()})
  monkeypatch.setattr(nccl, "_live_captures", [capture])
  monkeypatch.setattr(nccl, "EXIT_DESTROY_SECONDS", 0.2)
  start = time.perf_counter()
  nccl._release_at_exit()
  release.set()
  assert time.perf_counter() - start < 5
  assert order == ["graphs closed", "capture closed", "destroy"]

def test_an_eager_collective_after_a_graph_launch_waits_for_the_gpus_first():
  """NCCL's graph mixing is off (it blocked a tensor-parallel graph's launch): so a collective queued eagerly after a
  graph holding captured collectives of the same communicators was launched waits for the GPUs first, once."""
  from types import SimpleNamespace
  assert os.environ.get(nccl.GRAPH_MIXING_SETTING[0]) is not None or not nccl.is_available()
  events = []
  class Lib:
    def __getattr__(self, name): return lambda *args: events.append(name) or 0
  class FakeGPU:
    def __init__(self, ordinal): self.ordinal = ordinal
    def synchronize(self): events.append(f"synchronize {self.ordinal}")
  collectives = nccl.NCCLCollectives.__new__(nccl.NCCLCollectives)
  collectives.devices, collectives.ordinals = [FakeGPU(0), FakeGPU(1)], (0, 1)
  library = SimpleNamespace(lib=Lib(), check=lambda result, call, comm=None: None)
  collectives.comms = SimpleNamespace(library=library, comms=["comm0", "comm1"], graph_launched=False)
  captured = nccl.CapturedCollective(collectives.devices, [], collectives.comms)
  captured.graphs, captured.executables = [1], [SimpleNamespace(launch=lambda: events.append("graph"))]
  captured.devices = [SimpleNamespace(context=SimpleNamespace(enter=lambda: None, leave=lambda: None))]
  collectives.all_reduce([10, 11], "sum", "float32", 4)
  assert "synchronize 0" not in events
  captured.launch()
  events.clear()
  collectives.all_reduce([10, 11], "sum", "float32", 4)
  assert events[:3] == ["synchronize 0", "synchronize 1", "ncclGroupStart"]
  events.clear()
  collectives.all_reduce([10, 11], "sum", "float32", 4, streams=[5, 6])   # a capture's queueing never waits
  collectives.all_reduce([10, 11], "sum", "float32", 4)
  assert not any(event.startswith("synchronize") for event in events)
  captured.graphs, captured.executables = [], None

def test_backend_says_whether_collectives_exist():
  from tgrad.runtime.cuda import collectives_available
  assert collectives_available() == nccl.is_available()

# ---- one or two GPUs

@pytest.fixture(scope="module")
def two_gpus():
  from tgrad.runtime.cuda.runtime import create_device, device_count
  if device_count() < 2: pytest.skip(f"needs 2 GPUs, the driver sees {device_count()}")
  loaded_library()
  return [create_device(0), create_device(1)]

def upload(device, data: np.ndarray) -> int:
  handle = device.allocator.alloc(max(data.nbytes, 1))
  if data.nbytes: device.allocator.copyin(handle, memoryview(np.ascontiguousarray(data).view(np.uint8).reshape(-1)))
  return handle

def download(device, handle, count: int, np_dtype) -> np.ndarray:
  out = np.empty(count, np_dtype)
  if out.nbytes: device.allocator.copyout(memoryview(out.view(np.uint8)), handle)
  return out

def random_values(dtype, count: int) -> np.ndarray:
  if dtype == dtypes.bfloat16:   # bfloat16 travels as its bits; small integers are exact in it
    return (RNG.integers(-64, 64, count).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
  if dtype.is_int: return RNG.integers(0 if dtype.is_unsigned else -100, 100, count).astype(dtype.np)
  return RNG.standard_normal(count).astype(dtype.np)

def as_numbers(values: np.ndarray, dtype) -> np.ndarray:
  return (values.astype(np.uint32) << 16).view(np.float32) if dtype == dtypes.bfloat16 else values

CASES = [(dtypes.float32, 1), (dtypes.float32, 1000003), (dtypes.float16, 4097), (dtypes.bfloat16, 333),
         (dtypes.int32, 77), (dtypes.int64, 5), (dtypes.uint8, 257), (dtypes.float64, 12345)]

@gpu
def test_one_device_per_ordinal(two_gpus):
  from tgrad.runtime.cuda.driver import current_context
  from tgrad.runtime.cuda.runtime import create_device, guest_context
  first, second = two_gpus
  assert create_device(first.ordinal) is first and first.context.handle != second.context.handle
  assert first.context.resident != second.context.resident
  guest = second if first.context.resident else first
  assert guest_context(guest.name) is guest.context
  resident = first if guest is second else second
  assert current_context() == resident.context.handle   # a guest's calls leave the resident context current
  with pytest.raises(ValueError, match="does not exist"): create_device(64)

@gpu
@pytest.mark.parametrize("dtype, count", CASES)
@pytest.mark.parametrize("op", ["sum", "max"])
def test_all_reduce(two_gpus, dtype, count, op):
  from tgrad.runtime.cuda.driver import current_context
  if op == "sum" and dtype == dtypes.uint8: dtype = dtypes.int32   # uint8 sums wrap; its max is tested
  values = [random_values(dtype, count) for _ in two_gpus]
  handles = [upload(device, v) for device, v in zip(two_gpus, values)]
  before = current_context()
  nccl.NCCLCollectives(two_gpus).all_reduce(handles, op, dtype, count)
  assert current_context() == before
  numbers = [as_numbers(v, dtype) for v in values]
  expected = (numbers[0] + numbers[1]).astype(numbers[0].dtype) if op == "sum" else np.maximum(*numbers)
  tolerance = {dtypes.float16: 1e-3, dtypes.bfloat16: 1e-2}.get(dtype, 1e-7 if dtype.is_float else 0)
  for device, handle in zip(two_gpus, handles):
    got = as_numbers(download(device, handle, count, dtype.np), dtype)
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=0)

@gpu
@pytest.mark.parametrize("dtype, count", CASES[:5])
def test_all_gather_reduce_scatter_broadcast(two_gpus, dtype, count):
  collectives, n = nccl.NCCLCollectives(two_gpus), len(two_gpus)
  parts = [random_values(dtype, count) for _ in two_gpus]
  inputs = [upload(device, p) for device, p in zip(two_gpus, parts)]
  gathered = [upload(device, np.zeros(count * n, dtype.np)) for device in two_gpus]
  collectives.all_gather(inputs, gathered, dtype, count)
  for device, handle in zip(two_gpus, gathered):
    np.testing.assert_array_equal(download(device, handle, count * n, dtype.np), np.concatenate(parts))
  whole = [random_values(dtype, count * n) for _ in two_gpus]
  sources = [upload(device, w) for device, w in zip(two_gpus, whole)]
  scattered = [upload(device, np.zeros(count, dtype.np)) for device in two_gpus]
  collectives.reduce_scatter(sources, scattered, "max", dtype, count)
  expected = np.maximum(*[as_numbers(w, dtype) for w in whole])
  for rank, (device, handle) in enumerate(zip(two_gpus, scattered)):
    got = as_numbers(download(device, handle, count, dtype.np), dtype)
    np.testing.assert_array_equal(got, expected[rank * count:(rank + 1) * count])
  collectives.broadcast(inputs, dtype, count, root=1)
  for device, handle in zip(two_gpus, inputs):
    np.testing.assert_array_equal(download(device, handle, count, dtype.np), parts[1])

@gpu
def test_captured_all_reduce_replays_with_new_inputs(two_gpus):
  count, collectives = 100003, nccl.NCCLCollectives(two_gpus)
  inputs = [upload(device, np.zeros(count, np.float32)) for device in two_gpus]
  outputs = [upload(device, np.zeros(count, np.float32)) for device in two_gpus]
  captured = collectives.capture(lambda streams: collectives.all_reduce(inputs, "sum", dtypes.float32, count,
                                                                        outputs=outputs, streams=streams))
  for _ in range(3):   # new values in the same buffers, then one replay
    values = [RNG.standard_normal(count).astype(np.float32) for _ in two_gpus]
    for device, handle, v in zip(two_gpus, inputs, values):
      device.allocator.copyin(handle, memoryview(v.view(np.uint8)))
    captured.launch()
    for device, handle in zip(two_gpus, outputs):
      np.testing.assert_allclose(download(device, handle, count, np.float32), values[0] + values[1], rtol=1e-7)
  captured.close()

@gpu
def test_captured_collective_as_a_child_node(two_gpus):
  from tgrad.runtime.cuda.graph import CUDAGraph
  count, collectives = 4099, nccl.NCCLCollectives(two_gpus)
  values = [RNG.standard_normal(count).astype(np.float32) for _ in two_gpus]
  buffers = [upload(device, v) for device, v in zip(two_gpus, values)]
  captured = collectives.capture(lambda streams: collectives.all_reduce(buffers, "max", dtypes.float32, count,
                                                                        streams=streams))
  graphs = []
  for rank, device in enumerate(two_gpus):
    device.context.enter()
    try: graphs.append(CUDAGraph([captured.child(rank)]))
    finally: device.context.leave()
  for device, graph in zip(two_gpus, graphs):   # every device's graph is queued before any is waited for
    device.context.enter()
    try: graph.launch()
    finally: device.context.leave()
  for device, handle in zip(two_gpus, buffers):
    np.testing.assert_array_equal(download(device, handle, count, np.float32), np.maximum(*values))

@gpu
@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("nbytes", [1, 4096 + 3, (9 << 20) + 5])   # the last spans three staging chunks
def test_copies_between_gpus(two_gpus, direct, nbytes, monkeypatch):
  from tgrad.runtime.cuda import peer
  first, second = two_gpus
  if direct and not peer.peer_access(first, second): pytest.skip("these GPUs can't reach each other's memory")
  if not direct:
    monkeypatch.setitem(peer._peer_access, (first.ordinal, second.ordinal), False)
    monkeypatch.setitem(peer._peer_access, (second.ordinal, first.ordinal), False)
  data = RNG.integers(0, 256, nbytes).astype(np.uint8)
  for src, dst in ((first, second), (second, first)):
    source, target = upload(src, data), upload(dst, np.zeros(nbytes, np.uint8))
    src.copy_between(dst, target, src, source, nbytes)
    np.testing.assert_array_equal(download(dst, target, nbytes, np.uint8), data)
