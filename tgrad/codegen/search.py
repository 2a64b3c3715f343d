"""BEAM search: the Opts that make one kernel fastest on this machine, measured, verified against the unoptimized
kernel, and cached on disk so that a second process does not search again.

Input: a Kernel (normally fresh from the scheduler) and a beam width. Output: the Opts to apply to it. Each round
applies every legal action (ACTIONS) to every beam member, dedupes the children by rendered source, compiles them in
spawned worker processes, times each on the device and keeps the `beam_width` fastest that verified. A candidate
verifies when, run from the same random inputs with its outputs poisoned by a byte pattern, it leaves the inputs alone,
writes every element (where some element still holds the pattern, it runs again with a second pattern and must give
the same bytes both times) and matches the unoptimized kernel element by element (ints exactly, floats within a
per-element tolerance). The reference is the unoptimized kernel itself; when it is big, on a CPU, split over the
cores and upcast along a contiguous output axis, which changes no element's order of summation. Candidates are
deduplicated by their axes before rendering (`state_key`) and by source after; on a CPU, children that would spill
their accumulators, or handle more values a step than the registers hold, are not rendered, and one clearly
slower than the best is timed once. The search of one kernel stops after Context.BEAM_BUDGET seconds with the best
kernel verified so far. See docs/architecture.md (step 4).
"""
from __future__ import annotations
import atexit, contextlib, dataclasses, hashlib, json, multiprocessing, os, pickle, signal, sys, time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional
import numpy as np
from tqdm import tqdm
from tgrad import codegen
from tgrad.backend import device_kind
from tgrad.cache import get_cache
from tgrad.codegen.axes import AxisState, KernelOptError, Opt, OptOps, memory_extent
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.opts import apply_opt, apply_opts
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.simt_matmul import SIMT_TILES
from tgrad.codegen.warpgroup_mma import SPLIT_TILES, WGMMA_TILES
from tgrad.codegen.compile import CompiledKernel, render_source
from tgrad.device import BinaryLoadError, Buffer, Compiled, Device
from tgrad.dtype import DType, bfloat16_to_float32, dtypes
from tgrad.helpers import Context, cpu_count, prod, settings_key
from tgrad.ops import Ops
from tgrad.scalars import param_bits
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import evaluate, sint, vmax_of

# ---- the action space: every Opt the search may add to a kernel (illegal ones raise KernelOptError and are skipped)
ACTION_AXES = 6          # axes 0..5: merged kernels rarely have more loop axes than that before upcasting
UPCAST_AMOUNTS = (0, 2, 3, 4, 5, 7, 8, 16, 32)   # 0 = the whole axis; small primes fit odd sizes, 16 = AVX-512 floats
LOCAL_AMOUNTS = (2, 3, 4, 8, 13, 16, 29, 32)      # GPU threads per axis; 13 and 29 fit odd sizes
GROUP_AMOUNTS = (0, 2, 4, 8, 10, 16, 20, 32, 40, 64, 80, 128, 256)   # threads that share a reduce through shared
                                     # memory; 20, 40, 80 split K = 640 in 16-byte vectors (matvec); 2 and 10 split a
                                     # packed block's words (Q5_0: 2 per half) and 20 blocks of a row in halves
# UNROLL and GROUP name reduce axes: a packed matvec has up to 6 inside and after its GROUPs (Q6_K: blocks and 5 block
# axes, one more per GROUP), so they reach further than the output axes' ACTION_AXES
ACTION_REDUCE_AXES = 8
THREAD_AMOUNTS = (2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)   # CPU cores; above the core count they are skipped
PADTO_AMOUNTS = (2, 4, 8, 16, 32)                 # pad odd sizes up to vector/tile multiples
TC_AXIS_CHOICES = 2       # OptOps.TC's axis: which (rows, columns) pair of output axes; a matmul has one or two
                          # (amount 0: the one core that fits the operands, f16, bf16 or TF32-rounded f32)
SMEM_PADDINGS = (0, 4, 8)  # elements after each shared tile row: 16 bytes of floats or halves shift rows to other banks
ACTIONS: list[Opt] = [
  *[Opt(OptOps.UPCAST, axis, amount) for axis in range(ACTION_AXES) for amount in UPCAST_AMOUNTS],
  *[Opt(OptOps.UNROLL, axis, amount) for axis in range(ACTION_REDUCE_AXES) for amount in UPCAST_AMOUNTS],
  *[Opt(OptOps.LOCAL, axis, amount) for axis in range(ACTION_AXES) for amount in LOCAL_AMOUNTS],
  *[Opt(op, axis, amount) for op in (OptOps.GROUP, OptOps.GROUPTOP) for axis in range(ACTION_REDUCE_AXES)
    for amount in GROUP_AMOUNTS],
  *[Opt(OptOps.THREAD, axis, amount) for axis in range(3) for amount in THREAD_AMOUNTS],
  *[Opt(OptOps.PADTO, axis, amount) for axis in range(ACTION_AXES) for amount in PADTO_AMOUNTS],
  *[Opt(OptOps.SWAP, axis, other) for axis in range(ACTION_AXES) for other in range(axis + 1, ACTION_AXES)],
  *[Opt(OptOps.TC, axis, 0) for axis in range(TC_AXIS_CHOICES)],
  *[Opt(OptOps.SMEM, operand, padding) for operand in range(2) for padding in SMEM_PADDINGS],
  Opt(OptOps.NOLOCALS),
  *[Opt(OptOps.WGMMA, 0, tile) for tile in range(len(WGMMA_TILES))],
  *[Opt(OptOps.SGEMM, 0, tile) for tile in range(len(SIMT_TILES))],
  *[Opt(OptOps.TF32X3, 0, tile) for tile in range(len(SPLIT_TILES))],
]

# ---- measuring
TIMING_RUNS = 3             # runs per candidate; its time is the minimum (other processes only ever add time)
FINAL_RUNS = 3              # interleaved runs of the winner and the heuristic kernel before the winner is accepted
EARLY_STOP_FACTOR = 3.0     # a candidate this much slower than the best stops running and never joins the beam
# a candidate this much slower than the best after a run gets no more runs (it keeps that time and may still join the
# beam): runs only ever add time, so more runs could not bring it near the best unless its first was 30% slow (a
# loaded machine's first runs were within 25% of their best in the logged searches)
RETIME_FACTOR = 1.3
MIN_IMPROVEMENT = 0.01      # a round that speeds the best up by less than this fraction ends the search
COMPILE_TIMEOUT_SECONDS = 30.0   # a compile that returns nothing for this long is abandoned (and its worker killed)
# (the whole search of one kernel has Context.BEAM_BUDGET seconds; past them, the best verified kernel is returned)
# worker processes; 0 means one per CPU core but the one the searching process renders on (at least one). Each
# spawned worker imports tgrad, ~1 CPU second, while an LLVM compile of a candidate took 0.03-0.2 s: on 2 cores a
# second worker spent more starting than it saved, and took the core that renders and times
COMPILE_WORKERS = 0
# ---- pruning
# On a CPU, a reduce kernel whose accumulators (the product of its upcast output axes) need more than this many times
# the SIMD register file spills them on every step of the reduce: a 1024² float32 matmul with 512 accumulators (16·4
# tile, then 8 more) ran at half the speed of the 64 of the heuristics, and took 2 s to render and compile (AVX2: 128
# floats of registers). Such children are not rendered
ACCUMULATOR_REGISTER_FILES = 1
# On a CPU, a kernel whose upcast and unrolled axes make one step handle more values than this many SIMD register
# files' worth is not rendered either. Logged on 2 cores, AVX2 (128 float32 a register file): one step of 512-1024
# lanes of a 1024² elementwise a*b+a was a 2300-4600-line kernel that took 1.7 s to render and several to compile,
# and ran no faster than 32-128 lanes (the winners: UPCAST 0 8, 0 32, 0 16 then 0 4); a 1024-row sum unrolled by 32·16
# took 1.6 s to render (the winners: UNROLL 0 16 or 0 32); the matmul's 16·4 tile unrolled by 4 or 8 ran at 0.6× and
# 0.45× the tile's speed
STEP_REGISTER_FILES = 1
# ---- verifying
# The reference (the unoptimized kernel) of this many loop iterations or more runs on all CPU cores: unoptimized, a
# 1024² float32 matmul (2^30) takes 5-10 s a run on a shared Zen 3 core, most of a search's time
REFERENCE_THREAD_MIN_WORK = 1 << 24
# ...and, in a reduce kernel, reads an input that is contiguous along an output axis this many bytes at a time (one
# cache line): that axis is upcast (see reference_vector). The unoptimized 1024² matmul read B down its columns, one
# float of each 64-byte line per step; with 16 columns a step it took 0.3 s a run instead of 6-7 s (2 shared cores,
# load ~2)
REFERENCE_VECTOR_BYTES = 64
RANDOM_INT_LIMIT = 16       # random integer inputs lie in [-16, 16): index-like values, products that stay exact
SEARCH_SCALAR_VALUE = 3     # the value every scalar parameter (a lifted Python scalar) takes while candidates run
# every output byte before a checked run. Each kernel runs once with each pattern and must give the same bytes both
# times, so an element it never writes differs between its two runs whatever the reference holds there (a NaN or -1
# that the kernel computes). 0xFF: NaN for floats, -1 for signed ints, 255 for bools; 0x5A: a finite float
# (1.5e16 as float32, 203.25 as float16), a large positive int, an invalid bool
POISON_BYTES = (0xFF, 0x5A)
# Float outputs match element by element: |out - ref| <= atol + rtol·|ref|.
# rtol, by the output's dtype: candidates round their last step differently, and may sum in another order
FLOAT_RTOL = {dtypes.float16: 2e-2, dtypes.bfloat16: 5e-2, dtypes.float32: 1e-3, dtypes.float64: 1e-9}
# atol = FLOAT_ATOL[d]·√terms, where d is the least precise float the kernel computes in (the largest entry) and terms
# the values combined into each output element (the reduce size, 1 for an elementwise kernel). The inputs are random
# and O(1), so where a sum cancels to near 0, a reordered sum or terms rounded differently (half products are exact
# on tensor cores, rounded to half elsewhere) differ by a few unit roundoffs of d times √terms; these constants hold
# 6σ of that up to 10^6 terms (float32: sequential accumulation, error ∝ terms, is the larger part there)
FLOAT_ATOL = {dtypes.float16: 5e-3, dtypes.bfloat16: 2e-2, dtypes.float32: 2e-4, dtypes.float64: 1e-12}
# ...but at most FLOAT_RTOL[d] times the reference's root mean square when it has RMS_CAP_MIN_ELEMENTS or more
# elements: an output whose values are all small (a mean over many terms) keeps a tolerance in proportion. A few large
# elements raise the RMS, never the √terms bound; fewer elements give no typical size (one sum may land near 0)
RMS_CAP_MIN_ELEMENTS = 16

def action_space_hash() -> str:
  """sha256 of the action space's JSON: part of the cache key, so changing ACTIONS invalidates cached winners."""
  return hashlib.sha256(json.dumps([opt.to_json() for opt in ACTIONS]).encode()).hexdigest()

# ---- cache key

def device_arch(device: Compiled) -> str:
  """The processor the timings belong to: the device's `arch` (the CPU's name, the GPU architecture), else its
  renderer's or compiler's."""
  for owner in (device, device.renderer, device.compiler):
    if (arch := getattr(owner, "arch", None)): return str(arch)
  return ""

def renderer_flags(renderer: Any) -> str:
  """The renderer's class and every public setting of a plain type (capabilities, limits, code-shaping switches)."""
  names = {n for cls in type(renderer).__mro__ for n in vars(cls) if not n.startswith("_")} | set(vars(renderer))
  flags = {n: getattr(renderer, n) for n in sorted(names) if not n.startswith("_")
           and isinstance(getattr(renderer, n, None), (bool, int, float, str, tuple))}
  return type(renderer).__name__ + json.dumps(flags, sort_keys=True, default=str)

def search_cache_key(kernel: Kernel, beam_width: int, device: Optional[Compiled] = None) -> dict:
  """Everything a searched winner depends on: the AST, the opts already applied, the device and its processor, the
  compiler and renderer settings, the code-changing switches, the CPU threads, the action space, the beam width and
  the version of the code generator (codegen.CODEGEN_VERSION) that produced and verified it."""
  device = device or Device[kernel.renderer.device]
  return {"ast": kernel.ast.key, "start_opts": json.dumps([opt.to_json() for opt in kernel.applied_opts]),
          "device": device_kind(device.name), "arch": device_arch(device), "compiler": device.compiler.cache_key,
          "renderer": renderer_flags(kernel.renderer), "settings": repr(settings_key()),
          "threads": str(cpu_count() if kernel.renderer.has_threads else 0),
          "actions": action_space_hash(), "beam": str(beam_width), "codegen": str(codegen.CODEGEN_VERSION)}

# ---- results

@dataclass
class SearchStats:
  """What one search did; `from_cache` is True when nothing was searched."""
  from_cache: bool = False
  rounds: int = 0
  candidates: int = 0         # distinct sources rendered (seeds included)
  duplicates: int = 0         # children whose source an earlier candidate already had
  compile_failures: int = 0   # render or compile errors and compile timeouts
  timed: int = 0
  early_stopped: int = 0
  retimes_skipped: int = 0    # candidates timed fewer than TIMING_RUNS times: RETIME_FACTOR slower than the best
  pruned: int = 0             # children not rendered: wider than ACCUMULATOR_ or STEP_REGISTER_FILES allow
  rejected: int = 0           # candidates whose output differed from the unoptimized kernel's
  seconds: float = 0.0
  best_seconds: float = 0.0       # the winner's kernel time
  heuristic_seconds: float = 0.0  # the hand-coded kernel's time
  deadline_hit: bool = False

@dataclass
class SearchResult:
  opts: list[Opt]
  stats: SearchStats

def beam_search_opts(kernel: Kernel, beam_width: int) -> list[Opt]:
  """The Opts to apply to `kernel` (after those it has): cached, or searched with `beam_width` and then cached."""
  return search_kernel(kernel, beam_width).opts

def search_kernel(kernel: Kernel, beam_width: int) -> SearchResult:
  """beam_search_opts with statistics. IGNORE_BEAM_CACHE=1 searches even when a winner is cached."""
  if beam_width < 1: raise ValueError(f"beam width must be at least 1, got {beam_width}")
  key = search_cache_key(kernel, beam_width)
  cache = get_cache()
  if not Context.IGNORE_BEAM_CACHE and (cached := cache.get_opts(key)) is not None:
    try: opts = cached_opts(cached)
    except ValueError as error:   # authenticated but not opts (written by another codegen version, or a bug)
      cache.drop_opts(key, str(error))
      opts = None
    if opts is not None and _applies(kernel.state, opts):
      if Context.DEBUG >= 2: print(f"BEAM {kernel.name}: cached opts {opts}")
      return SearchResult(opts, SearchStats(from_cache=True))
  result = _Search(kernel, beam_width).run()
  cache.put_opts(key, [opt.to_json() for opt in result.opts])
  return result

def cached_opts(entries: list) -> list[Opt]:
  """Opts from their cached JSON form ([op name, axis, amount] each, axis and amount whole numbers or null); ValueError
  naming the first entry that is not one."""
  opts = []
  for entry in entries:
    if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and entry[0] in OptOps.__members__
            and all(x is None or (isinstance(x, int) and not isinstance(x, bool)) for x in entry[1:])):
      raise ValueError(f"cached opt {entry!r:.80} is not [op name, axis, amount]")
    opts.append(Opt.from_json(entry))
  return opts

def _applies(state: AxisState, opts: list[Opt]) -> bool:
  try: apply_opts(state, opts)
  except KernelOptError: return False
  return True

# ---- buffers and random data for measuring a kernel without touching the user's buffers

def kernel_buffer_specs(kernel: Kernel) -> list[tuple[DType, int]]:
  """(dtype, elements) of each DEFINE_GLOBAL in parameter order, from an unoptimized kernel's ShapeTrackers: an output
  holds prod(shape) elements, an input reaches buffer_extent()."""
  base = Kernel(kernel.ast, kernel.renderer)
  specs: dict[int, tuple[DType, int]] = {}
  for u, st in zip(base.memops, base.sts):
    if u.op not in (Ops.LOAD, Ops.STORE): continue
    buffer = u.src[0]
    # symbolic: an output at the variables' maximum; a gather's table: every row
    size = vmax_of(store_elements(st)) if u.op is Ops.STORE else memory_extent(u, st)
    specs[buffer.arg] = (buffer.dtype, max(size, specs.get(buffer.arg, (buffer.dtype, 0))[1]))
  assert sorted(specs) == list(range(len(specs))), f"kernel buffers are not numbered 0..n-1: {sorted(specs)}"
  return [specs[i] for i in range(len(specs))]

def store_elements(st: ShapeTracker) -> sint:
  """The elements an unoptimized kernel's store writes: the product of its shape (symbolic in the variables), or, for
  a shape of known sizes, the extent its view reaches, which is less where the view repeats addresses (a rider's store
  of a vector, written by the points of one block only: shape (rows, K) over a buffer of K)."""
  if all(isinstance(n, int) for n in st.shape): return st.buffer_extent()
  return prod(st.shape)

def random_data(dtype: DType, size: int, rng: np.random.Generator) -> np.ndarray:
  """Random values of `dtype` as the numpy array that holds its bits (bfloat16 as uint16)."""
  if dtype.is_float:
    values = rng.standard_normal(size, dtype=np.float32)
    if dtype == dtypes.bfloat16: return (values.view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(dtype.np)
  if dtype.is_bool: return rng.integers(0, 2, size).astype(np.bool_)
  return rng.integers(0 if dtype.is_unsigned else -RANDOM_INT_LIMIT, RANDOM_INT_LIMIT, size).astype(dtype.np)

@dataclass(frozen=True)
class Tolerance:
  """How far a float output element may be from the reference: |out - ref| <= atol + rtol·|ref|, element by element."""
  rtol: float
  atol: float

def _float_view(x: np.ndarray, dtype: DType) -> np.ndarray:
  """The values of a float buffer as float64 (bfloat16 arrives as its uint16 bits)."""
  if dtype == dtypes.bfloat16: x = bfloat16_to_float32(x)
  return x.astype(np.float64)

def output_tolerance(ref: np.ndarray, dtype: DType, least_precise: Optional[DType] = None, terms: int = 1) -> Tolerance:
  """The per-element tolerance for a float output of `dtype` whose reference is `ref`, for a kernel that computes in
  `least_precise` (default: `dtype`) and combines `terms` values into each output element (see FLOAT_ATOL)."""
  if terms < 1: raise ValueError(f"an output element combines at least 1 term, got {terms}")
  least_precise = least_precise or dtype
  rtol = FLOAT_RTOL.get(dtype, FLOAT_RTOL[dtypes.float32])
  atol = FLOAT_ATOL.get(least_precise, FLOAT_ATOL[dtypes.float32]) * float(np.sqrt(terms))
  values = _float_view(ref, dtype)
  finite = values[np.isfinite(values)]
  if finite.size >= RMS_CAP_MIN_ELEMENTS:
    atol = min(atol, FLOAT_RTOL.get(least_precise, FLOAT_RTOL[dtypes.float32]) * float(np.sqrt(np.mean(finite ** 2))))
  return Tolerance(rtol, atol)

def outputs_match(out: np.ndarray, ref: np.ndarray, dtype: DType, tolerance: Optional[Tolerance] = None) -> bool:
  """Equal bytes for ints and bools (a poisoned bool byte 0xFF is not True); for floats, every element within
  `tolerance` of the reference's (default: output_tolerance of an elementwise kernel), NaN where the reference has
  NaN, the same infinities."""
  if not dtype.is_float: return bool(np.array_equal(out.view(np.uint8), ref.view(np.uint8)))
  tolerance = tolerance or output_tolerance(ref, dtype)
  return bool(np.isclose(_float_view(out, dtype), _float_view(ref, dtype), rtol=tolerance.rtol, atol=tolerance.atol,
                         equal_nan=True).all())

def same_bytes(a: np.ndarray, b: np.ndarray) -> bool: return bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))

def kernel_numerics(kernel: Kernel) -> tuple[Optional[DType], int]:
  """(the least precise float dtype the kernel's AST computes in or None, the values combined into each output
  element): what output_tolerance needs to know about a kernel."""
  floats = {u.dtype for u in kernel.ast.toposort() if u.dtype.is_float}
  least_precise = max(floats, key=lambda d: FLOAT_ATOL.get(d, FLOAT_ATOL[dtypes.float32])) if floats else None
  base = Kernel(kernel.ast, kernel.renderer)
  return least_precise, max(vmax_of(prod(base.full_shape)) // max(vmax_of(prod(base.output_shape)), 1), 1)

# ---- compiling in worker processes: they get source text and return bytes; they never touch a device

_worker_compiler: Any = None
_pools: dict[str, Any] = {}

def _compiler_recipe(compiler: Any) -> tuple[str, Any]:
  """How a worker builds the device's compiler: the pickled instance, or the class when the instance holds native
  state that can't be pickled (LLVM's TargetMachine); such a compiler must be constructible without arguments."""
  try: return ("instance", pickle.dumps(compiler))
  except (pickle.PicklingError, TypeError, AttributeError, ValueError): return ("class", type(compiler))

def _init_worker(recipe: tuple[str, Any]) -> None:
  global _worker_compiler
  signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle; it terminates the pool
  kind, value = recipe
  _worker_compiler = pickle.loads(value) if kind == "instance" else value()

def _compile_source(src: str) -> tuple[Optional[bytes], str]:
  """In a worker: (binary, "") or (None, the error)."""
  try: return _worker_compiler.compile(src), ""
  except Exception as error:   # any compiler failure only disqualifies this candidate
    return None, f"{type(error).__name__}: {error}"

@contextlib.contextmanager
def _without_main_module() -> Iterator[None]:
  """Spawned processes re-import the parent's __main__, which would re-run a user script that lacks an
  `if __name__ == "__main__"` guard (and search again, recursively). Workers only need tgrad, so hide it."""
  main = sys.modules.get("__main__")
  saved = {name: getattr(main, name) for name in ("__file__", "__spec__") if hasattr(main, name)}
  try:
    for name in saved: setattr(main, name, None)
    yield
  finally:
    for name, value in saved.items(): setattr(main, name, value)

def _compile_pool(compiler: Any) -> Any:
  """One pool of spawned workers per compiler, kept for the life of the process."""
  if (pool := _pools.get(compiler.cache_key)) is None:
    workers = COMPILE_WORKERS or max(cpu_count() - 1, 1)
    with _without_main_module():
      pool = multiprocessing.get_context("spawn").Pool(workers, _init_worker, (_compiler_recipe(compiler),))
    _pools[compiler.cache_key] = pool
  return pool

def _drop_pool(compiler: Any) -> None:
  if (pool := _pools.pop(compiler.cache_key, None)) is not None: pool.terminate()

_inherited_pools: list[Any] = []   # a forked child's copies of the parent's pools: never used, never finalized there

def _forget_pools_in_child() -> None:
  """A forked child inherits the pools without their worker threads: it makes its own on first use."""
  _inherited_pools.extend(_pools.values())
  _pools.clear()

os.register_at_fork(after_in_child=_forget_pools_in_child)

@atexit.register
def _close_pools() -> None:
  for pool in _pools.values(): pool.terminate()
  _pools.clear()

# The fields of an AxisState that say what it renders to: all but the opts that led there (UPCAST 0 then 1, or 1 then
# 0, give one kernel), and the renderer (one per search)
_RENDERED_FIELDS = tuple(f.name for f in dataclasses.fields(AxisState) if f.name not in ("applied_opts", "renderer"))

def state_key(kernel: AxisState) -> tuple:
  """What a kernel's source follows from (the linearizer reads nothing else): equal keys render the same source."""
  return tuple(getattr(kernel, name) for name in _RENDERED_FIELDS)

def overfills_registers(kernel: AxisState) -> bool:
  """A CPU kernel whose step (its upcast and unrolled axes) handles more values than STEP_REGISTER_FILES times the
  SIMD registers hold, or a reduce kernel whose accumulators need more than ACCUMULATOR_REGISTER_FILES times them."""
  renderer = kernel.renderer
  if not renderer.has_threads: return False
  register_file = renderer.vector_bytes * renderer.vector_registers
  itemsize = max((u.src[0].dtype.itemsize for u in kernel.memops if u.src), default=1)   # a buffer's elements
  if kernel.upcast_size * itemsize > STEP_REGISTER_FILES * register_file: return True
  if not kernel.reduceops: return False
  accumulators = prod(kernel.full_shape[axis] for axis in kernel.upcast_axes if not kernel.is_reduce_axis(axis))
  return accumulators * max(r.dtype.itemsize for r in kernel.reduceops) > ACCUMULATOR_REGISTER_FILES * register_file

def reference_vector(state: AxisState) -> AxisState:
  """A reduce kernel with one output axis (not the THREAD axis) along which some input is contiguous upcast by the
  largest power of two that divides it and spans at most REFERENCE_VECTOR_BYTES of that input; unchanged otherwise
  (an elementwise kernel, or a reduce over the contiguous axis: its loads are already sequential). No element's
  order of summation changes: the reference the search checks candidates against stays the plain sequential sum."""
  if not state.reduceops: return state
  loads = [(u, st.real_strides()) for u, st in zip(state.memops, state.sts) if u.op is Ops.LOAD]
  for axis in range(1 if state.threads else 0, state.global_dims):
    size = state.full_shape[axis]
    contiguous = [u.dtype.itemsize for u, strides in loads if isinstance(strides[axis], int) and strides[axis] == 1]
    if not isinstance(size, int) or not contiguous: continue
    itemsize, amount = contiguous[0], 1
    while amount * 2 * itemsize <= REFERENCE_VECTOR_BYTES and size % (amount * 2) == 0: amount *= 2
    if amount == 1: continue
    try: return apply_opt(state, Opt(OptOps.UPCAST, axis, amount))
    except KernelOptError: continue
  return state

def render_candidate(kernel: AxisState, name: str) -> str:
  """Source text of a kernel: the thing candidates are deduplicated by and compiled from."""
  return render_source(kernel, name)[0]

# ---- the search

@dataclass(eq=False)
class _Candidate:
  kernel: AxisState
  src: str
  pending: Any = None                 # the worker's AsyncResult while compiling
  runner: Any = None                  # a CompiledKernel once compiled
  times: list[float] = field(default_factory=list)
  early_stopped: bool = False
  verified: Optional[bool] = None     # None until checked
  @property
  def time(self) -> float: return min(self.times) if self.times else float("inf")

class _Search:
  def __init__(self, kernel: Kernel, beam_width: int):
    self.start, self.beam_width = kernel, beam_width
    self.device = Device[kernel.renderer.device]
    self.arch = device_arch(self.device)
    self.name = kernel.function_name   # as compile_kernel names it: the winner's source is the one realize compiles
    self.started = time.perf_counter()
    self.deadline = self.started + Context.BEAM_BUDGET
    self.stats = SearchStats()
    self.by_source: dict[str, _Candidate] = {}
    self.by_state: dict[tuple, Optional[_Candidate]] = {}   # state_key → its candidate (None: it doesn't render)
    self.best: Optional[_Candidate] = None
    self.cache = get_cache()
    self.bar: Any = None
    specs = kernel_buffer_specs(kernel)
    self.buffers = [Buffer(self.device.name, max(size, 1), dtype) for dtype, size in specs]
    self.dtypes = [dtype for dtype, _ in specs]
    memops = [u for u in kernel.memops if u.op in (Ops.LOAD, Ops.STORE)]
    self.outputs = sorted({u.src[0].arg for u in memops if u.op is Ops.STORE})
    read = {u.src[0].arg for u in memops if u.op is Ops.LOAD}
    rng = np.random.default_rng(int(kernel.ast.key[:16], 16))   # fresh inputs per kernel, reproducible per kernel
    # inputs, and outputs the kernel also reads (an in-place update), start from random data before every checked run
    self.initial = {i: random_data(self.dtypes[i], b.size, rng) for i, b in enumerate(self.buffers)
                    if i not in self.outputs or i in read}
    # symbolic variables: candidates are timed with each variable at its maximum (the most work, and what buffers are
    # sized for) and checked at both bounds; the winner is cached under the kernel's symbolic key (one search serves
    # every value). `check_values[0]` is the timing value; an output is compared over its elements at each value.
    variables = sorted({v.arg for u in kernel.ast.toposort() if u.op is Ops.VIEW for v in u.arg.variables()})
    # scalar parameters (tgrad/scalars.py) take one sample value: the search is made for every value of them
    scalars = {v.arg[0]: param_bits(float(SEARCH_SCALAR_VALUE) if v.dtype.is_float else SEARCH_SCALAR_VALUE, v.dtype)
               for v in kernel.scalar_params}
    self.timing_values = {**{name: high for name, _, high in variables}, **scalars}
    self.check_values = [self.timing_values] + ([{**{name: low for name, low, _ in variables}, **scalars}]
                                                if variables else [])
    base = Kernel(kernel.ast, kernel.renderer)
    stores = {u.src[0].arg: st for u, st in zip(base.memops, base.sts) if u.op is Ops.STORE}
    self.output_elements = [{i: evaluate(store_elements(st), values) for i, st in stores.items()}
                            for values in self.check_values]
    self.reference: dict[int, np.ndarray] = {}
    self.tolerances: dict[int, Optional[Tolerance]] = {}   # per float output, from the reference (take_reference)
    self.references_at: list[tuple[dict, dict]] = []       # (reference, tolerances) per check value

  @property
  def deadline_passed(self) -> bool:
    self.stats.deadline_hit = self.stats.deadline_hit or time.perf_counter() > self.deadline
    return self.stats.deadline_hit

  @property
  def best_time(self) -> float: return self.best.time if self.best is not None else float("inf")

  def run(self) -> SearchResult:
    with tqdm(desc=f"BEAM {self.beam_width} {self.start.name}", unit="cand", file=sys.stderr, disable=None,
              leave=False) as self.bar:
      heuristic, beam = self.first_beam()
      while beam and not self.deadline_passed:
        self.stats.rounds += 1
        before = self.best_time
        children = self.measure(self.children(beam))
        beam = self.keep_fastest(children, self.beam_width)
        for child in children:   # unload the programs that can no longer win
          if child not in beam and child is not self.best: child.runner = None
        if not self.best_time < before * (1 - MIN_IMPROVEMENT): break
      winner = self.final_choice(heuristic)
    stats = self.stats
    stats.seconds = time.perf_counter() - self.started
    stats.best_seconds = winner.time
    opts = list(winner.kernel.applied_opts[len(self.start.applied_opts):])
    if Context.DEBUG >= 2:
      speedup = stats.heuristic_seconds / winner.time if winner.time > 0 else 1.0
      print(f"BEAM {self.start.name}: {opts} {winner.time * 1e6:.1f} us, {speedup:.2f}x the heuristics "
            f"({stats.heuristic_seconds * 1e6:.1f} us); {stats.candidates} candidates, {stats.rounds} rounds, "
            f"{stats.rejected} rejected, {stats.seconds:.1f} s")
    return SearchResult(opts, stats)

  def first_beam(self) -> tuple[Optional[_Candidate], list[_Candidate]]:
    """Run the unoptimized kernel for the reference outputs (compiled here), then measure the heuristic kernel and
    each prefix of its opts (so the search can branch off after any of the heuristics' choices). The heuristic kernel
    always joins the first beam, so the search starts from the default and can only improve on it."""
    reference, _ = self.candidate_for(self.reference_state(), here=True)
    if reference is None: raise RuntimeError(f"the unoptimized kernel {self.start.name} doesn't render")
    if reference.runner is None: raise RuntimeError(f"the unoptimized kernel {self.start.name} doesn't compile")
    # the seeds are rendered and sent to the workers first: they start and compile while the reference runs
    heuristic_kernel = self.start.copy()
    hand_coded_optimizations(heuristic_kernel)
    chain = heuristic_kernel.applied_opts[len(self.start.applied_opts):]
    seeds = self.prefixes(chain, reference.kernel.threads > 0)
    found = [self.candidate_for(state) for state in [heuristic_kernel.state] + seeds]
    self.take_reference(reference)
    self.best = reference
    self.record_timing(reference)
    heuristic = found[0][0]
    if heuristic is not None: self.finish_compiles([heuristic], past_deadline=True)
    measured = self.measure([candidate for candidate, new in found if new])
    if heuristic is None or heuristic.runner is None or not self.verify(heuristic):
      return None, self.keep_fastest(measured, self.beam_width)
    while len(heuristic.times) < TIMING_RUNS:   # timed in full even past the deadline: the default to beat
      heuristic.times.append(self.launch(heuristic, self.timing_values))
    self.stats.heuristic_seconds = heuristic.time
    if heuristic.time < self.best_time: self.best = heuristic   # not timed yet when the budget ran out in measure
    others = [c for c in measured + [reference] if c is not heuristic]
    return heuristic, [heuristic] + self.keep_fastest(others, self.beam_width - 1)

  def reference_state(self) -> AxisState:
    """The unoptimized kernel; on a CPU, from REFERENCE_THREAD_MIN_WORK loop iterations, with its outermost output
    axis split across the cores (THREAD, as the heuristics split it) and, in a reduce kernel, an output axis along
    which an input is contiguous upcast to REFERENCE_VECTOR_BYTES of it (reference_vector). Each element is still
    computed by one thread as unoptimized: an output upcast gives each element of the piece its own accumulator, summed
    over the reduce loop in the same order; only the loads of the piece become one vector. The reference of a 1024²
    matmul then reads its B rows a cache line at a time instead of one float per line: 20× sooner."""
    state = AxisState.of(self.start.ast, self.start.renderer)
    if not state.renderer.has_threads or state.global_dims == 0 or not isinstance(size := state.full_shape[0], int) \
       or vmax_of(prod(state.full_shape)) < REFERENCE_THREAD_MIN_WORK: return state
    for threads in range(cpu_count(), 1, -1):
      if size % threads: continue
      try: state = apply_opt(state, Opt(OptOps.THREAD, 0, threads))
      except KernelOptError: continue
      break
    return reference_vector(state)

  def prefixes(self, chain: list[Opt], reference_threaded: bool = False) -> list[AxisState]:
    """The start kernel with each prefix of the heuristics' opts followed by their THREAD opt (when they chose
    threads; each prefix alone when they did not), their whole choice without threads, and every other THREAD split of
    their kernel. On a CPU of many cores a kernel without threads is rarely within EARLY_STOP_FACTOR of the best:
    without these seeds the search could only extend the heuristics' full choice, thread count and threaded axis
    included. Left out: the empty prefix (the reference is the start kernel, or the start kernel split over the cores;
    unsplit, a 1024² matmul ran 6 CPU seconds here, and lost), the THREAD split alone when the reference is split
    (`reference_threaded`: the reference is that split with a vector of each contiguous row, and the split alone read
    B down its columns for 7.5 s a run) and, when they chose threads, the shorter prefixes without them (slower than
    with threads on an idle machine; on a loaded one they could time fastest and win, to run at half the speed once
    the cores are free)."""
    threads = [opt for opt in chain if opt.op is OptOps.THREAD]
    rest = [opt for opt in chain if opt.op is not OptOps.THREAD]
    variants = [rest[:count] + threads for count in range(len(rest) + 1)]
    if threads: variants += [rest] + [rest + [action] for action in self.actions() if action.op is OptOps.THREAD]
    states = []
    for opts in variants:
      if not opts: continue   # the start kernel: the reference is it, or it split over the cores, and is measured
      if reference_threaded and all(opt.op is OptOps.THREAD for opt in opts): continue   # the reference outruns it
      try: states.append(apply_opts(self.start.state, opts))
      except KernelOptError: continue
    return states

  def actions(self) -> list[Opt]:
    """ACTIONS without THREAD splits over the core count (more threads than cores only queue on the pool), and without
    NOLOCALS where the target has no local threads (it renders its parent's source again)."""
    cores, has_local = cpu_count(), self.start.renderer.has_local
    return [action for action in ACTIONS if (action.op is not OptOps.THREAD or action.amount <= cores)
            and (action.op is not OptOps.NOLOCALS or has_local)]

  def candidate_for(self, kernel: AxisState, here: bool = False) -> tuple[Optional[_Candidate], bool]:
    """(candidate, is new) for a kernel's source; a new source is submitted for compiling at once, so compiles
    overlap the next renders (`here`: compiled in this process, while the workers start; the reference's compile
    waited 1.5-2 s for them). (None, False) when the kernel doesn't render. A kernel whose axes (state_key) equal an
    earlier candidate's renders the same source: it is that candidate, without linearizing and rendering again."""
    key = state_key(kernel)
    if key in self.by_state:
      known = self.by_state[key]
      if known is not None: self.stats.duplicates += 1
      return known, False
    try: src = render_candidate(kernel, self.name)
    except Exception as error:   # a kernel the linearizer or renderer can't handle is one failed candidate, not a crash
      self.stats.compile_failures += 1
      self.by_state[key] = None
      if Context.DEBUG >= 3: print(f"BEAM candidate {kernel.applied_opts} doesn't render: {error!r}")
      return None, False
    if (known := self.by_source.get(src)) is not None:
      self.stats.duplicates += 1
      self.by_state[key] = known
      return known, False
    candidate = self.by_source[src] = self.by_state[key] = _Candidate(kernel, src)
    self.stats.candidates += 1
    self.bar.total = self.stats.candidates
    compiler = self.device.compiler
    if (binary := self.cache.get_binary(src, compiler.cache_key)) is not None:
      try: self.load(candidate, binary)
      except BinaryLoadError as error: self.cache.drop_binary(src, compiler.cache_key, f"loader rejected it: {error}")
    if candidate.runner is not None: return candidate, True
    pool = _compile_pool(compiler)
    if not here:
      candidate.pending = pool.apply_async(_compile_source, (src,))
      return candidate, True
    try: binary = compiler.compile(src)
    except Exception as error:   # as in a worker: a compiler failure only disqualifies this candidate
      self.stats.compile_failures += 1
      if Context.DEBUG >= 3: print(f"BEAM candidate {kernel.applied_opts} failed: {error!r}")
      return candidate, True
    self.cache.put_binary(src, compiler.cache_key, binary)
    self.load(candidate, binary)
    return candidate, True

  def children(self, beam: list[_Candidate]) -> list[_Candidate]:
    out = []
    for parent in beam:
      for action in self.actions():
        if self.deadline_passed: return out
        try: child = apply_opt(parent.kernel, action)
        except KernelOptError: continue
        if overfills_registers(child):
          self.stats.pruned += 1
          continue
        candidate, new = self.candidate_for(child)
        if new: out.append(candidate)
    return out

  def load(self, candidate: _Candidate, binary: bytes) -> None:
    kernel = candidate.kernel
    global_size, local_size = kernel.launch_dims()
    flops, nbytes = kernel.estimate()
    candidate.runner = CompiledKernel(self.name, self.device.program(self.name, binary), global_size, local_size,
                                      candidate.src, list(kernel.applied_opts), flops, nbytes, self.device.name,
                                      tuple(v.arg[0] for v in kernel.parameters))

  def finish_compiles(self, candidates: list[_Candidate], past_deadline: bool = False) -> None:
    """Collect the workers' binaries. A compile that shows no progress for COMPILE_TIMEOUT_SECONDS is abandoned and
    the pool replaced afterwards (a stuck worker can't be interrupted). Unless `past_deadline` (the reference and the
    heuristics' kernel, which every search needs), the wait also ends at the deadline: a compile still running then
    leaves its candidate without a program (not a failure; the worker finishes it)."""
    compiler, stuck = self.device.compiler, False
    last_progress = time.perf_counter()
    for candidate in candidates:
      if candidate.pending is None: continue
      pending, candidate.pending = candidate.pending, None
      stalled = last_progress + COMPILE_TIMEOUT_SECONDS
      until = stalled if past_deadline else min(stalled, self.deadline)
      try: binary, error = pending.get(timeout=max(until - time.perf_counter(), 0.0))
      except multiprocessing.TimeoutError:
        if time.perf_counter() < stalled: continue   # the deadline came first
        binary, error, stuck = None, f"no result in {COMPILE_TIMEOUT_SECONDS} s", True
      last_progress = time.perf_counter()
      if binary is None:
        self.stats.compile_failures += 1
        if Context.DEBUG >= 3: print(f"BEAM candidate {candidate.kernel.applied_opts} failed: {error}")
        continue
      self.cache.put_binary(candidate.src, compiler.cache_key, binary)
      self.load(candidate, binary)
    if stuck: _drop_pool(compiler)

  def measure(self, candidates: list[_Candidate]) -> list[_Candidate]:
    """Compile, then time each candidate (runs stop early once it is EARLY_STOP_FACTOR slower than the best); one
    that is faster than the best is verified before it becomes the best. It is verified as soon as a run shows it
    faster, and the verify's checked run is one of its TIMING_RUNS (a wrong one gets no more runs)."""
    self.finish_compiles(candidates)
    measured = []
    for candidate in candidates:
      if candidate.runner is None: continue
      if self.deadline_passed: break
      while len(candidate.times) < TIMING_RUNS:
        candidate.times.append(self.launch(candidate, self.timing_values))
        if candidate.time > EARLY_STOP_FACTOR * self.best_time:
          candidate.early_stopped = True
          self.stats.early_stopped += 1
          break
        if candidate.time > RETIME_FACTOR * self.best_time:
          self.stats.retimes_skipped += 1
          break
        if candidate.time < self.best_time and not self.verify(candidate): break
      self.stats.timed += 1
      self.record_timing(candidate)
      measured.append(candidate)
      if candidate.time < self.best_time and self.verify(candidate): self.best = candidate
      self.bar.set_postfix_str(f"best {self.best_time * 1e6:.1f} us", refresh=False)
      self.bar.update(1)
    return measured

  def keep_fastest(self, candidates: list[_Candidate], width: int) -> list[_Candidate]:
    """The `width` fastest candidates that verify, none EARLY_STOP_FACTOR slower than the best: the next beam."""
    beam: list[_Candidate] = []
    for candidate in sorted(candidates, key=lambda c: c.time):
      if len(beam) >= width or candidate.time > EARLY_STOP_FACTOR * self.best_time: break
      if not candidate.early_stopped and self.verify(candidate): beam.append(candidate)
    return beam

  def final_choice(self, heuristic: Optional[_Candidate]) -> _Candidate:
    """Time the best and the heuristic kernel alternately; the heuristic stays unless the best really is faster.
    Past the deadline they are compared by the times they have (the best may still be the slow reference)."""
    assert self.best is not None, "the reference kernel always verifies"
    if heuristic is None or heuristic is self.best or self.best.runner is None or heuristic.runner is None:
      return self.best
    for _ in range(0 if self.deadline_passed else FINAL_RUNS):
      self.best.times.append(self.launch(self.best, self.timing_values))
      heuristic.times.append(self.launch(heuristic, self.timing_values))
    self.stats.heuristic_seconds = heuristic.time
    return self.best if self.best.time < heuristic.time else heuristic

  # ---- checking a candidate against the unoptimized kernel

  def launch(self, candidate: _Candidate, var_vals: dict[str, int]) -> float:
    """One timed run of a candidate on the search's buffers, with these variable values."""
    if var_vals: return candidate.runner(self.buffers, wait=True, var_vals=var_vals)
    return candidate.runner(self.buffers, wait=True)

  def checked_run(self, candidate: _Candidate, poison_byte: int, check: int = 0) -> dict[int, np.ndarray]:
    """Run once from fresh inputs with the outputs filled with `poison_byte`; returns the outputs. Raises _WroteInput
    if the kernel changed an input. An output the kernel also reads (an in-place update) starts from its random data
    instead of poison, so an element it skips there is caught only where the right value differs from the old one."""
    poison = {i: np.full(self.buffers[i].nbytes, poison_byte, np.uint8) for i in self.outputs if i not in self.initial}
    for i, data in self.initial.items(): self.buffers[i].copyin(data)
    for i, data in poison.items(): self.buffers[i].copyin(data.view(self.dtypes[i].np))
    seconds = self.launch(candidate, self.check_values[check])
    if check == 0: candidate.times.append(seconds)   # only runs at the timing value are timings
    for i, data in self.initial.items():
      if i not in self.outputs and not same_bytes(self.buffers[i].copyout(), data): raise _WroteInput(f"buffer {i}")
    return {i: self.buffers[i].copyout()[:self.output_elements[check][i]] for i in self.outputs}

  def poisoned_runs(self, candidate: _Candidate, check: int = 0) -> tuple[dict[int, np.ndarray], list[int]]:
    """Checked runs with the POISON_BYTES patterns: (the first run's outputs, the outputs whose bytes differ between
    the runs, i.e. that hold an element the kernel never wrote). After the first run, a poisoned output none of whose
    elements holds the first poison's bytes was written everywhere (an element left alone keeps them), so the other
    patterns run only where some element does: one the kernel skipped, or a NaN or -1 it computed."""
    first = self.checked_run(candidate, POISON_BYTES[0], check)
    def holds_poison(i: int) -> bool:   # some element all of whose bytes are the poison's
      values = first[i]
      return bool((values.view(np.uint8).reshape(len(values), values.dtype.itemsize) == POISON_BYTES[0]).all(1).any())
    if not any(holds_poison(i) for i in self.outputs if i not in self.initial): return first, []
    others = [self.checked_run(candidate, poison_byte, check) for poison_byte in POISON_BYTES[1:]]
    return first, [i for i in self.outputs if any(not same_bytes(first[i], other[i]) for other in others)]

  def take_reference(self, reference: _Candidate) -> None:
    """The unoptimized kernel's outputs become the reference, with each float output's per-element tolerance. It must
    leave its inputs alone and write every output element."""
    name = self.start.name
    least_precise, terms = kernel_numerics(self.start)
    for check in range(len(self.check_values)):
      try: outputs, unwritten = self.poisoned_runs(reference, check)
      except _WroteInput as error: raise RuntimeError(f"the unoptimized kernel {name} wrote {error}") from None
      if unwritten:
        raise RuntimeError(f"the unoptimized kernel {name} leaves elements of output buffer(s) {unwritten} "
                           f"unwritten (they differ between runs with poison bytes {POISON_BYTES})")
      self.references_at.append((outputs, {i: output_tolerance(outputs[i], self.dtypes[i], least_precise, terms)
                                           if self.dtypes[i].is_float else None for i in self.outputs}))
    self.reference, self.tolerances = self.references_at[0]
    reference.verified = True

  def verify(self, candidate: _Candidate) -> bool:
    """A candidate is right if it leaves its inputs alone, writes every output element (the same bytes after either
    poison) and matches the reference element by element."""
    if candidate.verified is None:
      try:
        candidate.verified = True
        for check in range(len(self.check_values)):   # at the timing value, and at the variables' minimum
          outputs, unwritten = self.poisoned_runs(candidate, check)
          reference, tolerances = self.references_at[check]
          candidate.verified = candidate.verified and not unwritten and all(
            outputs_match(outputs[i], reference[i], self.dtypes[i], tolerances[i]) for i in self.outputs)
      except _WroteInput:
        candidate.verified = False
      if not candidate.verified:
        self.stats.rejected += 1
        if Context.DEBUG >= 2: print(f"BEAM {self.start.name}: rejected {candidate.kernel.applied_opts} (wrong output)")
    return candidate.verified

  def record_timing(self, candidate: _Candidate) -> None:
    self.cache.add_timing(self.start.ast.key, [opt.to_json() for opt in candidate.kernel.applied_opts],
                          self.device.name, self.arch, candidate.times)

class _WroteInput(Exception):
  """A candidate changed one of its input buffers."""
