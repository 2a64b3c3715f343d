"""Tests for tgrad/codegen/search.py on the LLVM (CPU) device: the searched opts verify against numpy, a candidate made
wrong on purpose is rejected (a wrong kernel source; a fake runner that is 90% off on one small element, or that
skips the elements where the reference holds the poison value), the per-element tolerance passes reordered sums only,
winners round-trip through the cache across processes (the second process does not search), IGNORE_BEAM_CACHE
searches again, and the cache key follows the device, NOOPT, the action space, the beam width and CODEGEN_VERSION.
Most tests use a small action space so that a search takes seconds.
"""
import json, os, subprocess, sys, types
from pathlib import Path
import numpy as np
import pytest
import tgrad.codegen.search as search
from tgrad.cache import get_cache
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.device import Buffer, Device
from tgrad.dtype import dtypes
from tgrad.helpers import Context
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops
from tgrad.realize import compile_kernel, realize
from tgrad.schedule import create_schedule

DEVICE = "LLVM"
REPO_ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_SECONDS = 240
SMALL_ACTIONS = [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, 4),
                 Opt(OptOps.UNROLL, 0, 0), Opt(OptOps.THREAD, 0, 2), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PADTO, 0, 16)]

def realized(array: np.ndarray) -> LazyBuffer:
  lb = LazyBuffer.from_host(array, DEVICE)
  realize(lb)
  return lb

def matmul(a: LazyBuffer, b: LazyBuffer) -> LazyBuffer:
  (n, k), (_, m) = a.shape, b.shape
  product = a.reshape((n, 1, k)).expand((n, m, k)).alu(Ops.MUL, b.permute((1, 0)).reshape((1, m, k)).expand((n, m, k)))
  return product.r(Ops.ADD, (2,)).reshape((n, m))

def matmul_case(n: int, k: int, m: int, seed: int = 0):
  """(fresh Kernel, input buffers, numpy's answer) for an n×k @ k×m matmul."""
  rng = np.random.default_rng(seed)
  a, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
  item = create_schedule([matmul(realized(a), realized(b))])[-1]
  return Kernel(item.ast, Device[DEVICE].renderer), list(item.inputs), a @ b

def row_sum_case(rows: int, cols: int):
  x = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
  item = create_schedule([realized(x).r(Ops.ADD, (1,))])[-1]
  return Kernel(item.ast, Device[DEVICE].renderer), list(item.inputs), x.sum(axis=1)

def run_with_opts(kernel: Kernel, inputs: list, expected: np.ndarray, opts: list[Opt]) -> np.ndarray:
  kernel = kernel.copy()
  for opt in opts: kernel.apply_opt(opt)
  out = Buffer(DEVICE, expected.size, dtypes.float32)
  compile_kernel(DEVICE, kernel)([out, *inputs])
  return out.copyout().reshape(expected.shape)

@pytest.fixture
def small_actions(monkeypatch):
  monkeypatch.setattr(search, "ACTIONS", SMALL_ACTIONS)

@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
  path = tmp_path / "cache.db"
  monkeypatch.setenv("TGRAD_CACHE", str(path))
  return path

def test_search_finds_opts_that_verify(small_actions, fresh_cache):
  kernel, inputs, expected = matmul_case(32, 48, 64)
  result = search.search_kernel(kernel, 2)
  stats = result.stats
  assert not stats.from_cache and stats.rounds >= 1 and stats.timed >= 2 and stats.rejected == 0
  assert stats.best_seconds <= stats.heuristic_seconds   # never slower than the default
  assert kernel.applied_opts == []                        # the caller's kernel is left alone
  np.testing.assert_allclose(run_with_opts(kernel, inputs, expected, result.opts), expected, rtol=1e-4, atol=1e-4)
  timings = get_cache().get_timings(kernel.ast.key)
  assert len(timings) == stats.timed + 1 and all(t["device"] == DEVICE and t["times"] for t in timings)  # + reference

def test_beam_in_realize_with_the_full_action_space(fresh_cache):
  a, b = np.ones((8, 16), np.float32), np.arange(16 * 4, dtype=np.float32).reshape(16, 4)
  with Context(BEAM=1):
    out = matmul(realized(a), realized(b))
    realize(out)
  np.testing.assert_allclose(out.base.buffer.copyout().reshape(8, 4), a @ b)
  assert len(get_cache().export_json()["opts"]) == 1   # the winner was cached

def test_realize_reuses_the_winners_binary(small_actions, fresh_cache, monkeypatch):
  """After a search, realize's kernel has exactly a candidate's source (the same function name), so its binary comes
  from the cache instead of a second compile."""
  import tgrad.realize as realize_module
  a, b = np.ones((32, 48), np.float32), np.ones((48, 64), np.float32)
  out = matmul(realized(a), realized(b))
  candidates: set[str] = set()
  def recording(candidate: Kernel, name: str, original=search.render_candidate) -> str:
    candidates.add(src := original(candidate, name))
    return src
  monkeypatch.setattr(search, "render_candidate", recording)
  compiler = Device[DEVICE].compiler
  compiled: list[str] = []
  def counting(src: str, original=compiler.compile) -> bytes:
    compiled.append(src)
    return original(src)
  monkeypatch.setattr(compiler, "compile", counting)
  monkeypatch.setattr(realize_module, "_runner_cache", {})   # another test may have run this kernel already
  with Context(BEAM=2):
    realize(out)
  (runner,) = realize_module._runner_cache.values()
  assert runner.src in candidates and compiled.count(runner.src) <= 1
  np.testing.assert_allclose(out.base.buffer.copyout().reshape(32, 64), a @ b)

def test_wrong_candidate_is_rejected(small_actions, fresh_cache, monkeypatch):
  kernel, inputs, expected = row_sum_case(16, 64)   # small: the heuristics leave it unoptimized
  corrupted = []
  def render_wrongly(candidate: Kernel, name: str) -> str:
    src = render_candidate(candidate, name)
    if not candidate.applied_opts: return src
    corrupted.append(candidate.applied_opts)
    return src.replace("fadd", "fsub")   # every optimized candidate subtracts instead of adding
  render_candidate = search.render_candidate
  monkeypatch.setattr(search, "render_candidate", render_wrongly)
  monkeypatch.setattr(search, "EARLY_STOP_FACTOR", 1e9)   # on a loaded machine no candidate may skip verification
  result = search.search_kernel(kernel, 2)
  assert corrupted and result.stats.rejected >= 1
  assert result.opts == []   # only the unoptimized kernel is right
  np.testing.assert_allclose(run_with_opts(kernel, inputs, expected, result.opts), expected, rtol=1e-5, atol=1e-5)

def test_in_place_int_kernel_verifies(small_actions, fresh_cache):
  x = realized(np.arange(-32, 32, dtype=np.int32).reshape(8, 8))
  small = x.alu(Ops.CMPLT, x.const(5))
  item = create_schedule([x.assign(small.alu(Ops.WHERE, x.alu(Ops.MUL, x), x))])[-1]   # reads and writes buffer 0
  result = search.search_kernel(Kernel(item.ast, Device[DEVICE].renderer), 2)
  assert result.stats.timed >= 2 and result.stats.rejected == 0   # each checked run starts from the same buffer 0

SEARCH_SCRIPT = """
import json, sys
import numpy as np
import tgrad.codegen.search as search
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.device import Device
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops
from tgrad.realize import realize
from tgrad.schedule import create_schedule
search.ACTIONS = [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UPCAST, 0, 8)]
x = LazyBuffer.from_host(np.ones((32, 64), np.float32), "LLVM")
realize(x)
kernel = Kernel(create_schedule([x.r(Ops.ADD, (1,))])[-1].ast, Device["LLVM"].renderer)
result = search.search_kernel(kernel, 1)
print(json.dumps({"from_cache": result.stats.from_cache, "opts": [o.to_json() for o in result.opts]}))
"""

def run_search_process(cache_path: Path, **env: str) -> dict:
  """Run SEARCH_SCRIPT as a script file without a main guard: spawned compile workers must not re-run it."""
  script = cache_path.parent / "search_script.py"
  script.write_text(SEARCH_SCRIPT)
  environment = {**os.environ, "TGRAD_CACHE": str(cache_path), "PYTHONPATH": str(REPO_ROOT), **env}
  done = subprocess.run([sys.executable, str(script)], env=environment, capture_output=True, text=True,
                        timeout=SUBPROCESS_TIMEOUT_SECONDS)
  assert done.returncode == 0, done.stderr
  return json.loads(done.stdout.strip().splitlines()[-1])

def test_cache_round_trip_across_processes(tmp_path):
  cache_path = tmp_path / "shared.db"
  first = run_search_process(cache_path)
  second = run_search_process(cache_path)
  assert not first["from_cache"] and second["from_cache"] and second["opts"] == first["opts"]
  assert not run_search_process(cache_path, IGNORE_BEAM_CACHE="1")["from_cache"]

def test_ignore_beam_cache_searches_again(small_actions, fresh_cache):
  kernel, _, _ = row_sum_case(8, 32)
  assert not search.search_kernel(kernel, 1).stats.from_cache
  assert search.search_kernel(kernel, 1).stats.from_cache
  with Context(IGNORE_BEAM_CACHE=1): assert not search.search_kernel(kernel, 1).stats.from_cache

def test_cache_key_follows_what_changes_the_code(monkeypatch):
  kernel, _, _ = row_sum_case(8, 32)
  key = search.search_cache_key(kernel, 2)
  assert search.search_cache_key(kernel, 2) == key
  assert search.search_cache_key(kernel, 3) != key
  llvm = Device[DEVICE]
  other_device = types.SimpleNamespace(name="CUDA", renderer=types.SimpleNamespace(arch="sm_90"),
                                       compiler=types.SimpleNamespace(cache_key="nvrtc-12.4-sm_90"))
  cuda_key = search.search_cache_key(kernel, 2, other_device)
  assert cuda_key["device"] == "CUDA" and cuda_key["arch"] == "sm_90" and cuda_key != key
  assert key["arch"] == search.device_arch(llvm) != ""
  with Context(NOOPT=1): assert search.search_cache_key(kernel, 2) != key
  optimized = kernel.copy()
  optimized.apply_opt(Opt(OptOps.UPCAST, 0, 2))
  assert search.search_cache_key(optimized, 2) != key
  monkeypatch.setattr(search, "ACTIONS", search.ACTIONS[:-1])
  assert search.search_cache_key(kernel, 2)["actions"] != key["actions"]

def test_kernel_buffer_specs_cover_what_the_kernel_touches():
  x = realized(np.zeros((6, 10), np.float32))
  padded = x.pad(((1, 0), (0, 2))).shrink(((0, 5), (3, 12))).cast(dtypes.int32)   # a window into x
  item = create_schedule([padded])[-1]
  specs = search.kernel_buffer_specs(Kernel(item.ast, Device[DEVICE].renderer))
  assert specs == [(dtypes.int32, 5 * 9), (dtypes.float32, 4 * 10)]   # rows 0..3 of x are read, to its last column

def test_outputs_match_tolerates_reassociation_only():
  rng = np.random.default_rng(0)
  ref = rng.standard_normal(1000).astype(np.float32)
  assert search.outputs_match(ref * np.float32(1 + 1e-6), ref, dtypes.float32)
  assert not search.outputs_match(ref + 0.05, ref, dtypes.float32)
  poisoned = ref.copy()
  poisoned[17] = np.nan
  assert not search.outputs_match(poisoned, ref, dtypes.float32)   # an element the candidate never wrote
  assert search.outputs_match(poisoned, poisoned.copy(), dtypes.float32)   # NaN where the reference has NaN
  ints = np.arange(10, dtype=np.int32)
  assert search.outputs_match(ints, ints.copy(), dtypes.int32)
  assert not search.outputs_match(ints + 1, ints, dtypes.int32)
  poisoned_bools = np.array([0xFF, 1], np.uint8).view(np.bool_)   # numpy calls both True
  assert not search.outputs_match(poisoned_bools, np.ones(2, np.bool_), dtypes.bool)

@pytest.mark.parametrize("dtype,terms", [(dtypes.float16, 1), (dtypes.bfloat16, 1), (dtypes.float32, 1),
                                         (dtypes.float64, 1), (dtypes.float16, 1024), (dtypes.float32, 4096)], ids=str)
def test_a_small_element_is_checked_on_its_own_scale(dtype, terms):
  """90% off on one small element next to a 1000 is wrong, whatever else the output holds. (Before, the absolute
  tolerance was a fraction of the output's largest value, so the 1000 let 1.0 become 0.1.)"""
  values = np.concatenate([[1000.0, 1.0], np.random.default_rng(3).standard_normal(30)])
  ref = _as_dtype(values, dtype)
  wrong = _as_dtype(values * np.where(np.arange(values.size) == 1, 0.1, 1.0), dtype)
  tolerance = search.output_tolerance(ref, dtype, dtype, terms)
  assert not search.outputs_match(wrong, ref, dtype, tolerance)
  assert search.outputs_match(ref.copy(), ref, dtype, tolerance)

def _as_dtype(values: np.ndarray, dtype) -> np.ndarray:
  """float values as the array that holds dtype's bits (bfloat16 as uint16, truncated)."""
  if dtype == dtypes.bfloat16: return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
  return values.astype(dtype.np)

def test_tolerance_covers_reordered_sums_only():
  """float32 sums of 4096 random terms, summed in another order, pass (near-zero sums included); the same sums with
  the one nearest zero off by 0.1 do not."""
  rng = np.random.default_rng(4)
  terms = rng.standard_normal((2000, 4096)).astype(np.float32)
  sequential = np.zeros(2000, np.float32)
  for column in terms.T: sequential += column   # the unoptimized kernel's order
  blocked = terms.reshape(2000, 64, 64).sum(2, dtype=np.float32).sum(1, dtype=np.float32)   # a candidate's order
  tolerance = search.output_tolerance(sequential, dtypes.float32, dtypes.float32, 4096)
  assert search.outputs_match(blocked, sequential, dtypes.float32, tolerance)
  nearest_zero = int(np.abs(sequential).argmin())
  blocked[nearest_zero] += 0.1   # a tenth, next to sums of ±250: a max-scaled tolerance (0.25) let it through
  assert not search.outputs_match(blocked, sequential, dtypes.float32, tolerance)

def test_tolerance_of_small_outputs_stays_small():
  """A mean over many terms is small everywhere: its tolerance shrinks with the output's RMS."""
  ref = np.random.default_rng(5).standard_normal(100).astype(np.float32) * 1e-3
  tolerance = search.output_tolerance(ref, dtypes.float32, dtypes.float32, 1 << 20)
  assert tolerance.atol <= 1e-3 * 2e-3
  assert not search.outputs_match(ref * 0.5, ref, dtypes.float32, tolerance)

def test_kernel_numerics_names_the_least_precise_float_and_the_reduce_size():
  x = realized(np.ones((8, 300), np.float16))
  item = create_schedule([x.cast(dtypes.float32).r(Ops.ADD, (1,))])[-1]
  assert search.kernel_numerics(Kernel(item.ast, Device[DEVICE].renderer)) == (dtypes.float16, 300)
  item = create_schedule([realized(np.ones(5, np.int32)).alu(Ops.ADD, realized(np.ones(5, np.int32)))])[-1]
  assert search.kernel_numerics(Kernel(item.ast, Device[DEVICE].renderer)) == (None, 1)

# ---- verification with a fake candidate: a Python runner that writes what the test chooses

def search_with_reference(out: LazyBuffer) -> tuple[search._Search, Kernel]:
  """A _Search for out's kernel with its reference taken from the real unoptimized kernel."""
  item = create_schedule([out])[-1]
  kernel = Kernel(item.ast, Device[DEVICE].renderer)
  beam = search._Search(kernel, 1)
  beam.take_reference(search._Candidate(kernel, "", runner=compile_kernel(DEVICE, kernel.copy())))
  return beam, kernel

def fake_candidate(kernel: Kernel, output: np.ndarray, written: np.ndarray) -> search._Candidate:
  """A candidate whose 'kernel' stores output[written] into buffer 0 and leaves the other elements as they were."""
  def run(buffers, wait=False) -> float:
    current = buffers[0].copyout()
    current[written] = output[written]
    buffers[0].copyin(current)
    return 1e-6
  return search._Candidate(kernel.copy(), "", runner=run)

@pytest.mark.parametrize("case", ["nan", "minus_one"])
def test_unwritten_elements_are_rejected_where_the_reference_holds_the_poison(fresh_cache, case):
  """sqrt of random normals is NaN at about half the elements, and max(x, -1) of random ints is -1 at many: exactly
  what the 0xFF poison reads as. A candidate that writes only the other elements holds NaN / -1 there after a
  0xFF-poisoned run, so one poison can't see it; the run with the second poison does."""
  if case == "nan":
    x = realized(np.zeros(256, np.float32))
    out = x.alu(Ops.SQRT)
  else:
    x = realized(np.zeros(256, np.int32))
    out = x.alu(Ops.MAX, x.const(-1))
  beam, kernel = search_with_reference(out)
  reference = beam.reference[0]
  poison_like = np.isnan(reference) if case == "nan" else reference == -1
  assert 20 < poison_like.sum() < 236   # the random inputs give both kinds of element
  everything = np.ones(reference.shape, bool)
  assert beam.verify(fake_candidate(kernel, reference, everything))     # the fake runner itself is right
  skipping = fake_candidate(kernel, reference, ~poison_like)
  assert not beam.verify(skipping) and beam.stats.rejected == 1
  assert search.outputs_match(beam.checked_run(skipping, search.POISON_BYTES[0])[0], reference, out.dtype,
                              beam.tolerances[0])   # what a single 0xFF-poisoned run would have accepted

def test_a_small_wrong_element_is_rejected_by_verify(fresh_cache):
  """exp2(10·x) of random normals spans 2^-30 to 2^30. The element nearest 1.0, off by 90%, is rejected: a tolerance
  scaled by the output's largest value (~1e9) let it through."""
  x = realized(np.zeros(512, np.float32))
  beam, kernel = search_with_reference(x.alu(Ops.MUL, x.const(10.0)).alu(Ops.EXP2))
  reference = beam.reference[0]
  near_one = int(np.abs(reference - 1).argmin())
  assert 0.5 < reference[near_one] < 2 and np.abs(reference).max() > 1e5
  wrong = reference.copy()
  wrong[near_one] *= np.float32(0.1)
  everything = np.ones(reference.shape, bool)
  assert beam.verify(fake_candidate(kernel, reference, everything))
  assert not beam.verify(fake_candidate(kernel, wrong, everything))

def test_bumping_the_codegen_version_misses_the_cache(small_actions, fresh_cache, monkeypatch):
  import tgrad.codegen
  kernel, _, _ = row_sum_case(8, 32)
  assert not search.search_kernel(kernel, 1).stats.from_cache
  assert search.search_kernel(kernel, 1).stats.from_cache
  key = search.search_cache_key(kernel, 1)
  monkeypatch.setattr(tgrad.codegen, "CODEGEN_VERSION", tgrad.codegen.CODEGEN_VERSION + 1)
  assert search.search_cache_key(kernel, 1)["codegen"] != key["codegen"]
  assert not search.search_kernel(kernel, 1).stats.from_cache   # searched (and verified) again
  assert search.search_kernel(kernel, 1).stats.from_cache

def test_action_space_is_legal_json_and_hashed():
  assert len(set(search.ACTIONS)) == len(search.ACTIONS)
  assert all(Opt.from_json(json.loads(json.dumps(opt.to_json()))) == opt for opt in search.ACTIONS)
  assert len(search.action_space_hash()) == 64

def test_an_output_written_by_one_block_is_sized_by_what_its_view_reaches():
  """A multi-output kernel may store a vector inside its reduce loops from the points of one block only (gemma's
  decode step: the residual, stored by the qkv projection's block 0): the store's shape is the kernel's (rows,
  blocks, values) but it writes blocks·values elements. The search sizes and checks that output by its view's extent,
  not its shape (it had called the rest of a shape-sized buffer unwritten and stopped)."""
  from tgrad.codegen.search import store_elements
  from tgrad.shape.shapetracker import ShapeTracker
  from tgrad.shape.view import View
  from tgrad.shape.sint import vmax_of
  from tgrad import Variable
  rider = ShapeTracker((View.create((1536, 20, 32), (0, 32, 1), 0, ((0, 1), (0, 20), (0, 32))),))
  assert store_elements(rider) == 640
  assert store_elements(ShapeTracker.from_shape((7, 5))) == 35
  n = Variable("n", 1, 64)
  assert vmax_of(store_elements(ShapeTracker.from_shape((n, 5)))) == 320
