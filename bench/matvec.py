"""Matrix–vector products on the GPU: tgrad's kernel next to torch's, kernel time against kernel time.

Shapes are gemma-3-270m's batch-1 decode matvecs: the 262144×640 tied-embedding head and the 2048×640 (gate/up) and
640×2048 (down) projections. Layout "nk": W[N, K] row-major and y = x·Wᵀ (K contiguous), as tgrad/models/gemma3.py's
Linear stores and applies every weight; "kn": W[K, N] and y = x·W (N contiguous). Per shape and dtype: the median over
--repeats of CUDA-event times around one kernel launch, warm (the launch before read the same buffers, so a weight
that fits the L2 cache comes from it) and cold (a write of COLD_FLUSH_BYTES before each launch evicts L2 first);
effective GB/s = (bytes of W + x + y) / time and its share of the GPU's theoretical DRAM bandwidth (memory clock × bus
width); torch's F.linear (nk) / matmul (kn) timed the same way; ratio = torch time / tgrad time (> 1: tgrad faster).
Before every checked run the output is poisoned with NaN; it is then compared with numpy (float32: rtol 1e-4;
float16: with the float32 product of the same half inputs, the tolerance scaled by sqrt(K)).
--sweep also times candidate opt sequences per shape (built and compiled in worker processes) and prints the fastest
next to the heuristics' choice. --dry-run builds and compiles everything without a GPU (NVRTC only).
--cpu times the projections on the CPU (LLVM) instead.
Usage: python bench/matvec.py [--sweep [--dump FILE]] [--repeats N] [--only SUBSTRING] [--dtypes float32,float16]
                              [--dry-run] [--cpu]
"""
from __future__ import annotations
import argparse, math, multiprocessing, os, sys, time
from dataclasses import dataclass
from typing import Callable, Optional
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
from tgrad.device import Buffer, Device  # noqa: E402
from tgrad.dtype import DType, dtypes  # noqa: E402
from tgrad.ops import Ops, UOp  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps  # noqa: E402
from tgrad.codegen.heuristics import hand_coded_optimizations  # noqa: E402
from tgrad.codegen.linearizer import linearize  # noqa: E402
from tgrad.runtime.cuda.nvrtc import compile_cuda  # noqa: E402

KERNEL_NAME = "matvec"
REPEATS = 50                    # timed launches per measurement (median); --sweep uses SWEEP_REPEATS
SWEEP_REPEATS = 15
COLD_FLUSH_BYTES = 256 << 20    # > 2× the L2 of an H100 (50 MiB) or H200 (60 MiB)
SPIN_CYCLES = 200_000           # ~100 µs of GPU spin before a timed launch: longer than the host takes to launch
BACK_TO_BACK_LAUNCHES = 20      # launches timed together (the "b2b" columns)
BACK_TO_BACK_SPIN_CYCLES = 4_000_000   # ~2 ms of GPU spin: longer than the host takes to queue them (torch ~30 us each)
BACK_TO_BACK_REPEATS = 5
CPU_MAX_WEIGHTS = 1 << 24       # --cpu skips bigger weights (the head)
SWEEP_TOP = 6                   # candidates printed per shape
DRY_RUN_SAMPLE = 4              # candidates per shape --dry-run --sweep compiles
FLOAT32_RTOL = 1e-4
HALF_UNIT_ROUNDOFF = 2.0 ** -11
HALF_TOLERANCE_FACTOR = 4       # error of a K-term sum of rounded products: ~ sqrt(K)·u·|product|; 4× that bound

@dataclass(frozen=True)
class Case:
  name: str
  n: int
  k: int
  layout: str      # "nk": W[N, K], y = x·Wᵀ;  "kn": W[K, N], y = x·W
  m: int = 1
  @property
  def label(self) -> str: return f"{self.name} {self.n}x{self.k} {self.layout}" + (f" M={self.m}" if self.m > 1 else "")

CASES = [Case("head", 262144, 640, "nk"), Case("gate/up", 2048, 640, "nk"), Case("gate/up", 2048, 640, "kn"),
         Case("down", 640, 2048, "nk"), Case("down", 640, 2048, "kn"), Case("gate/up", 2048, 640, "nk", m=4)]
DTYPES = {"float32": dtypes.float32, "float16": dtypes.float16}

# ---- the problem: tgrad's kernel AST, host data and the numpy reference

def kernel_ast(case: Case, dtype: DType) -> UOp:
  """The one kernel tgrad schedules for the case (inputs are unrealized placeholders: only the AST is used)."""
  x = Tensor.empty(case.m, case.k, dtype=dtype, device="LLVM")
  w = Tensor.empty(*((case.n, case.k) if case.layout == "nk" else (case.k, case.n)), dtype=dtype, device="LLVM")
  out = x @ w.T if case.layout == "nk" else x @ w
  kernels = [item for item in create_schedule([out.lazydata]) if item.ast.op is Ops.SINK]
  if len(kernels) != 1: raise RuntimeError(f"{case.label}: {len(kernels)} kernels, expected one")
  item = kernels[0]
  # DEFINE_GLOBAL i is (outputs + inputs)[i]: this benchmark passes (y, x, W) in that order
  if [b.size for b in item.inputs] != [x.numel(), w.numel()] or case.m == case.n:
    raise RuntimeError(f"{case.label}: unexpected kernel inputs {item.inputs}")
  return item.ast

def host_data(case: Case, dtype: DType, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """x ~ N(0, 1) and W ~ N(0, 1/K) in the dtype (outputs of order 1), W in the case's layout."""
  x = rng.standard_normal((case.m, case.k), dtype=np.float32).astype(dtype.np)
  shape = (case.n, case.k) if case.layout == "nk" else (case.k, case.n)
  w = (rng.standard_normal(shape, dtype=np.float32) / np.float32(math.sqrt(case.k))).astype(dtype.np)
  return x, w

def reference(case: Case, x: np.ndarray, w: np.ndarray) -> np.ndarray:
  """y in float64 from the inputs' exact values (for float16: the float32 product of the same half inputs)."""
  x64, w64 = x.astype(np.float64), w.astype(np.float64)
  return x64 @ (w64.T if case.layout == "nk" else w64)

def tolerance(case: Case, dtype: DType, x: np.ndarray, w: np.ndarray, ref: np.ndarray) -> np.ndarray:
  """Allowed |y - ref| per output: rtol·(|ref| + sqrt(K)·rms(x)·rms(W)), the second term the size of a product sum
  that cancels; float16 rounds every product and the output (unit roundoff u), so its rtol is a multiple of u."""
  typical = math.sqrt(case.k) * float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) * \
    float(np.sqrt(np.mean(np.square(w[:4096], dtype=np.float64))))
  rtol = FLOAT32_RTOL if dtype == dtypes.float32 else HALF_TOLERANCE_FACTOR * HALF_UNIT_ROUNDOFF
  return rtol * (np.abs(ref) + typical)

# ---- candidate opt sequences (--sweep)

def _divides(size: int, amounts) -> list[int]: return [a for a in amounts if a <= size and size % a == 0]

def sweep_candidates(kernel: Kernel) -> list[list[Opt]]:
  """Opt sequences around the matvec rules: vector width, threads per row or along K, rows per thread and per block,
  K unrolling. Only the sequences the kernel accepts are kept."""
  from tgrad.codegen.heuristics import matvec_layout   # here only: the rest of this file runs on older tgrads too
  layout = matvec_layout(kernel)
  if layout is None: return []
  full, itemsize = kernel.full_shape, max(u.dtype.itemsize for u in kernel.memops if u.op is Ops.LOAD)
  prefix = [Opt(OptOps.UPCAST, axis, 0) for axis in layout.m_axes]
  n, k, out = layout.n_axis, full[layout.k_axis], []
  widths = _divides(k, (16 // itemsize, 4)) if layout.k_contiguous else _divides(full[n], (16 // itemsize, 4, 2))
  for lanes in sorted(set(widths)):
    if layout.k_contiguous:
      steps_total = k // lanes
      for group in _divides(steps_total, (4, 8, 16, 20, 32, 40, 64, 80, 128, 160, 256)):
        steps = steps_total // group
        for unroll in [1] + ([steps] if 1 < steps <= 8 else _divides(steps, (2, 4))):
          for per_thread in (1, 2, 4, 8):
            for per_block in (1, 2, 4, 8, 16):
              if not 32 <= group * per_block <= 1024 or full[n] % (per_thread * per_block): continue
              opts = prefix + [Opt(OptOps.UNROLL, 0, lanes), Opt(OptOps.GROUP, 0, group)]
              if unroll > 1: opts.append(Opt(OptOps.UNROLL, 1, unroll))
              if per_thread > 1: opts.append(Opt(OptOps.UPCAST, n, per_thread))
              if per_block > 1: opts.append(Opt(OptOps.LOCAL, n, per_block))
              out.append(opts)
    else:
      for columns in _divides(full[n] // lanes, (1, 2, 4, 8, 16, 32)):
        for group in _divides(k, (4, 8, 16, 32, 64, 128, 256)):
          if not 32 <= columns * group <= 1024: continue
          for unroll in [1] + _divides(k // group, (2, 4, 8)):
            for group_op in (OptOps.GROUP, OptOps.GROUPTOP) if unroll == 4 else (OptOps.GROUP,):
              opts = prefix + [Opt(OptOps.UPCAST, n, lanes)]
              if columns > 1: opts.append(Opt(OptOps.LOCAL, n, columns))
              opts.append(Opt(group_op, 0, group))
              if unroll > 1: opts.append(Opt(OptOps.UNROLL, 1, unroll))
              out.append(opts)
  return [opts for opts in out if _applies(kernel, opts)]

def _applies(kernel: Kernel, opts: list[Opt]) -> bool:
  trial = kernel.copy()
  try:
    for opt in opts: trial.apply_opt(opt)
  except KernelOptError:
    return False
  return True

@dataclass
class Built:
  """A candidate compiled in a worker: its opts, launch sizes and binary (None with the error when it failed)."""
  opts: list[Opt]
  global_size: tuple[int, ...] = ()
  local_size: tuple[int, ...] = ()
  binary: Optional[bytes] = None
  error: str = ""

def build(ast: UOp, renderer, opts: list[Opt]) -> Built:
  """Apply opts, linearize, render and compile to a cubin (NVRTC only: a worker never touches the GPU)."""
  try:
    kernel = Kernel(ast, renderer)
    for opt in opts: kernel.apply_opt(opt)
    src = renderer.render(KERNEL_NAME, linearize(kernel))
    global_size, local_size = kernel.launch_dims()
    return Built(opts, global_size, local_size, compile_cuda(src, renderer.arch))
  except Exception as error:   # a candidate that fails is reported, not fatal
    return Built(opts, error=f"{type(error).__name__}: {error}")

def _build_job(job: tuple) -> Built: return build(*job)

# ---- measuring on the GPU

class Timer:
  """CUDA-event times of single launches, warm or after an L2 flush. Before each start event the GPU is kept busy
  (torch.cuda._sleep, which touches no memory), so the events see the kernel and not the host's launch overhead: the
  start event, the launch and the end event are all queued before the GPU reaches them. torch provides the spin, the
  flush and its own events."""
  def __init__(self):
    import torch
    self.torch = torch
    self.flush_buffer = torch.empty(COLD_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
  def prepare(self, cold: bool) -> None:
    if cold: self.flush_buffer.zero_()
    self.torch.cuda._sleep(SPIN_CYCLES)
  def tgrad(self, launch: Callable[[], float], repeats: int, cold: bool) -> float:
    """Median seconds of launch() (which times itself with pycuda events around the launch only)."""
    launch()
    times = []
    for _ in range(repeats):
      self.prepare(cold)
      times.append(launch())
    return float(np.median(times))
  def back_to_back(self, enqueue: Callable[[], object], repeats: int) -> float:
    """Median over repeats of the per-launch time of BACK_TO_BACK_LAUNCHES launches queued behind one spin: how the
    kernel runs inside a decode step (no idle GPU between kernels; the weight warm in L2 if it fits)."""
    torch = self.torch
    enqueue()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
      torch.cuda._sleep(BACK_TO_BACK_SPIN_CYCLES)
      start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
      start.record()
      for _ in range(BACK_TO_BACK_LAUNCHES): enqueue()
      end.record()
      end.synchronize()
      times.append(start.elapsed_time(end) / 1e3 / BACK_TO_BACK_LAUNCHES)
    return float(np.median(times))
  def torch_op(self, fn: Callable[[], object], repeats: int, cold: bool) -> float:
    torch = self.torch
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
      self.prepare(cold)
      start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
      start.record()
      fn()
      end.record()
      end.synchronize()
      times.append(start.elapsed_time(end) / 1e3)
    return float(np.median(times))

def dram_bandwidth() -> tuple[str, float]:
  """(GPU name, theoretical DRAM bytes/s = 2 transfers per memory clock × bus width)."""
  context = Device["CUDA"].context
  clock_hz = context.attribute("MEMORY_CLOCK_RATE") * 1e3
  return context.device.name(), 2 * clock_hz * context.attribute("GLOBAL_MEMORY_BUS_WIDTH") / 8

@dataclass
class Launch:
  """A compiled kernel on the problem's buffers: run(wait=True) times one launch with pycuda events; wait=False
  only queues it."""
  run: Callable[[bool], Optional[float]]
  def timed(self) -> float:
    seconds = self.run(True)
    assert seconds is not None
    return seconds
  def enqueue(self) -> None: self.run(False)

class Problem:
  """One case and dtype on the GPU: tgrad's buffers (y, x, W), torch's tensors, the reference and the tolerance."""
  def __init__(self, case: Case, dtype: DType, rng: np.random.Generator, timer: Optional[Timer]):
    self.case, self.dtype, self.timer = case, dtype, timer
    self.ast = kernel_ast(case, dtype)
    self.device = Device["CUDA"]
    x, w = host_data(case, dtype, rng)
    self.ref = reference(case, x, w).reshape(-1)
    self.tol = tolerance(case, dtype, x, w, self.ref)
    self.nbytes = (x.size + w.size + self.ref.size) * dtype.itemsize
    self.buffers = [Buffer("CUDA", self.ref.size, dtype), Buffer("CUDA", x.size, dtype).copyin(x),
                    Buffer("CUDA", w.size, dtype).copyin(w)]
    self.poison = np.full(self.ref.size, np.nan, dtype.np)
    if timer is not None:
      torch, F = timer.torch, timer.torch.nn.functional
      tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
      self.torch_fn = (lambda: F.linear(tx, tw)) if case.layout == "nk" else (lambda: torch.matmul(tx, tw))
      torch_out = self.torch_fn().float().cpu().numpy().astype(np.float64).reshape(-1)
      self.torch_error = float(np.max(np.abs(torch_out - self.ref) / self.tol))

  def heuristic_opts(self) -> list[Opt]:
    kernel = Kernel(self.ast, self.device.renderer)
    hand_coded_optimizations(kernel)
    return list(kernel.applied_opts)

  def launcher(self, built: Built) -> Launch:
    program = self.device.program(KERNEL_NAME, built.binary)
    handles = [b.handle for b in self.buffers]
    return Launch(lambda wait: program(*handles, global_size=built.global_size, local_size=built.local_size, wait=wait))

  def check(self, launch: Launch) -> float:
    """Poison y, run once, return the largest |y - ref| / tolerance (> 1 fails; NaN where an output was unwritten)."""
    self.buffers[0].copyin(self.poison)
    launch.timed()
    out = self.buffers[0].copyout().astype(np.float64)
    ratio = np.abs(out - self.ref) / self.tol
    return float("inf") if not np.isfinite(ratio).all() else float(ratio.max())

  def measure(self, launch: Launch, repeats: int) -> tuple[float, float]:
    assert self.timer is not None
    return (self.timer.tgrad(launch.timed, repeats, cold=False),
            self.timer.tgrad(launch.timed, max(repeats // 2, 3), cold=True))

# ---- the two modes

def gbps(nbytes: int, seconds: float) -> float: return nbytes / seconds / 1e9

@dataclass
class Row:
  problem: Problem
  opts: list[Opt]
  error: float
  times: dict[str, float]   # "warm", "cold", "b2b" for tgrad, "torch warm", … for torch

def measure_row(problem: Problem, launch: Launch, opts: list[Opt], repeats: int) -> Row:
  timer = problem.timer
  assert timer is not None
  error = problem.check(launch)
  warm, cold = problem.measure(launch, repeats)
  times = {"warm": warm, "cold": cold, "b2b": timer.back_to_back(launch.enqueue, BACK_TO_BACK_REPEATS),
           "torch warm": timer.torch_op(problem.torch_fn, repeats, cold=False),
           "torch cold": timer.torch_op(problem.torch_fn, max(repeats // 2, 3), cold=True),
           "torch b2b": timer.back_to_back(problem.torch_fn, BACK_TO_BACK_REPEATS)}
  return Row(problem, opts, error, times)

def report(rows: list[Row], bandwidth: float) -> None:
  part = f"{'us':>7s} {'GB/s':>5s} {'%BW':>4s} {'torch':>6s} {'ratio':>5s}"
  header = f"{'case':28s} {'dtype':7s} {'MB':>6s} | warm {part} | cold {part} | b2b {part} | {'err/tol':>7s}"
  print(header + "\n" + "-" * len(header))
  for row in rows:
    nbytes = row.problem.nbytes
    def cells(kind: str) -> str:
      ours, theirs = row.times[kind], row.times["torch " + kind]
      return (f"{ours * 1e6:7.1f} {gbps(nbytes, ours):5.0f} {100 * nbytes / ours / bandwidth:3.0f}% "
              f"{theirs * 1e6:6.1f} {theirs / ours:5.2f}")
    print(f"{row.problem.case.label:28s} {row.problem.dtype.name:7s} {nbytes / 1e6:6.1f} | warm {cells('warm')} | "
          f"cold {cells('cold')} | b2b {cells('b2b')} | {row.error:7.3f}")
  print("us: kernel time, median; torch: its kernel time (us); ratio: torch / tgrad; %BW of the theoretical DRAM "
        "bandwidth\nopts:")
  for row in rows: print(f"  {row.problem.case.label} {row.problem.dtype.name}: {_opts_text(row.opts)}")

def _opts_text(opts: list[Opt]) -> str:
  return " ".join(f"{o.op.name}({o.axis},{o.amount})" for o in opts) or "(none)"

def run_sweep(problem: Problem, pool, repeats: int, bandwidth: float, dump=None) -> str:
  """Time the heuristics' opts and every candidate; print the fastest (every one to `dump`, a file, as tab-separated
  label, dtype, warm us, cold us, err/tol, opts); return a one-line summary."""
  heuristic = problem.heuristic_opts()
  kernel = Kernel(problem.ast, problem.device.renderer)
  candidates = [heuristic] + [opts for opts in sweep_candidates(kernel) if opts != heuristic]
  started = time.perf_counter()
  jobs = [(problem.ast, problem.device.renderer, opts) for opts in candidates]
  results: list[tuple[float, float, float, list[Opt]]] = []
  failures = 0
  for built in pool.imap(_build_job, jobs, chunksize=4):
    if built.binary is None:
      failures += 1
      if failures <= 2: print(f"  build failed {_opts_text(built.opts)}: {built.error[:200]}")
      continue
    launch = problem.launcher(built)
    error = problem.check(launch)
    warm, cold = problem.measure(launch, repeats)
    results.append((warm, cold, error, built.opts))
    if dump is not None: print(f"{problem.case.label}\t{problem.dtype.name}\t{warm * 1e6:.2f}\t{cold * 1e6:.2f}\t"
                               f"{error:.3f}\t{_opts_text(built.opts)}", file=dump)
  nbytes = problem.nbytes
  assert problem.timer is not None
  torch_warm = problem.timer.torch_op(problem.torch_fn, repeats, cold=False)
  torch_cold = problem.timer.torch_op(problem.torch_fn, max(repeats // 2, 3), cold=True)
  print(f"{problem.case.label} {problem.dtype.name}: {len(results)} candidates timed, {failures} failed, "
        f"{time.perf_counter() - started:.0f} s; torch warm {torch_warm * 1e6:.1f} us ({gbps(nbytes, torch_warm):.0f} "
        f"GB/s), cold {torch_cold * 1e6:.1f} us ({gbps(nbytes, torch_cold):.0f} GB/s)")
  def line(tag: str, entry) -> str:
    warm, cold, error, opts = entry
    ok = "ok " if error <= 1 else "BAD"
    def timing(seconds: float) -> str:
      return f"{seconds * 1e6:8.1f} us {gbps(nbytes, seconds):6.0f} GB/s {100 * nbytes / seconds / bandwidth:3.0f}%"
    return f"  {tag:9s} warm {timing(warm)}  cold {timing(cold)}  {ok} {_opts_text(opts)}"
  ok = [r for r in results if r[2] <= 1]
  if results and results[0][3] == heuristic: print(line("heuristic", results[0]))
  for i, entry in enumerate(sorted(ok, key=lambda r: r[0])[:SWEEP_TOP]): print(line(f"warm #{i + 1}", entry))
  for i, entry in enumerate(sorted(ok, key=lambda r: r[1])[:3]): print(line(f"cold #{i + 1}", entry))
  if bad := [r for r in results if r[2] > 1]:
    print(f"  {len(bad)} WRONG, e.g. {_opts_text(bad[0][3])} err/tol {bad[0][2]}")
  def pct(seconds: float) -> str: return f"{100 * nbytes / seconds / bandwidth:3.0f}%"
  mine = results[0] if results and results[0][3] == heuristic else (float("inf"), float("inf"), 0.0, heuristic)
  warm_best, cold_best = min(ok, key=lambda r: r[0]), min(ok, key=lambda r: r[1])
  return (f"{problem.case.label:28s} {problem.dtype.name:7s} heuristic {pct(mine[0])} {pct(mine[1])} | best warm "
          f"{pct(warm_best[0])} {pct(warm_best[1])} {_opts_text(warm_best[3])} | best cold {pct(cold_best[1])} "
          f"{_opts_text(cold_best[3])} | torch {pct(torch_warm)} {pct(torch_cold)}")

def dry_run(cases: list[Case], dtype_list: list[DType], sweep: bool) -> None:
  """Build and compile the heuristic kernel (and the sweep's candidates) of every case with NVRTC; no GPU."""
  from tgrad.runtime.cuda.renderer import CUDARenderer
  renderer = CUDARenderer()
  pool = multiprocessing.get_context("spawn").Pool(2) if sweep else None
  for case in cases:
    for dtype in dtype_list:
      ast = kernel_ast(case, dtype)
      kernel = Kernel(ast, renderer)
      hand_coded_optimizations(kernel)
      candidates = sweep_candidates(Kernel(ast, renderer)) if sweep else []
      built = build(ast, renderer, kernel.applied_opts)
      print(f"{case.label:30s} {dtype.name:7s} heuristic {_opts_text(kernel.applied_opts)} "
            f"{'compiled' if built.binary else built.error}; {len(candidates)} sweep candidates")
      if pool is not None:   # a sample of the candidates, built as the sweep builds them
        sample = candidates[::max(len(candidates) // DRY_RUN_SAMPLE, 1)]
        failed = [b for b in pool.imap(_build_job, [(ast, renderer, opts) for opts in sample]) if b.binary is None]
        print(f"  {len(sample) - len(failed)}/{len(sample)} sampled candidates compiled" +
              (f"; {_opts_text(failed[0].opts)}: {failed[0].error}" if failed else ""))
  if pool is not None: pool.terminate()

def cpu_report(cases: list[Case], dtype_list: list[DType], repeats: int) -> None:
  """The same matvecs on the CPU (LLVM) with the CPU heuristics: median seconds of the kernel (THREAD opts included),
  GB/s, err/tol and a hash of the rendered source (equal hashes: the same code). The head is skipped."""
  import hashlib
  from tgrad.realize import compile_kernel
  device = Device["LLVM"]
  rng = np.random.default_rng(0)
  print(f"{'case':28s} {'dtype':7s} {'us':>8s} {'GB/s':>6s} {'err/tol':>7s}  source   opts")
  for case in cases:
    if case.n * case.k > CPU_MAX_WEIGHTS: continue
    for dtype in dtype_list:
      kernel = Kernel(kernel_ast(case, dtype), device.renderer)
      hand_coded_optimizations(kernel)
      runner = compile_kernel("LLVM", kernel)
      x, w = host_data(case, dtype, rng)
      ref = reference(case, x, w).reshape(-1)
      buffers = [Buffer("LLVM", ref.size, dtype).copyin(np.full(ref.size, np.nan, dtype.np)),
                 Buffer("LLVM", x.size, dtype).copyin(x), Buffer("LLVM", w.size, dtype).copyin(w)]
      runner(buffers)
      error = float(np.max(np.abs(buffers[0].copyout().astype(np.float64) - ref) / tolerance(case, dtype, x, w, ref)))
      seconds = float(np.median([runner(buffers, wait=True) for _ in range(repeats)]))
      nbytes = (x.size + w.size + ref.size) * dtype.itemsize
      digest = hashlib.sha256(runner.src.encode()).hexdigest()[:8]
      print(f"{case.label:28s} {dtype.name:7s} {seconds * 1e6:8.1f} {gbps(nbytes, seconds):6.1f} {error:7.3f}  "
            f"{digest} {_opts_text(runner.opts)}")

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--sweep", action="store_true", help="time candidate opt sequences per shape")
  parser.add_argument("--repeats", type=int, default=None)
  parser.add_argument("--only", default="", help="cases whose label contains this")
  parser.add_argument("--dtypes", default="float32,float16")
  parser.add_argument("--dry-run", action="store_true", help="compile only (NVRTC), no GPU")
  parser.add_argument("--cpu", action="store_true", help="the projections on the CPU (LLVM) instead")
  parser.add_argument("--dump", default="", help="--sweep: write every candidate's times to this file")
  args = parser.parse_args()
  cases = [c for c in CASES if args.only in c.label]
  dtype_list = [DTYPES[name] for name in args.dtypes.split(",")]
  if args.dry_run: return dry_run(cases, dtype_list, args.sweep)
  if args.cpu: return cpu_report(cases, dtype_list, args.repeats or REPEATS)
  repeats = args.repeats or (SWEEP_REPEATS if args.sweep else REPEATS)
  pool = multiprocessing.get_context("spawn").Pool(os.cpu_count()) if args.sweep else None
  timer = Timer()
  name, bandwidth = dram_bandwidth()
  print(f"{name}: theoretical DRAM bandwidth {bandwidth / 1e9:.0f} GB/s; torch {timer.torch.__version__}; "
        f"median of {repeats} launches (cold: {max(repeats // 2, 3)}, after a {COLD_FLUSH_BYTES >> 20} MiB write)")
  rng = np.random.default_rng(0)
  rows, summaries = [], []
  dump = open(args.dump, "w") if args.dump else None
  for case in cases:
    for dtype in dtype_list:
      problem = Problem(case, dtype, rng, timer)
      if pool is not None:
        summaries.append(run_sweep(problem, pool, repeats, bandwidth, dump))
        continue
      opts = problem.heuristic_opts()
      built = build(problem.ast, problem.device.renderer, opts)
      if built.binary is None: raise RuntimeError(f"{case.label} {dtype.name}: {built.error}")
      rows.append(measure_row(problem, problem.launcher(built), opts, repeats))
      print(f"  {case.label} {dtype.name}: measured; torch's own err/tol {problem.torch_error:.3f}", flush=True)
  if rows: report(rows, bandwidth)
  if summaries: print("summary (% of DRAM bandwidth, warm cold):\n" + "\n".join(summaries))
  if pool is not None: pool.terminate()
  if dump is not None: dump.close()

if __name__ == "__main__":
  main()
