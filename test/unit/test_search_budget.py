"""Tests for what keeps a BEAM search short on the LLVM (CPU) device (tgrad/codegen/search.py): the time budget
(BEAM_BUDGET), timing a clearly slower candidate once (RETIME_FACTOR), the children pruned for spilling their
accumulators, the start kernel left out of the seeds and a verify's second poisoned run skipped when the first shows
every element written. None of them may let a wrong or unverified kernel win; with fixed timings the search is
deterministic. Timings are replaced by a function of the candidate (the kernels still run, so outputs are real).
"""
import dataclasses, hashlib
import numpy as np
import pytest
import tgrad.codegen.search as search
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.codegen.opts import apply_opts
from tgrad.device import Buffer, Device
from tgrad.dtype import dtypes
from tgrad.helpers import Context, cpu_count
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops
from tgrad.realize import compile_kernel, realize
from tgrad.runtime.llvm.renderer import LLVMRenderer
from tgrad.schedule import create_schedule

DEVICE = "LLVM"
ACTIONS = [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, 4),
           Opt(OptOps.UNROLL, 0, 0), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PADTO, 0, 16)]
AVX2 = (32, 16)   # bytes per SIMD register, registers: 128 float32 accumulators fill them

def realized(array: np.ndarray) -> LazyBuffer:
  lb = LazyBuffer.from_host(array, DEVICE)
  realize(lb)
  return lb

def matmul_case(n: int, k: int, m: int, renderer=None):
  """(fresh Kernel, input buffers, numpy's answer) for an n×k @ k×m float32 matmul."""
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
  la, lb = realized(a), realized(b)
  rows, columns = la.reshape((n, 1, k)).expand((n, m, k)), lb.permute((1, 0)).reshape((1, m, k)).expand((n, m, k))
  product = rows.alu(Ops.MUL, columns)
  item = create_schedule([product.r(Ops.ADD, (2,)).reshape((n, m))])[-1]
  return Kernel(item.ast, renderer or Device[DEVICE].renderer), list(item.inputs), a @ b

def run_with_opts(kernel: Kernel, inputs: list, expected: np.ndarray, opts: list[Opt]) -> np.ndarray:
  kernel = kernel.copy()
  for opt in opts: kernel.apply_opt(opt)
  out = Buffer(DEVICE, expected.size, dtypes.float32)
  compile_kernel(DEVICE, kernel)([out, *inputs])
  return out.copyout().reshape(expected.shape)

@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("TGRAD_CACHE", str(tmp_path / "cache.db"))

def fixed_timings(monkeypatch, seconds_of) -> None:
  """Every launch of a candidate still runs it, but reports seconds_of(candidate) as its time."""
  launch = search._Search.launch
  def timed(self, candidate, var_vals):
    launch(self, candidate, var_vals)
    return seconds_of(candidate)
  monkeypatch.setattr(search._Search, "launch", timed)

def source_seconds(candidate) -> float:
  """A time in [1, 2) ms that depends on the source only."""
  return 1e-3 * (1 + int(hashlib.sha256(candidate.src.encode()).hexdigest()[:8], 16) / 2 ** 32)

def made_wrong(opts, heuristic) -> bool:
  """The candidates the first test corrupts: the heuristics' choice for its matmul on this machine (its tile depends on
  the CPU's vector registers: UPCAST 1 16, UPCAST 0 4, SWAP 0 1 with AVX2) and every kernel that starts with the same
  two opts (its children), and every kernel with an UNROLL. The heuristics' kernel is a seed, so one is always made."""
  return list(opts[:2]) == list(heuristic[:2]) or any(opt.op is OptOps.UNROLL for opt in opts)

def heuristic_opts(kernel: Kernel) -> list[Opt]:
  trial = kernel.copy()
  hand_coded_optimizations(trial)
  return list(trial.applied_opts)

@pytest.mark.parametrize("timed_before_deadline, big_reference", [(1, False), (3, False), (None, False), (None, True)])
def test_budget_and_single_runs_never_pick_a_wrong_kernel(fresh_cache, monkeypatch, timed_before_deadline,
                                                          big_reference):
  """Many candidates (made_wrong) subtract instead of adding, and report the fastest times. With every slower
  candidate timed once, nothing stopped early, and the budget running out after a few candidates (or never), the
  winner is still a right kernel: only verified candidates become the best or join the beam. `big_reference`: the
  reference is a big kernel's (split over the cores, upcast along the output's columns)."""
  monkeypatch.setattr(search, "ACTIONS", ACTIONS)
  if big_reference: monkeypatch.setattr(search, "REFERENCE_THREAD_MIN_WORK", 1)
  monkeypatch.setattr(search, "RETIME_FACTOR", 1.0)
  monkeypatch.setattr(search, "EARLY_STOP_FACTOR", 1e9)
  if timed_before_deadline is not None:
    def passed(self) -> bool:
      self.stats.deadline_hit = self.stats.deadline_hit or self.stats.timed >= timed_before_deadline
      return self.stats.deadline_hit
    monkeypatch.setattr(search._Search, "deadline_passed", property(passed))
  kernel, inputs, expected = matmul_case(32, 48, 64)
  heuristic = heuristic_opts(kernel)
  render, corrupted = search.render_candidate, []
  def render_wrongly(candidate, name: str) -> str:
    src = render(candidate, name)
    if not made_wrong(candidate.applied_opts, heuristic): return src
    corrupted.append(candidate.applied_opts)
    return src.replace("fadd", "fsub")
  monkeypatch.setattr(search, "render_candidate", render_wrongly)
  fixed_timings(monkeypatch, lambda c: 1e-5 if made_wrong(c.kernel.applied_opts, heuristic) else
                1e-3 / (1 + len(c.src) / 1e4))
  result = search.search_kernel(kernel, 2)
  assert corrupted and not made_wrong(result.opts, heuristic)
  assert result.stats.deadline_hit == (timed_before_deadline is not None)
  if timed_before_deadline is None: assert result.stats.rejected >= 1 and result.stats.retimes_skipped >= 1
  np.testing.assert_allclose(run_with_opts(kernel, inputs, expected, result.opts), expected, rtol=1e-4, atol=1e-4)

def test_budget_setting_sets_the_deadline(fresh_cache):
  kernel, _, _ = matmul_case(8, 8, 8)
  with Context(BEAM_BUDGET=7): beam = search._Search(kernel, 1)
  assert beam.deadline - beam.started == 7

def test_a_spent_budget_still_returns_the_verified_heuristic_kernel(fresh_cache, monkeypatch):
  """With the deadline already past when the search starts, the reference and the heuristics' kernel are still
  compiled (the compile workers take longer than that to start) and checked; nothing else is timed, and the heuristic
  kernel (20× faster than the unoptimized one here) wins without the final interleaved runs."""
  init = search._Search.__init__
  def spent(self, *args) -> None:
    init(self, *args)
    self.deadline = self.started - 1
  monkeypatch.setattr(search._Search, "__init__", spent)
  kernel, inputs, expected = matmul_case(128, 128, 128)
  heuristic = kernel.copy()
  search.hand_coded_optimizations(heuristic)
  result = search.search_kernel(kernel, 2)
  stats = result.stats
  assert stats.deadline_hit and stats.rounds == 0 and stats.timed == 0 and stats.compile_failures == 0
  assert result.opts == heuristic.applied_opts
  np.testing.assert_allclose(run_with_opts(kernel, inputs, expected, result.opts), expected, rtol=1e-4, atol=1e-4)

def test_search_is_deterministic_for_fixed_timings(fresh_cache, monkeypatch):
  """The random inputs follow the kernel (its AST), and with timings fixed by the source every choice repeats: the
  same opts and the same counts, searched twice in one process (the second compiles nothing: the binaries are
  cached)."""
  monkeypatch.setattr(search, "ACTIONS", ACTIONS)
  fixed_timings(monkeypatch, source_seconds)
  kernel, inputs, expected = matmul_case(16, 40, 24)
  first_inputs, second_inputs = search._Search(kernel, 2).initial, search._Search(kernel.copy(), 2).initial
  assert first_inputs.keys() == second_inputs.keys() and all(
    np.array_equal(first_inputs[i], second_inputs[i]) for i in first_inputs)
  with Context(IGNORE_BEAM_CACHE=1):
    first, second = search.search_kernel(kernel, 2), search.search_kernel(kernel, 2)
  assert first.opts == second.opts and first.stats.candidates > 3
  assert dataclasses.replace(first.stats, seconds=0) == dataclasses.replace(second.stats, seconds=0)
  np.testing.assert_allclose(run_with_opts(kernel, inputs, expected, first.opts), expected, rtol=1e-4, atol=1e-4)

def test_a_slower_candidate_is_timed_once(fresh_cache, monkeypatch):
  """Candidates RETIME_FACTOR slower than the best get one run; the others TIMING_RUNS, the checked run of a verify
  included (a right matmul writes no NaN, so a verify is one run)."""
  monkeypatch.setattr(search, "ACTIONS", ACTIONS)
  monkeypatch.setattr(search, "EARLY_STOP_FACTOR", 1e9)
  fixed_timings(monkeypatch, source_seconds)   # 1 to 2 ms: some are more than 1.3× the best, none 3×
  kernel, _, _ = matmul_case(16, 40, 24)
  timed = []
  measure = search._Search.measure
  def recording(self, candidates):
    measured = measure(self, candidates)
    timed.extend((c, len(c.times), self.best_time) for c in measured)
    return measured
  monkeypatch.setattr(search._Search, "measure", recording)
  result = search.search_kernel(kernel, 2)
  assert result.stats.retimes_skipped >= 1
  for candidate, runs, _ in timed:
    if runs == 1: assert candidate.times[0] > search.RETIME_FACTOR * 1e-3   # slower than any best can be 1.3× of
    else: assert runs == search.TIMING_RUNS   # a verify's checked run (before the candidate became the best) is one

def test_kernels_wider_than_the_registers_are_found():
  kernel, _, _ = matmul_case(64, 64, 64, LLVMRenderer(simd=AVX2))
  tile = [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 4)]   # 64 accumulators: half the registers
  assert not search.overfills_registers(apply_opts(kernel.state, tile))
  assert not search.overfills_registers(apply_opts(kernel.state, tile + [Opt(OptOps.UPCAST, 0, 2)]))   # 128: all
  assert search.overfills_registers(apply_opts(kernel.state, tile + [Opt(OptOps.UPCAST, 0, 4)]))       # 256
  # an unrolled K adds no accumulators, but loads: 64·2 values a step fill the registers, 64·4 overfill them
  assert not search.overfills_registers(apply_opts(kernel.state, tile + [Opt(OptOps.UNROLL, 0, 2)]))
  assert search.overfills_registers(apply_opts(kernel.state, tile + [Opt(OptOps.UNROLL, 0, 4)]))
  elementwise = Kernel(create_schedule([realized(np.ones((64, 64), np.float32)).alu(Ops.EXP2)])[-1].ast,
                       LLVMRenderer(simd=AVX2))
  # no sums: 128 float32 values a step fill the registers (512 were a 2300-line kernel)
  wide = apply_opts(elementwise.state, [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 0, 32)])
  assert wide.upcast_size == 512 and search.overfills_registers(wide)
  assert not search.overfills_registers(apply_opts(elementwise.state, [Opt(OptOps.UPCAST, 0, 32),
                                                                       Opt(OptOps.UPCAST, 0, 4)]))
  halves = Kernel(create_schedule([realized(np.ones((64, 64), np.float16)).alu(Ops.EXP2)])[-1].ast,
                  LLVMRenderer(simd=AVX2))
  assert not search.overfills_registers(apply_opts(halves.state, [Opt(OptOps.UPCAST, 0, 16),
                                                                  Opt(OptOps.UPCAST, 0, 16)]))   # 256 halves

def test_spilling_children_are_not_rendered(fresh_cache, monkeypatch):
  monkeypatch.setattr(search, "ACTIONS", [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 16),
                                          Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4)])
  rendered = []
  render = search.render_candidate
  def recording(candidate, name: str) -> str:
    rendered.append(candidate)
    return render(candidate, name)
  monkeypatch.setattr(search, "render_candidate", recording)
  monkeypatch.setattr(search, "hand_coded_optimizations", lambda kernel: None)   # no seeds: the start's children
  fixed_timings(monkeypatch, lambda c: 1e-3 / c.kernel.upcast_size)   # the more accumulators, the faster
  kernel, inputs, expected = matmul_case(64, 32, 64, LLVMRenderer(simd=AVX2))
  result = search.search_kernel(kernel, 2)
  assert result.stats.pruned >= 1 and rendered
  assert not any(search.overfills_registers(candidate) for candidate in rendered)
  np.testing.assert_allclose(run_with_opts(kernel, inputs, expected, result.opts), expected, rtol=1e-4, atol=1e-4)

@pytest.mark.skipif(cpu_count() < 2, reason="the reference is split over 2 or more cores")
def test_the_start_kernel_is_not_a_seed_when_the_reference_is_split(fresh_cache, monkeypatch):
  monkeypatch.setattr(search, "ACTIONS", ACTIONS)
  monkeypatch.setattr(search, "REFERENCE_THREAD_MIN_WORK", 1)
  rendered = []
  render = search.render_candidate
  def recording(candidate, name: str) -> str:
    rendered.append(candidate.applied_opts)
    return render(candidate, name)
  monkeypatch.setattr(search, "render_candidate", recording)
  kernel, inputs, expected = matmul_case(32, 48, 64)
  result = search.search_kernel(kernel, 2)
  assert rendered[0] and rendered[0][0].op is OptOps.THREAD   # the reference
  assert () not in rendered
  np.testing.assert_allclose(run_with_opts(kernel, inputs, expected, result.opts), expected, rtol=1e-4, atol=1e-4)

def test_verify_runs_twice_only_where_an_element_holds_the_first_poison(fresh_cache):
  """A candidate that writes every element (and computes no all-0xFF value) is verified by one run; one that skips
  elements leaves the first poison there, runs again with the second and is rejected."""
  x = realized(np.zeros(256, np.float32))
  item = create_schedule([x.alu(Ops.MUL, x.const(3.0))])[-1]
  kernel = Kernel(item.ast, Device[DEVICE].renderer)
  beam = search._Search(kernel, 1)
  beam.take_reference(search._Candidate(kernel, "", runner=compile_kernel(DEVICE, kernel.copy())))
  reference = beam.reference[0]
  runs = []
  def candidate(written: np.ndarray) -> search._Candidate:
    def run(buffers, wait=False) -> float:
      runs.append(written)
      current = buffers[0].copyout()
      current[written] = reference[written]
      buffers[0].copyin(current)
      return 1e-6
    return search._Candidate(kernel.copy(), "", runner=run)
  assert beam.verify(candidate(np.ones(256, bool))) and len(runs) == 1
  skipping = np.arange(256) % 7 != 0
  assert not beam.verify(candidate(skipping)) and len(runs) == 3 and beam.stats.rejected == 1

def with_state(kernel: Kernel, state) -> Kernel:
  kernel = kernel.copy()
  kernel.state = state
  return kernel

def sequential_sums(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """a @ b summed over k in order in float32, one term at a time: (with each step one fused multiply-add, with each
  product rounded first). A float32 product is exact in float64, so the fused step is the float64 sum rounded."""
  fused, rounded = np.zeros((a.shape[0], b.shape[1]), np.float32), np.zeros((a.shape[0], b.shape[1]), np.float32)
  for k in range(a.shape[1]):
    product = np.outer(a[:, k].astype(np.float64), b[k].astype(np.float64))
    fused = (fused.astype(np.float64) + product).astype(np.float32)
    rounded = rounded + np.outer(a[:, k], b[k])
  return fused, rounded

@pytest.mark.parametrize("shape", [(64, 100, 32), (24, 40, 64), (7, 33, 48)])
def test_a_big_reference_reads_rows_as_vectors_and_sums_in_order(fresh_cache, monkeypatch, shape):
  """From REFERENCE_THREAD_MIN_WORK loop iterations the reference is split over the cores and upcast along the
  output's contiguous axis. Every element is still the plain sum over K in order: bit for bit the sequential float32
  sum (with or without fused multiply-adds), which the unoptimized kernel itself need not be (LLVM may vectorize its
  reduce loop, reassociating it)."""
  monkeypatch.setattr(search, "REFERENCE_THREAD_MIN_WORK", 1)
  n, k, m = shape
  kernel, inputs, expected = matmul_case(n, k, m)
  state = search._Search(kernel, 1).reference_state()
  upcasts = [opt for opt in state.applied_opts if opt.op is OptOps.UPCAST]
  assert len(upcasts) == 1 and upcasts[0].amount == 16   # 64 bytes of float32: one cache line of B's row a step
  if cpu_count() >= 2 and n % 2 == 0: assert state.threads >= 2
  reference = with_state(kernel, state)
  rng = np.random.default_rng(0)   # matmul_case's inputs
  a, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
  out = run_with_opts(reference, inputs, expected, [])
  assert any(np.array_equal(out.view(np.uint32), s.view(np.uint32)) for s in sequential_sums(a, b))

def lane_swapped(values: np.ndarray, lanes: int) -> np.ndarray:
  """Each run of `lanes` columns with its two halves exchanged: what an output upcast that misplaced its lanes would
  store."""
  rows, columns = values.shape
  pieces = values.reshape(rows, columns // lanes, 2, lanes // 2)
  return pieces[:, :, ::-1].reshape(rows, columns)

def test_the_vectorized_reference_rejects_wrong_kernels(fresh_cache, monkeypatch):
  """Against the big kernels' reference (threads, an output upcast), a candidate that drops one term of each sum,
  stores the lanes of its vectors in the wrong places, pairs A's and B's terms in different orders (A's columns
  reversed: a misplaced UNROLL or SWAP of the reduce) or leaves a column unwritten is rejected; one that writes
  numpy's answer (another order of summation) verifies."""
  monkeypatch.setattr(search, "REFERENCE_THREAD_MIN_WORK", 1)
  n, k, m = 32, 48, 64
  kernel, _, _ = matmul_case(n, k, m)
  beam = search._Search(kernel, 1)
  state = beam.reference_state()
  assert any(opt.op is OptOps.UPCAST for opt in state.applied_opts)
  beam.take_reference(search._Candidate(state, "", runner=compile_kernel(DEVICE, with_state(kernel, state))))
  a, b = (next(x for x in beam.initial.values() if x.size == size).reshape(shape) for size, shape in
          ((n * k, (n, k)), (k * m, (k, m))))   # the search's random inputs
  expected = a @ b
  def candidate(values: np.ndarray, written: np.ndarray) -> search._Candidate:
    def run(buffers, wait=False) -> float:
      current = buffers[0].copyout()
      current[written.ravel()] = values.ravel()[written.ravel()]
      buffers[0].copyin(current)
      return 1e-6
    return search._Candidate(state, "", runner=run)
  everything = np.ones((n, m), bool)
  assert beam.verify(candidate(expected, everything))
  dropped = expected - np.outer(a[:, 0], b[0])
  assert not beam.verify(candidate(dropped, everything))
  assert not beam.verify(candidate(lane_swapped(expected, 16), everything))
  assert not beam.verify(candidate((a[:, ::-1] @ b).astype(np.float32), everything))
  skipped = everything.copy()
  skipped[:, 5] = False
  assert not beam.verify(candidate(expected, skipped))
  assert beam.stats.rejected == 4
