"""Cross-device paths: the NUMPY backend against tgrad for every composite, the CUSTOM op's schedule and runner, the
device alternatives in path counts and parts, and copy coalescing (decision from a synthetic database, the rewrite on
graphs built for CUDA without a GPU)."""
import numpy as np
import pytest
from tgrad import Tensor, dtypes
from tgrad.custom import HostFunction, HostFunctionRunner
from tgrad.helpers import code_settings
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops
from tgrad.paths import select as path_select
from tgrad.paths.coalesce import copy_key, decide, coalesce_copies, find_round_trips, region_key, record_copy_times
from tgrad.paths.db import Measurement, PathsDB
from tgrad.paths.fingerprint import tgrad_version
from tgrad.paths.path import PathSpace, iterate, measure, reference_outputs
from tgrad.realize import lower_schedule
from tgrad.schedule import create_schedule
from tgrad.regions import apply_lowering, lowerings_for, regions_above

RNG = np.random.default_rng(3)

def _data(*shape, low=-3.0, high=3.0): return RNG.uniform(low, high, shape).astype(np.float32)

CASES = {
  "exp": ([(5, 7)], lambda x: x.exp()), "log": ([(5, 7)], lambda x: (x.abs() + 0.1).log()),
  "tanh": ([(3, 11)], lambda x: x.tanh()), "sigmoid": ([(13,)], lambda x: x.sigmoid()),
  "gelu_tanh": ([(5, 7)], lambda x: x.gelu()), "gelu_erf": ([(5, 7)], lambda x: x.gelu(approximate="none")),
  "softmax": ([(5, 33)], lambda x: x.softmax()), "log_softmax": ([(7, 9)], lambda x: x.log_softmax(0)),
  "rms_norm": ([(4, 19)], lambda x: x.rms_norm(eps=1e-5)), "layer_norm": ([(4, 19)], lambda x: x.layernorm()),
  "matmul": ([(5, 37), (37, 3)], lambda a, b: a @ b),
  "sdpa": ([(2, 5, 8), (2, 7, 8), (2, 7, 6)], lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=False)),
}

@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16], ids=["float32", "float16"])
def test_numpy_backend_matches_tgrad(case, dtype):
  shapes, call = CASES[case]
  rng = np.random.default_rng(sorted(CASES).index(case))   # the same inputs whatever order tests run in
  arrays = [rng.uniform(-3.0, 3.0, s).astype(np.float32) for s in shapes]
  want = call(*[Tensor(a).cast(dtype) for a in arrays]).numpy().astype(np.float64)
  out = call(*[Tensor(a).cast(dtype) for a in arrays])
  region = regions_above(out.lazydata)[0]
  apply_lowering(region, "numpy")
  [item] = [i for i in create_schedule([out.lazydata], commit=False) if i.ast.op is Ops.CUSTOM]
  assert isinstance(item.ast.arg, HostFunction) and item.ast.arg.part == "NUMPY"
  got = out.numpy()
  assert got.dtype == (np.float16 if dtype == dtypes.float16 else np.float32)
  # float16: numpy sums in float64 and rounds once, tgrad's kernel sums in float32: results may differ by an ulp of
  # the float16 output (2^-10 relative) and, near 0, by the rounding of the partial sums (K·2^-11 of their size)
  atol, rtol = (2e-6, 2e-5) if dtype == dtypes.float32 else (1e-2, 2e-3)
  np.testing.assert_allclose(got.astype(np.float64), want, atol=atol, rtol=rtol)

def test_custom_op_schedule_and_runner():
  x = Tensor(_data(3, 4)).realize()
  kernel = HostFunction("double", lambda a: 2 * a, ((4, 3),), (4, 3))
  custom = LazyBuffer.custom(kernel, (x.T.lazydata,), (4, 3), dtypes.float32)   # a permuted input: copied first
  y = Tensor(custom) + 1
  items = create_schedule([y.lazydata], commit=False)
  assert [i.ast.op for i in items] == [Ops.SINK, Ops.CUSTOM, Ops.SINK]   # transpose copy, custom, the add
  assert items[1].ast.arg is kernel and items[1].inputs == items[0].outputs
  exec_items = lower_schedule(items)
  assert isinstance(exec_items[1].runner, HostFunctionRunner)
  for e in exec_items[:2]: e.run()
  assert exec_items[1].run(wait=True) > 0   # seconds, transfers included
  np.testing.assert_array_equal(items[1].outputs[0].copyout().reshape(4, 3), 2 * x.numpy().T)
  np.testing.assert_allclose(y.numpy(), 2 * x.numpy().T + 1, rtol=1e-6)
  with pytest.raises(ValueError, match="devices"):
    LazyBuffer.custom(kernel, (x.lazydata, Tensor(_data(3, 4), device="CUDA").lazydata), (3, 4), dtypes.float32)

def test_device_alternatives_in_counts_and_parts():
  x = Tensor(_data(4, 6)).realize()
  space = iterate(x.tanh())
  assert space.options == [["default", "native", "numpy", "via_exp"]] and space.count == 4
  parts = {p.choices[0]: p.parts for p in space}
  assert parts["numpy"] == ("LLVM", "NUMPY") and parts["default"] == ("LLVM",)
  cuda = iterate(Tensor(_data(4, 6), device="CUDA").tanh())   # a graph for CUDA: built without a GPU
  assert "on_LLVM" in cuda.options[0] and {p.choices[0]: p.parts for p in cuda}["on_LLVM"] == ("CUDA", "LLVM")
  nested = iterate(x.gelu())   # gelu's default holds a tanh region: numpy offered on both, counts exact
  assert nested.count == len(list(nested)) == len({p.id for p in nested})

def test_on_llvm_lowering_schedules_copies_without_a_gpu():
  out = Tensor(_data(4, 6), device="CUDA").tanh()
  region = regions_above(out.lazydata)[0]
  assert "on_LLVM" in lowerings_for(region)
  apply_lowering(region, "on_LLVM")
  items = create_schedule([out.lazydata], commit=False)   # Buffers are only named: nothing is allocated
  steps = [(i.ast.op, i.outputs[0].device) for i in items]
  assert steps == [(Ops.COPY, "CUDA"), (Ops.COPY, "LLVM"), (Ops.SINK, "LLVM"), (Ops.COPY, "CUDA")]

def test_numpy_path_is_measured_with_its_parts():
  out = Tensor(_data(8, 16)).realize().softmax()
  space = PathSpace([out.lazydata])
  path = next(p for p in space if p.choices[0] == "numpy")   # softmax (its inner exp region: default)
  run = measure(space, path, reference_outputs(space), repeats=2)
  assert not run.error and run.max_rel_error < 1e-6 and len(run.times) == 2 and run.kernels == 1
  assert path.parts == ("LLVM", "NUMPY") and "LLVM + NUMPY" in path.description

# ---- copy coalescing

FAKE_FINGERPRINTS = {"LLVM": {"device": "LLVM", "cpu": "test"}, "CUDA": {"device": "CUDA", "gpu": "test"}}

def _record(db, key, device, seconds):
  db.add(Measurement(graph_key=key, graph_desc={}, path_id="p", path_desc="synthetic", device=device,
                     fingerprint=FAKE_FINGERPRINTS[device], tgrad_version=tgrad_version(), settings=code_settings(),
                     times=(seconds,), max_rel_error=0.0, max_abs_error=0.0, input_distribution="synthetic",
                     status="ok"))

def _round_trip(x):
  return x.to("CUDA").tanh().to("LLVM")

def _fill(db, region, t_llvm, t_cuda, t_copy):
  _record(db, region_key(region, "LLVM"), "LLVM", t_llvm)
  _record(db, region_key(region, "CUDA"), "CUDA", t_cuda)
  shape, dtype = region.root.shape, region.root.dtype
  _record(db, copy_key("LLVM", "CUDA", shape, dtype), "CUDA", t_copy)
  _record(db, copy_key("CUDA", "LLVM", shape, dtype), "LLVM", t_copy)

def test_coalescing_decision():
  assert decide(10e-6, 5e-6, [4e-6, 4e-6]).on_host        # 10 < 5 + 8
  assert not decide(20e-6, 5e-6, [4e-6, 4e-6]).on_host    # 20 >= 13
  assert not decide(None, 5e-6, [4e-6]).on_host           # nothing recorded: no evidence, no change
  assert not decide(1e-6, 5e-6, [None]).on_host

@pytest.mark.parametrize("t_llvm, rewritten", [(10e-6, True), (30e-6, False)])
def test_coalescing_rewrites_from_the_database(tmp_path, t_llvm, rewritten):
  db = PathsDB(str(tmp_path / "paths.db"))
  data = _data(16, 32)
  x = Tensor(data).realize()
  y = _round_trip(x)
  [trip] = find_round_trips([y.lazydata])
  assert trip.device == "CUDA" and trip.region.name == "tanh"
  _fill(db, trip.region, t_llvm, t_cuda=5e-6, t_copy=6e-6)   # round trip: 17 us
  log = []
  assert coalesce_copies([y.lazydata], db, FAKE_FINGERPRINTS.get, log) == int(rewritten)
  assert log and ("host 10.0 us <" in log[0] if rewritten else ">=" in log[0])
  if rewritten:   # everything is on the CPU now: it runs without a GPU, as a tanh region there
    assert [r.name for r in regions_above(y.lazydata)] == ["tanh"] and y.lazydata.base.device == "LLVM"
    assert find_round_trips([y.lazydata]) == []
    np.testing.assert_allclose(y.numpy(), np.tanh(data), atol=1e-6)
  else:
    assert y.lazydata.base.op is Ops.COPY and y.lazydata.base.srcs[0].device == "CUDA"

def test_no_round_trip_when_an_input_lives_on_the_device():
  x = Tensor(_data(4, 4)).realize()
  w = Tensor(_data(4, 4), device="CUDA")
  assert find_round_trips([(x.to("CUDA") @ w).to("LLVM").lazydata]) == []
  assert len(find_round_trips([(x.to("CUDA") @ x.to("CUDA")).to("LLVM").lazydata])) == 1

def test_copy_times_are_recorded(tmp_path):
  db = PathsDB(str(tmp_path / "paths.db"))
  m = record_copy_times(db, "LLVM", "LLVM", (64,), dtypes.float32, repeats=2)
  assert m.parts == ("LLVM", "LLVM") and len(m.times) == 2
  [run] = db.runs(copy_key("LLVM", "LLVM", (64,), dtypes.float32), "LLVM")
  assert run.path_desc == "copy LLVM → LLVM"

def test_realize_context_coalesces(tmp_path, monkeypatch):
  monkeypatch.setenv("TGRAD_CACHE", str(tmp_path / "paths.db"))
  path_select.forget()
  try:
    data = _data(8, 8)
    y = _round_trip(Tensor(data, device="LLVM").realize())   # host data on the CPU, whatever the default device
    [trip] = find_round_trips([y.lazydata])
    monkeypatch.setattr("tgrad.paths.coalesce.hardware_fingerprint", FAKE_FINGERPRINTS.get)
    _fill(path_select.database(), trip.region, 1e-6, 5e-6, 5e-6)
    path_select.forget()   # the database changed (as the profiler does after recording)
    np.testing.assert_allclose(y.numpy(), np.tanh(data), atol=1e-6)   # would need a GPU without the rewrite
  finally: path_select.forget()

@pytest.mark.gpu
def test_profiler_measures_round_trips_and_on_llvm_runs(tmp_path):
  from tgrad.paths.profile import Profiler, watching
  db = PathsDB(str(tmp_path / "paths.db"))
  data = _data(64, 64)
  with watching(Profiler(db, budget=60, progress=False)):
    y = _round_trip(Tensor(data, device="LLVM").realize())   # host data on the CPU, whatever the default device
    [trip] = find_round_trips([y.lazydata])
    y.realize()
  for source, destination in (("LLVM", "CUDA"), ("CUDA", "LLVM")):
    assert db.runs(copy_key(source, destination, (64, 64), dtypes.float32), destination)
  assert db.runs(region_key(trip.region, "LLVM"), "LLVM") and db.runs(region_key(trip.region, "CUDA"), "CUDA")
  np.testing.assert_allclose(y.numpy(), np.tanh(data), atol=1e-6)
  out = Tensor(data, device="CUDA").tanh()   # the on_LLVM path runs: copies there and back
  region = regions_above(out.lazydata)[0]
  apply_lowering(region, "on_LLVM")
  np.testing.assert_allclose(out.numpy(), np.tanh(data), atol=1e-6)
