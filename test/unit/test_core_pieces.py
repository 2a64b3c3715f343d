"""The LLVM runtime's THREAD launches and its use of LLVM from several threads: every piece runs once per launch
(runtime.run_on_cores, with more pieces than cores; the core pool's native claiming, cores.py: seeded random launches
of a native kernel of random argument counts, back to back and after the workers went to sleep, from two threads at
once, and in a forked child; each core's home range run from the front and the others' stolen from the back, with 2
and 3 lanes, and every piece once with 3, 4 and 7; more pieces than a lane word counts; a pool made again when THREADS
changes, its old workers leaving), a Python callable's
exception reaches the launching thread, launches from two Python
threads at once both complete, a prepared launch keeps its code alive after its program is gone, compiles and
loads from several threads at once (LLVM used under one lock) while threaded kernels run, the heuristics' pieces
(CPU_PIECES_PER_CORE a core for a big reduce), and threaded sums (seeded random data, odd sizes, 0-d, size 1) against
numpy in float64 at explicit tolerances.
"""
import ctypes, gc, os, threading, time
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.heuristics import CPU_PIECE_MIN_WORK, CPU_PIECES_PER_CORE, hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.device import Device
from tgrad.helpers import Context
from tgrad.ops import Ops
from tgrad.runtime.llvm import cores, runtime
from tgrad.schedule import create_schedule

PIECE_CALL = ctypes.CFUNCTYPE(None, ctypes.c_int)   # a Python callback with the piece index as its only argument

def test_every_piece_runs_once_per_launch():
  seen: list[int] = []
  lock = threading.Lock()
  def record(piece: int) -> None:
    with lock: seen.append(piece)
  call = PIECE_CALL(record)
  for pieces in (1, 2, 3, 5, 16, 33):
    seen.clear()
    runtime.run_on_cores(call, [], pieces)
    assert sorted(seen) == list(range(pieces))

def test_a_piece_error_reaches_the_caller_and_the_next_launch_runs():
  def fail_on_one(piece: int) -> None:
    if piece == 1: raise ZeroDivisionError("piece 1")
  with pytest.raises(ZeroDivisionError): runtime.run_on_cores(fail_on_one, [], 4)
  seen: list[int] = []
  runtime.run_on_cores(seen.append, [], 6)   # a plain Python callable works as fn too
  assert sorted(seen) == list(range(6))

def test_launches_from_two_threads_at_once_both_complete():
  """One launch's piece 0 waits on an event; a second launch from another thread meanwhile runs all its pieces, and
  both finish with every piece run."""
  first_started, release = threading.Event(), threading.Event()
  first: list[int] = []
  second: list[int] = []
  def slow(piece: int) -> None:
    if piece == 0:
      first_started.set()
      assert release.wait(10)
    first.append(piece)
  launcher = threading.Thread(target=runtime.run_on_cores, args=(slow, [], 2))
  launcher.start()
  assert first_started.wait(10)
  runtime.run_on_cores(second.append, [], 3)
  assert sorted(second) == [0, 1, 2]
  release.set()
  launcher.join(10)
  assert sorted(first) == [0, 1]

def _marking_kernel(extra_arguments: int):
  """A native kernel `mark(ptr counts, i64 x1, ..., i32 piece)` that atomically adds 1 to counts[piece] (the extra
  arguments are passed and ignored: every thunk arity is exercised), as a ctypes function."""
  extra = "".join(f", i64 %x{i}" for i in range(extra_arguments))
  ir = f"""define void @mark(ptr %counts{extra}, i32 %piece) {{
  %index = sext i32 %piece to i64
  %slot = getelementptr i32, ptr %counts, i64 %index
  %old = atomicrmw add ptr %slot, i32 1 monotonic
  ret void
}}
"""
  engine, addresses = cores._load(ir, ("mark",))
  fn = ctypes.CFUNCTYPE(None)(addresses["mark"])
  fn.engine = engine
  return fn

def test_native_launches_run_every_piece_exactly_once():
  """Seeded random launches (1-300 pieces, 0-9 extra arguments) of a kernel counting its pieces: back to back (the
  workers spinning), and some after a pause longer than the spin (the workers asleep, woken by the launch)."""
  rng = np.random.default_rng(7)
  kernels = {extra: _marking_kernel(extra) for extra in range(10)}
  for launch in range(300):
    pieces, extra = int(rng.integers(1, 301)), int(rng.integers(0, 10))
    counts = np.zeros(pieces, np.int32)
    pointers = [ctypes.c_void_p(counts.ctypes.data)] + [ctypes.c_int64(int(v)) for v in rng.integers(-9, 9, extra)]
    if launch % 50 == 49: time.sleep(2 * cores.SPIN_MICROSECONDS * 1e-6)
    runtime.run_on_cores(kernels[extra], pointers, pieces)
    assert (counts == 1).all(), (launch, pieces, extra, np.flatnonzero(counts != 1))

def test_native_launches_from_two_threads_at_once():
  """Two Python threads launch 200 times each at once: one holds the pool, the other runs its pieces itself; every
  launch runs each piece once."""
  kernel = _marking_kernel(0)
  failures: list = []
  def launch_many(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(200):
      counts = np.zeros(int(rng.integers(1, 64)), np.int32)
      runtime.run_on_cores(kernel, [ctypes.c_void_p(counts.ctypes.data)], len(counts))
      if not (counts == 1).all(): failures.append(counts.copy())
  threads = [threading.Thread(target=launch_many, args=(seed,)) for seed in (1, 2)]
  for thread in threads: thread.start()
  for thread in threads: thread.join(60)
  assert not failures

@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_launches_on_a_pool_of_its_own():
  kernel = _marking_kernel(1)
  counts = np.zeros(40, np.int32)
  runtime.run_on_cores(kernel, [ctypes.c_void_p(counts.ctypes.data), ctypes.c_int64(0)], 40)   # the parent's pool
  child = os.fork()
  if child == 0:
    counts[:] = 0
    runtime.run_on_cores(kernel, [ctypes.c_void_p(counts.ctypes.data), ctypes.c_int64(0)], 40)
    os._exit(0 if (counts == 1).all() else 1)
  _, status = os.waitpid(child, 0)
  assert os.WEXITSTATUS(status) == 0

def _sum_program(size: int, tag: str):
  """A fresh LLVM program summing `size` float32 (a name of its own, so nothing is cached) and its kernel name."""
  renderer = Device["LLVM"].renderer
  [item] = [i for i in create_schedule([Tensor.empty(size).sum().lazydata]) if i.ast.op is Ops.SINK]
  name = f"sum_{tag}"
  source = renderer.render(name, linearize(Kernel(item.ast, renderer)))
  return runtime.LLVMProgram(name, Device["LLVM"].compiler.compile(source))

def _handles(*arrays):
  return [runtime.HostMemory(a, a.ctypes.data) for a in arrays]

def test_a_prepared_launch_keeps_its_code_after_the_program_goes():
  rng = np.random.default_rng(0)
  x, out = rng.standard_normal(1000).astype(np.float32), np.zeros(1, np.float32)
  launch = _sum_program(1000, "kept").prepare(_handles(out.view(np.uint8), x.view(np.uint8)))
  gc.collect()   # the program is gone; its engine lives on in the launch
  _sum_program(1000, "other")   # a later load frees retired engines (not this one: the launch still holds it)
  launch()
  assert out[0] == pytest.approx(x.astype(np.float64).sum(), rel=1e-5, abs=1e-4)

def test_compiles_and_loads_from_several_threads_while_kernels_run():
  """Four threads compile and load programs (each then dropped, its engine retired and freed by a later load) while
  the main thread runs a threaded sum: every result is right and nothing crashes."""
  errors: list[BaseException] = []
  def compile_some(index: int) -> None:
    try:
      rng = np.random.default_rng(index)
      for round_ in range(3):
        size = int(rng.integers(100, 5000))
        x, out = rng.standard_normal(size).astype(np.float32), np.zeros(1, np.float32)
        program = _sum_program(size, f"t{index}_{round_}")
        program(*_handles(out.view(np.uint8), x.view(np.uint8)))
        assert out[0] == pytest.approx(x.astype(np.float64).sum(), rel=1e-4, abs=1e-3)
        del program
    except BaseException as error:   # noqa: BLE001 (checked on the main thread)
      errors.append(error)
  workers = [threading.Thread(target=compile_some, args=(i,)) for i in range(4)]
  for worker in workers: worker.start()
  x = np.random.default_rng(9).standard_normal(1 << 20).astype(np.float32)
  with Context(THREADS=4):
    for _ in range(5):
      assert float(Tensor(x).sum().numpy()) == pytest.approx(x.astype(np.float64).sum(), rel=1e-4, abs=1e-2)
  for worker in workers: worker.join(120)
  assert not errors, errors

# |tgrad − float64| ≤ rtol·|float64| + √n·SUM_ATOL_PER_ROOT·max|x| (blocked partial sums with compensated totals)
RTOL, SUM_ATOL_PER_ROOT = 2e-6, 1e-6

@pytest.mark.parametrize("seed", range(2))
def test_threaded_sums_match_float64(seed):
  rng = np.random.default_rng(seed)
  with Context(THREADS=2):
    for size in (int(rng.integers(1 << 17, 1 << 19)) | 1, 1, (1 << 21) + 3, 1 << 22):
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
  """A 16M-float sum's partials and a softmax's rows: CPU_PIECES_PER_CORE pieces a core; a smaller reduce fewer pieces
  of CPU_PIECE_MIN_WORK at least; a matmul: one piece a core."""
  with Context(THREADS=2):
    pieces = 2 * CPU_PIECES_PER_CORE
    assert _heuristic_threads(Tensor.empty(1 << 24).sum())[0] == pieces
    assert _heuristic_threads(Tensor.empty(2048, 2048).softmax(-1)) == [pieces]
    small = 256 * 1024 // CPU_PIECE_MIN_WORK   # 2^18 loop iterations
    assert _heuristic_threads(Tensor.empty(256, 1024).sum(-1)) == [small]
    assert _heuristic_threads(Tensor.empty(512, 512) @ Tensor.empty(512, 512)) == [2]

def test_the_pool_follows_threads_and_a_closed_pool_workers_leave():
  """THREADS sets the cores a launch may use: under THREADS=3 the pool has 2 workers; back at the default it is made
  again (machine cores − 1) and the old one's workers leave, spinning or asleep; launches run every piece once
  throughout."""
  from tgrad.helpers import machine_cores
  kernel = _marking_kernel(0)
  def launch(pieces: int) -> None:
    counts = np.zeros(pieces, np.int32)
    runtime.run_on_cores(kernel, [ctypes.c_void_p(counts.ctypes.data)], pieces)
    assert (counts == 1).all()
  with Context(THREADS=3):
    launch(40)
    old = cores.core_pool()
    assert old.workers == 2 and all(t.is_alive() for t in old.threads)
  time.sleep(2 * cores.SPIN_MICROSECONDS * 1e-6)   # the old workers asleep by now
  launch(40)
  new = cores.core_pool()
  assert new is not old and new.workers == machine_cores() - 1
  for thread in old.threads: thread.join(10)
  assert not any(t.is_alive() for t in old.threads)
  launch(7)
  with Context(THREADS=3): launch(9)   # right after a launch: the default pool's workers leave while spinning
  for thread in new.threads: thread.join(10)
  assert not any(t.is_alive() for t in new.threads)
  launch(11)

def _home_then_stolen(sequence: list[int], home: range, other: range) -> bool:
  """Whether a core's pieces, in the order it ran them, are its home range's from the front, then the other lane's
  from the back (with two lanes, its only thief takes the other's last piece first)."""
  own = 0
  while own < len(sequence) and sequence[own] == home.start + own: own += 1
  stolen = sequence[own:]
  return own <= len(home) and stolen == list(range(other.stop - 1, other.stop - 1 - len(stolen), -1))

def test_each_core_runs_its_home_range_from_the_front_and_steals_from_the_back():
  """Two lanes (THREADS=2): the launching thread's home range is pieces 0 .. P/2 - 1, the worker's the rest. Whatever
  the timing, each core runs its own from the front and then steals the other's from the back; every piece runs once.
  The launching thread's piece 0 is slow here, so the worker, done with its own, always steals."""
  with Context(THREADS=2):
    for pieces in (4, 7, 32, 33):
      ran: list[tuple[int, int]] = []
      lock = threading.Lock()
      main = threading.get_ident()
      def record(piece: int) -> None:
        if piece == 0 and threading.get_ident() == main: time.sleep(0.05)
        with lock: ran.append((piece, threading.get_ident()))
      runtime.run_on_cores(PIECE_CALL(record), [], pieces)
      assert sorted(p for p, _ in ran) == list(range(pieces))
      lanes = (range(0, pieces // 2), range(pieces // 2, pieces))
      mine = [p for p, who in ran if who == main]
      theirs = [p for p, who in ran if who != main]
      assert _home_then_stolen(mine, lanes[0], lanes[1]), (pieces, mine)
      assert _home_then_stolen(theirs, lanes[1], lanes[0]), (pieces, theirs)
      if mine[:1] == [0]: assert set(theirs) & set(lanes[0]), (pieces, mine, theirs)

def test_a_launch_of_more_pieces_than_a_lane_counts_runs_them_all():
  kernel = _marking_kernel(0)
  counts = np.zeros(cores.MAX_POOL_PIECES + 5, np.int32)
  runtime.run_on_cores(kernel, [ctypes.c_void_p(counts.ctypes.data)], len(counts))
  assert (counts == 1).all()

@pytest.mark.parametrize("threads", [3, 4, 7])
def test_many_lanes_run_every_piece_exactly_once(threads):
  """More lanes than this machine has cores (THREADS 3, 4, 7: workers that are often descheduled, so lanes are stolen
  from in every order): seeded random launches of 1-200 pieces, fewer pieces than lanes included, each piece once."""
  rng = np.random.default_rng(threads)
  kernel = _marking_kernel(1)
  with Context(THREADS=threads):
    for launch in range(150):
      pieces = int(rng.integers(1, 201)) if launch % 3 else int(rng.integers(1, threads + 1))
      counts = np.zeros(pieces, np.int32)
      runtime.run_on_cores(kernel, [ctypes.c_void_p(counts.ctypes.data), ctypes.c_int64(launch)], pieces)
      assert (counts == 1).all(), (threads, launch, pieces, np.flatnonzero(counts != 1))

def test_each_lane_runs_its_home_range_in_order():
  """Three lanes (THREADS=3), every core's pieces recorded with the order it ran them: each core's sequence is its own
  home range from the front (c·P/3 ..), then pieces stolen from the backs of the other ranges, and every piece runs
  once."""
  with Context(THREADS=3):
    for pieces in (3, 9, 31):
      ran: list[tuple[int, int]] = []
      lock = threading.Lock()
      def record(piece: int) -> None:
        with lock: ran.append((piece, threading.get_ident()))
      runtime.run_on_cores(PIECE_CALL(record), [], pieces)
      assert sorted(p for p, _ in ran) == list(range(pieces))
      homes = [range(c * pieces // 3, (c + 1) * pieces // 3) for c in range(3)]
      by_core: dict[int, list[int]] = {}
      for piece, who in ran: by_core.setdefault(who, []).append(piece)
      for sequence in by_core.values():
        home = next((h for h in homes if sequence[0] == h.start), None)   # a core that ran its own first piece
        if home is None: continue                                        # (else all it ran was stolen)
        own = 0
        while own < min(len(sequence), len(home)) and sequence[own] == home.start + own: own += 1
        stolen = sequence[own:]
        assert not any(p in home for p in stolen), (pieces, sequence)   # a core never steals from its own range
        for h in homes:   # what it stole from one range, it took from the back: descending
          taken = [p for p in stolen if p in h]
          assert taken == sorted(taken, reverse=True), (pieces, sequence)
