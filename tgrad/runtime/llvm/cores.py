"""THREAD launches on the host's cores: a pool of native workers that claim pieces without Python in between.

A THREAD launch calls a kernel once per piece index (`fn(*arguments, piece)`). Each core has a home range of the
pieces, a contiguous share in launch order (core c of C: pieces c·P/C up to (c+1)·P/C), which it runs from the front;
a core that has run its own steals from the back of another's, so a core slowed by another process takes fewer. The
same core thus reads the same part of the data on every launch: where the host's cores sit on different last-level
caches (this project's 2-core VM: a 64 MB buffer summed again and again), a repeated launch finds its data in its own
core's cache, as with OpenMP's static schedule, instead of in the other's (docs/benchmarks.md, "CPU, eleventh
session"). Everything between a launch and its last piece runs in native code (a small LLVM module, compiled once per
process):

  - **The task word and the lanes.** A 64-bit word holds the launch's generation (high half) and its piece count (low
    half); the workers watch it. Each core's home range is a lane word, on a cache line of its own: the generation
    (high half), the next piece of the range (bits 16-31) and its end (bits 0-15). A core claims its next piece by
    compare-and-swap of (generation, next, end) → (generation, next + 1, end), and steals another lane's last by
    (generation, next, end) → (generation, next, end - 1), so a core still working on an older launch can never take
    a piece of a newer one, and no piece runs twice. The task's kernel, argument array and argument thunk sit beside
    the word; a core reads them only after a claim succeeds, when the launch cannot finish (and be replaced) before
    its piece does.
  - **Finishing.** Each core counts a piece it ran into `finished` (release); the launching thread (lane 0) claims
    pieces like any core, then waits for `finished == pieces` (acquire), which makes every piece's writes visible to
    it.
  - **Workers** (cpu_count() - 1 daemon threads: THREADS where set; worker i has lane i + 1) spin on the word for
    SPIN_MICROSECONDS after their last piece, so back-to-back launches (a decode step's ~90) start on every core
    within a microsecond instead of the 40-60 µs a sleeping thread takes to wake here. Past that they sleep on a
    condition variable, which the next launch notifies.
  - **Thunks.** A kernel takes its pointers and int64 variables, then the i32 piece (renderer.py). The task keeps its
    arguments as an int64 array; one thunk per argument count loads them and calls the kernel, relying on the C
    calling conventions of x86-64 and AArch64 passing a pointer and an int64 the same way.

One launch at a time uses the pool; a launch that finds it busy (another Python thread's) runs its pieces on its own
thread. A plain Python callable (not a ctypes function) runs its pieces in order on the calling thread.
Measured (2-core Zen 4 VM): a launch of two 20 µs pieces took 55-77 µs with a thread pool woken per launch, and the
gemma-3-270m CPU decode step makes ~90 two-piece launches: docs/benchmarks.md, "CPU, ninth session".
"""
from __future__ import annotations
import atexit, ctypes, functools, os, threading
from typing import Callable, Sequence
import llvmlite.binding as llvm
from tgrad.helpers import cpu_count
from tgrad.runtime.llvm import target

# How long an idle worker spins for the next launch before it sleeps. A decode step's launches come every 30-300 µs,
# but an eager call's Python between two launches takes up to ~600 µs when the last kernel streamed the caches out (a
# 64 MB sum). A sleeping worker is woken onto the launching thread's core (Linux places a woken thread beside its
# waker), and the two share that core for the launch. Measured on this 2-core VM (`python bench/cpu_spin.py`:
# `x.sum().realize()` of 16M float32 in bursts of 9 calls after a 0.15 s pause, spins alternated in one process):
# 300 µs 2,401-2,772 µs a call, the worker woken in about half the calls; 1,000 µs 1,038-2,050, one wake in ~100
# calls; 300 µs with the worker and the caller pinned to different cores 2,083. A spinning worker takes a core from
# other processes, so the spin stays at a millisecond.
SPIN_MICROSECONDS = 1000
GENERATION_SHIFT = 32
LOW_HALF = (1 << GENERATION_SHIFT) - 1
NEXT_SHIFT = 16                      # a lane word: generation << 32 | next << 16 | end
PIECE_MASK = (1 << NEXT_SHIFT) - 1
MAX_POOL_PIECES = PIECE_MASK         # a launch of more pieces runs them on the calling thread (none the opts make)
LANE_WORDS = 8                       # 64 bytes between lane words: each core claims on a cache line of its own

class TaskState(ctypes.Structure):
  """The shared task: the word (generation << 32 | pieces), how many pieces ran, what to run, whether the pool is
  closed (its workers then leave), and the lane words (one a core, LANE_WORDS apart). pool_ir's %Task is this struct,
  its fields by these indices."""
  _fields_ = [("word", ctypes.c_uint64), ("finished", ctypes.c_uint32), ("thunk", ctypes.c_void_p),
              ("fn", ctypes.c_void_p), ("args", ctypes.c_void_p), ("closed", ctypes.c_uint32),
              ("lanes", ctypes.c_void_p), ("lane_count", ctypes.c_uint32)]

FIELD = {name: index for index, (name, _) in enumerate(TaskState._fields_)}
IR_TYPES = {ctypes.c_uint64: "i64", ctypes.c_uint32: "i32", ctypes.c_void_p: "ptr"}
TASK_TYPE = "{ " + ", ".join(IR_TYPES[kind] for _, kind in TaskState._fields_) + " }"

def _field(name: str) -> str:
  """The IR of a pointer to the task's field `name` (in a function whose task argument is %task)."""
  return f"getelementptr %Task, ptr %task, i32 0, i32 {FIELD[name]}"

def _pause_asm() -> str:
  return "yield" if llvm.get_process_triple().startswith(("aarch64", "arm64")) else "pause"

def pool_ir() -> str:
  """The pool's native functions: pool_launch, pool_finish, pool_spin (see the module docstring), and pool_serial
  (every piece on the calling thread)."""
  return f"""%Task = type {TASK_TYPE}
declare i32 @clock_gettime(i32, ptr)
declare i32 @sched_yield()

define internal i64 @now_ns() {{
  %ts = alloca [2 x i64]
  call i32 @clock_gettime(i32 1, ptr %ts)
  %s = load i64, ptr %ts
  %nsp = getelementptr [2 x i64], ptr %ts, i64 0, i64 1
  %ns = load i64, ptr %nsp
  %sns = mul i64 %s, 1000000000
  %t = add i64 %sns, %ns
  ret i64 %t
}}

; one pause; on every 256th call (counted by %i) also whether %spin_ns have passed since %start
define internal i1 @relax_expired(i64 %i, i64 %start, i64 %spin_ns) {{
entry:
  call void asm sideeffect "{_pause_asm()}", ""()
  %tick = and i64 %i, 255
  %check = icmp eq i64 %tick, 0
  br i1 %check, label %clock, label %not_yet
clock:
  %now = call i64 @now_ns()
  %spent = sub i64 %now, %start
  %long = icmp sgt i64 %spent, %spin_ns
  ret i1 %long
not_yet:
  ret i1 false
}}

; lane %l's word
define internal ptr @lane_word(ptr %task, i32 %l) {{
  %lanesp = {_field('lanes')}
  %lanes = load ptr, ptr %lanesp
  %l64 = zext i32 %l to i64
  %slot = mul i64 %l64, {LANE_WORDS}
  %p = getelementptr i64, ptr %lanes, i64 %slot
  ret ptr %p
}}

; a piece of generation %gen from lane %l: its next (%steal false) or its last (%steal true); -1 when it has none
define internal i32 @claim(ptr %task, i32 %l, i64 %gen, i1 %steal) {{
entry:
  %p = call ptr @lane_word(ptr %task, i32 %l)
  %first = load atomic i64, ptr %p acquire, align 8
  br label %check
check:
  %cur = phi i64 [%first, %entry], [%seen, %lost]
  %g = lshr i64 %cur, {GENERATION_SHIFT}
  %same = icmp eq i64 %g, %gen
  %shifted = lshr i64 %cur, {NEXT_SHIFT}
  %next = and i64 %shifted, {PIECE_MASK}
  %end = and i64 %cur, {PIECE_MASK}
  %some = icmp ult i64 %next, %end
  %ok = and i1 %same, %some
  br i1 %ok, label %try, label %none
try:
  %delta = select i1 %steal, i64 -1, i64 {1 << NEXT_SHIFT}
  %new = add i64 %cur, %delta
  %pair = cmpxchg ptr %p, i64 %cur, i64 %new acq_rel acquire
  %seen = extractvalue {{ i64, i1 }} %pair, 0
  %won = extractvalue {{ i64, i1 }} %pair, 1
  br i1 %won, label %got, label %lost
lost:
  br label %check
got:
  %last = sub i64 %end, 1
  %piece64 = select i1 %steal, i64 %last, i64 %next
  %piece = trunc i64 %piece64 to i32
  ret i32 %piece
none:
  ret i32 -1
}}

; run claimed piece %piece and count it
define internal void @run_piece(ptr %task, i32 %piece) {{
  %finp = {_field('finished')}
  %thunkp = {_field('thunk')}
  %fnp = {_field('fn')}
  %argsp = {_field('args')}
  %thunk = load ptr, ptr %thunkp
  %fn = load ptr, ptr %fnp
  %args = load ptr, ptr %argsp
  call void %thunk(ptr %fn, ptr %args, i32 %piece)
  %unused = atomicrmw add ptr %finp, i32 1 release
  ret void
}}

; run pieces of generation %gen, lane by lane from %lane's own: its own from the front, the others' from their backs
define internal void @work(ptr %task, i32 %gen, i32 %lane) {{
entry:
  %countp = {_field('lane_count')}
  %count = load i32, ptr %countp
  %gen64 = zext i32 %gen to i64
  br label %scan
scan:
  %i = phi i32 [0, %entry], [%i1, %empty]
  %more = icmp ult i32 %i, %count
  br i1 %more, label %look, label %done
look:
  %v0 = add i32 %lane, %i
  %victim = urem i32 %v0, %count
  %steal = icmp ne i32 %i, 0
  %piece = call i32 @claim(ptr %task, i32 %victim, i64 %gen64, i1 %steal)
  %got = icmp sge i32 %piece, 0
  br i1 %got, label %run, label %empty
run:
  call void @run_piece(ptr %task, i32 %piece)
  br label %look
empty:
  %i1 = add i32 %i, 1
  br label %scan
done:
  ret void
}}

; publish a launch of %pieces pieces, each lane's home range first; returns its generation
define i32 @pool_launch(ptr %task, ptr %thunk, ptr %fn, ptr %args, i32 %pieces) {{
entry:
  %wordp = {_field('word')}
  %finp = {_field('finished')}
  %thunkp = {_field('thunk')}
  %fnp = {_field('fn')}
  %argsp = {_field('args')}
  %countp = {_field('lane_count')}
  store ptr %thunk, ptr %thunkp
  store ptr %fn, ptr %fnp
  store ptr %args, ptr %argsp
  store atomic i32 0, ptr %finp monotonic, align 4
  %old = load atomic i64, ptr %wordp monotonic, align 8
  %oldgen = lshr i64 %old, {GENERATION_SHIFT}
  %gen = add i64 %oldgen, 1
  %gen32 = trunc i64 %gen to i32
  %high = shl i64 %gen, {GENERATION_SHIFT}
  %count32 = load i32, ptr %countp
  %count = zext i32 %count32 to i64
  %total = zext i32 %pieces to i64
  br label %lanes
lanes:
  %l = phi i64 [0, %entry], [%l1, %lanes]
  %startmul = mul i64 %l, %total
  %start = udiv i64 %startmul, %count
  %l1 = add i64 %l, 1
  %endmul = mul i64 %l1, %total
  %end = udiv i64 %endmul, %count
  %startbits = shl i64 %start, {NEXT_SHIFT}
  %range = or i64 %startbits, %end
  %laneword = or i64 %high, %range
  %l32 = trunc i64 %l to i32
  %lp = call ptr @lane_word(ptr %task, i32 %l32)
  store atomic i64 %laneword, ptr %lp monotonic, align 8
  %again = icmp ult i64 %l1, %count
  br i1 %again, label %lanes, label %publish
publish:
  %word = or i64 %high, %total
  store atomic i64 %word, ptr %wordp release, align 8
  ret i32 %gen32
}}

; the launching thread: run pieces of %gen, then wait until all %pieces have run (yielding the core after %spin_ns)
define void @pool_finish(ptr %task, i32 %gen, i32 %pieces, i64 %spin_ns) {{
entry:
  %finp = {_field('finished')}
  call void @work(ptr %task, i32 %gen, i32 0)
  %start = call i64 @now_ns()
  br label %wait
wait:
  %i = phi i64 [0, %entry], [%i1, %relaxed], [%i1, %yield]
  %done = load atomic i32, ptr %finp acquire, align 4
  %all = icmp eq i32 %done, %pieces
  br i1 %all, label %out, label %relaxed
relaxed:
  %i1 = add i64 %i, 1
  %long = call i1 @relax_expired(i64 %i1, i64 %start, i64 %spin_ns)
  br i1 %long, label %yield, label %wait
yield:
  call i32 @sched_yield()
  br label %wait
out:
  ret void
}}

; worker of lane %lane: run every new launch's pieces; return the last generation seen once idle for %spin_ns
define i32 @pool_spin(ptr %task, i32 %last, i64 %spin_ns, i32 %lane) {{
entry:
  %wordp = {_field('word')}
  %closedp = {_field('closed')}
  %start0 = call i64 @now_ns()
  br label %look
look:
  %seen = phi i32 [%last, %entry], [%seen, %relaxed], [%g32, %worked]
  %start = phi i64 [%start0, %entry], [%start, %relaxed], [%after, %worked]
  %i = phi i64 [0, %entry], [%i1, %relaxed], [0, %worked]
  %closed = load atomic i32, ptr %closedp monotonic, align 4
  %leaving = icmp ne i32 %closed, 0
  br i1 %leaving, label %idle, label %open
open:
  %w = load atomic i64, ptr %wordp acquire, align 8
  %g = lshr i64 %w, {GENERATION_SHIFT}
  %g32 = trunc i64 %g to i32
  %new = icmp ne i32 %g32, %seen
  br i1 %new, label %worked, label %relaxed
worked:
  call void @work(ptr %task, i32 %g32, i32 %lane)
  %after = call i64 @now_ns()
  br label %look
relaxed:
  %i1 = add i64 %i, 1
  %long = call i1 @relax_expired(i64 %i1, i64 %start, i64 %spin_ns)
  br i1 %long, label %idle, label %look
idle:
  ret i32 %seen
}}

; every piece on the calling thread, in order
define void @pool_serial(ptr %thunk, ptr %fn, ptr %args, i32 %pieces) {{
entry:
  br label %loop
loop:
  %p = phi i32 [0, %entry], [%p1, %body]
  %more = icmp slt i32 %p, %pieces
  br i1 %more, label %body, label %out
body:
  call void %thunk(ptr %fn, ptr %args, i32 %p)
  %p1 = add i32 %p, 1
  br label %loop
out:
  ret void
}}
"""

def thunk_ir(arguments: int) -> str:
  """`thunk_<n>(ptr fn, ptr args, i32 piece)`: fn(args[0], ..., args[n-1], piece), each argument an i64."""
  loads = "".join(f"  %p{i} = getelementptr i64, ptr %args, i64 {i}\n  %a{i} = load i64, ptr %p{i}\n"
                  for i in range(arguments))
  passed = "".join(f"i64 %a{i}, " for i in range(arguments))
  return f"""define void @thunk_{arguments}(ptr %fn, ptr %args, i32 %piece) {{
{loads}  call void %fn({passed}i32 %piece)
  ret void
}}
"""

def _load(ir: str, names: Sequence[str]) -> tuple:
  """Compile `ir` into an engine of its own (kept for the process) and give (engine, {name: address})."""
  with target.llvm_lock:
    llvm.initialize_native_asmparser()   # the pause hint is inline assembly
    module = llvm.parse_assembly(ir)
    module.triple = llvm.get_process_triple()
    module.verify()
    engine = llvm.create_mcjit_compiler(module, target.host_target_machine())
    engine.finalize_object()
    return engine, {name: engine.get_function_address(name) for name in names}

class _Native:
  """The pool's compiled functions and the thunks by argument count (compiled on first use)."""
  def __init__(self):
    self.engine, found = _load(pool_ir(), ("pool_launch", "pool_finish", "pool_spin", "pool_serial"))
    self.launch = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_int32)(found["pool_launch"])
    self.finish = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                                   ctypes.c_int64)(found["pool_finish"])
    self.spin = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64,
                                 ctypes.c_int32)(found["pool_spin"])
    self.serial = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_int32)(found["pool_serial"])
    self.thunks: dict[int, tuple] = {}
    self.lock = threading.Lock()
  def thunk(self, arguments: int) -> int:
    """The address of the thunk for kernels of `arguments` arguments (before the piece)."""
    if (found := self.thunks.get(arguments)) is None:
      with self.lock:
        if (found := self.thunks.get(arguments)) is None:
          engine, addresses = _load(thunk_ir(arguments), (f"thunk_{arguments}",))
          found = self.thunks[arguments] = (engine, addresses[f"thunk_{arguments}"])
    return found[1]

@functools.cache
def _native() -> _Native: return _Native()

class CorePool:
  """`workers` worker threads and the shared task (module docstring). `close()` sends the workers away."""
  def __init__(self, workers: int):
    self.native = _native()
    self.task = TaskState()
    self.address = ctypes.addressof(self.task)
    self.lanes = (ctypes.c_uint64 * (LANE_WORDS * (workers + 1)))()   # lane 0: the launching thread
    self.task.lanes, self.task.lane_count = ctypes.addressof(self.lanes), workers + 1
    self.busy = threading.Lock()
    self.wake = threading.Condition()
    self.sleepers, self.workers, self.closed = 0, workers, False
    self.spin_ns = SPIN_MICROSECONDS * 1000
    self.threads = [threading.Thread(target=self._serve, args=(index + 1,), name=f"tgrad-core-{index + 1}",
                                     daemon=True) for index in range(workers)]
    for thread in self.threads: thread.start()
  def _generation(self) -> int: return self.task.word >> GENERATION_SHIFT
  def _serve(self, lane: int) -> None:
    last = self._generation()
    while not self.closed:
      last = self.native.spin(self.address, last, self.spin_ns, lane) & LOW_HALF
      with self.wake:
        self.sleepers += 1
        while not self.closed and self._generation() == last: self.wake.wait()
        self.sleepers -= 1
  def run(self, thunk: int, fn: int, args: ctypes.Array, pieces: int) -> None:
    """Every piece of fn over args, on this thread and the workers; returns when all have run."""
    if pieces > MAX_POOL_PIECES or not self.busy.acquire(blocking=False):   # more than a lane word counts, or
      self.native.serial(thunk, fn, ctypes.addressof(args), pieces)          # another thread's launch holds the pool
      return
    try:
      generation = self.native.launch(self.address, thunk, fn, ctypes.addressof(args), pieces)
      if self.sleepers:
        with self.wake: self.wake.notify_all()
      self.native.finish(self.address, generation, pieces, self.spin_ns)
    finally: self.busy.release()
  def close(self) -> None:
    """Send the workers away (after the launch running now, if any): each leaves its spin or its sleep."""
    with self.busy:
      self.closed, self.task.closed = True, 1
      with self.wake: self.wake.notify_all()

_pool: CorePool | None = None
_pool_lock = threading.Lock()

def core_pool() -> CorePool:
  """The process's pool, of cpu_count() - 1 workers (THREADS, where set, is the cores a launch may use: a pool made
  under another THREADS is closed and made again)."""
  global _pool
  workers = cpu_count() - 1
  if _pool is None or _pool.workers != workers:
    with _pool_lock:
      if _pool is None or _pool.workers != workers:
        if _pool is not None: _pool.close()
        _pool = CorePool(workers)
  return _pool

def _forget_pool() -> None:
  """In a forked child: the parent's workers are not there; the child starts a pool of its own on first use (and a
  lock another thread held at the fork is free in the child)."""
  global _pool, _pool_lock
  _pool, _pool_lock = None, threading.Lock()
  if _native.cache_info().currsize: _native().lock = threading.Lock()

os.register_at_fork(after_in_child=_forget_pool)

WORKER_EXIT_SECONDS = 1.0   # how long the process's exit waits for each worker to leave

@atexit.register
def _close_pool_at_exit() -> None:
  """At interpreter exit, before modules (and the engine holding the pool's code) go away: the workers leave their
  spin, which runs that code, and their threads end."""
  if (pool := _pool) is None: return
  pool.close()
  for thread in pool.threads: thread.join(WORKER_EXIT_SECONDS)

class PieceLauncher:
  """A kernel's THREAD launches in `pieces` pieces, its address and the thunk for its argument count resolved once:
  `launcher(pointers)` launches on one call's arguments, `prepared(pointers)` binds them for replays."""
  __slots__ = ("fn", "thunk", "arguments", "pieces", "keep")
  def __init__(self, fn: ctypes._CFuncPtr, arguments: int, pieces: int):
    self.fn = ctypes.cast(fn, ctypes.c_void_p).value
    self.thunk = _native().thunk(arguments)
    self.arguments, self.pieces, self.keep = arguments, pieces, fn
  def argument_array(self, pointers: Sequence) -> ctypes.Array:
    """A launch's arguments (c_void_p, c_int64 or int) as the int64 array the thunk reads."""
    return (ctypes.c_int64 * max(1, self.arguments))(*(_value(p) for p in pointers))
  def run(self, args: ctypes.Array) -> None:
    if self.pieces == 1 or cpu_count() == 1: _native().serial(self.thunk, self.fn, ctypes.addressof(args), self.pieces)
    else: core_pool().run(self.thunk, self.fn, args, self.pieces)
  def __call__(self, pointers: Sequence) -> None: self.run(self.argument_array(pointers))
  def prepared(self, pointers: Sequence) -> PreparedPieces: return PreparedPieces(self, self.argument_array(pointers))

class PreparedPieces:
  """A THREAD launch bound once: its launcher and argument array (a replay's launch)."""
  __slots__ = ("launcher", "args")
  def __init__(self, launcher: PieceLauncher, args: ctypes.Array): self.launcher, self.args = launcher, args
  def __call__(self) -> None: self.launcher.run(self.args)

def _value(argument) -> int:
  """A launch argument (c_void_p, c_int64 or int) as the int64 the thunk passes."""
  value = argument.value if isinstance(argument, (ctypes.c_void_p, ctypes.c_int64)) else argument
  return value or 0

def run_on_cores(fn: Callable, pointers: Sequence, pieces: int) -> None:
  """fn(*pointers, piece) for every piece index below `pieces` (a THREAD launch: piece i computes its part of the
  output), on the calling thread and the pool's workers, each running its home range of the pieces and then stealing
  from the others' (the module docstring). Returns when every piece has run. `fn` is a ctypes function (a kernel); a
  plain Python callable runs its pieces here, in order (an exception then reaches the caller)."""
  if not isinstance(fn, ctypes._CFuncPtr):
    for piece in range(pieces): fn(*pointers, piece)
    return
  PieceLauncher(fn, len(pointers), pieces)(pointers)
