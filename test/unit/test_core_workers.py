"""The LLVM runtime's core launches (runtime.run_on_cores): every core index runs once per launch, a core's exception
reaches the launching thread and leaves the workers usable, launches from two Python threads at once both complete
(the second one's cores run on its own thread), the heuristics' pieces (CPU_CHUNKS_PER_CORE a core for a big
reduce), and threaded sums (seeded random data, odd sizes, 0-d, size 1) match
numpy in float64 at explicit tolerances.
"""
import ctypes, threading
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.heuristics import CPU_CHUNKS_PER_CORE, hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, OptOps
from tgrad.device import Device
from tgrad.helpers import Context
from tgrad.ops import Ops
from tgrad.runtime.llvm import runtime
from tgrad.schedule import create_schedule

CORE_CALL = ctypes.CFUNCTYPE(None, ctypes.c_int)   # a Python callback with the core index as its only argument

def test_every_core_runs_once_per_launch():
  seen: list[int] = []
  lock = threading.Lock()
  def record(core: int) -> None:
    with lock: seen.append(core)
  call = CORE_CALL(record)
  for threads in (1, 2, 3, 5):
    seen.clear()
    runtime.run_on_cores(call, [], threads)
    assert sorted(seen) == list(range(threads))

def test_a_core_error_reaches_the_caller_and_workers_go_on():
  def fail_on_one(core: int) -> None:
    if core == 1: raise ZeroDivisionError("core 1")
  errors: list[BaseException] = []
  # ctypes prints (does not propagate) an exception raised inside a callback; wrap it so the worker sees one
  def run(fn, pointers, threads):
    def outer(*arguments):
      try: fn(*arguments)
      except BaseException as error:   # noqa: BLE001
        errors.append(error)
        raise
    runtime.run_on_cores(outer, pointers, threads)
  with pytest.raises(ZeroDivisionError): run(fail_on_one, [], 2)
  assert len(errors) == 1
  seen: list[int] = []
  runtime.run_on_cores(lambda core: seen.append(core), [], 2)   # a plain Python callable works as fn too
  assert sorted(seen) == [0, 1]

def test_launches_from_two_threads_at_once_both_complete():
  """One launch holds the workers (its core 0 waits on an event); a second launch from another thread meanwhile runs
  all its cores itself, and both finish with every core run."""
  first_started, release = threading.Event(), threading.Event()
  first: list[int] = []
  second: list[int] = []
  def slow(core: int) -> None:
    if core == 0:
      first_started.set()
      assert release.wait(10)
    first.append(core)
  launcher = threading.Thread(target=runtime.run_on_cores, args=(slow, [], 2))
  launcher.start()
  assert first_started.wait(10)
  runtime.run_on_cores(lambda core: second.append(core), [], 3)   # while the first holds the workers
  assert sorted(second) == [0, 1, 2]
  release.set()
  launcher.join(10)
  assert sorted(first) == [0, 1]

# |tgrad − float64| ≤ rtol·|float64| + √n·SUM_ATOL_PER_ROOT·max|x| (blocked partial sums with compensated totals)
RTOL, SUM_ATOL_PER_ROOT = 2e-6, 1e-6

@pytest.mark.parametrize("seed", range(3))
def test_threaded_sums_match_float64(seed):
  rng = np.random.default_rng(seed)
  with Context(THREADS=2):
    for size in (int(rng.integers(1 << 17, 1 << 19)) | 1, 1, (1 << 18) + 3):
      x = rng.standard_normal(size).astype(np.float32) * np.float32(rng.uniform(0.1, 100))
      got = float(Tensor(x).sum().numpy())
      want = x.astype(np.float64).sum()
      atol = SUM_ATOL_PER_ROOT * np.sqrt(size) * float(np.abs(x).max())
      assert abs(got - want) <= RTOL * abs(want) + atol, (size, got, want)
      m = x[: size - size % 4].reshape(-1, 4) if size >= 4 else x.reshape(1, -1)
      np.testing.assert_allclose(Tensor(m).sum(0).numpy().astype(np.float64), m.astype(np.float64).sum(0),
                                 rtol=RTOL, atol=SUM_ATOL_PER_ROOT * np.sqrt(m.shape[0]) * float(np.abs(m).max()))
    scalar = np.float32(rng.standard_normal())
    assert float(Tensor(scalar).sum().numpy()) == pytest.approx(float(scalar), rel=1e-7)

def _heuristic_threads(out) -> list[int]:
  """The THREAD amounts the CPU heuristics give each kernel of out's schedule (0: not threaded)."""
  amounts = []
  for item in create_schedule([out.lazydata]):
    if item.ast.op is not Ops.SINK: continue
    kernel = Kernel(item.ast, Device["LLVM"].renderer)
    hand_coded_optimizations(kernel)
    amounts.append(next((opt.amount for opt in kernel.applied_opts if opt.op is OptOps.THREAD), 0))
  return amounts

def test_big_reduces_are_cut_into_pieces_and_small_ones_and_matmuls_are_not():
  """A 16M-float sum's partials and a softmax's rows: CPU_CHUNKS_PER_CORE pieces a core; a reduce with too little
  work a piece, and a matmul: one piece a core."""
  with Context(THREADS=2):
    pieces = 2 * CPU_CHUNKS_PER_CORE
    assert _heuristic_threads(Tensor.empty(1 << 24).sum())[0] == pieces
    assert _heuristic_threads(Tensor.empty(2048, 2048).softmax(-1)) == [pieces]
    assert _heuristic_threads(Tensor.empty(256, 1024).sum(-1)) == [2]   # 2^18 loop iterations: 2 pieces
    assert _heuristic_threads(Tensor.empty(512, 512) @ Tensor.empty(512, 512)) == [2]
