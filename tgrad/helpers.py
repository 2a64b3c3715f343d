"""Small shared helpers and the typed runtime Context.

Environment variables are read once into `Context` fields; `with Context(BEAM=2):` overrides them in a scope.
Every switch is listed in docs/env.md. Nothing here imports from the rest of tgrad.
"""
from __future__ import annotations
import contextlib, functools, gc, math, os, platform
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Generator, Iterable, Optional, TypeVar

T = TypeVar("T")

def prod(xs: Iterable[int]) -> int:
  """The product; of symbolic sizes (index UOps), in canonical form (see shape/sint.py)."""
  result = math.prod(xs)
  if type(result) is int: return result
  from tgrad.shape.sint import canonical_product   # only symbolic sizes get here
  return canonical_product(result)
def dedup(xs: Iterable[T]) -> list[T]: return list(dict.fromkeys(xs))
def flatten(xss: Iterable[Iterable[T]]) -> list[T]: return [x for xs in xss for x in xs]
def argsort(xs) -> list[int]: return sorted(range(len(xs)), key=xs.__getitem__)
def round_up(n: int, multiple: int) -> int: return (n + multiple - 1) // multiple * multiple

def run_nested(call: Generator) -> Any:
  """Run a recursive function written as a generator, on an explicit stack instead of Python's: where the function
  would call itself it does `result = yield self.f(...)` (yields the generator of the sub-call and receives its return
  value). Sub-calls run depth-first, in the order they are yielded, exactly as the recursive calls would, so graphs
  of any depth are walked without touching the recursion limit. An exception propagates out of every open call."""
  stack, value = [call], None
  while True:
    try: sub_call = stack[-1].send(value)
    except StopIteration as returned:
      stack.pop()
      if not stack: return returned.value
      value = returned.value
      continue
    stack.append(sub_call)
    value = None

class gc_paused:
  """Pause Python's cyclic garbage collector in a graph pass. The passes allocate many small objects that outlive a
  young generation (memos, nodes), and each such wave makes the collector walk every live object again: on a graph
  of 100,000 ops that doubled the scheduling and lowering time. They make no reference cycles, so nothing waits;
  what others made is collected after the pass. Usable as `with gc_paused():` or as the decorator `@gc_paused()`;
  nests. Written without contextlib: the decorator runs around every eager realize, where contextlib's generator
  machinery cost more than the two gc calls."""
  def __init__(self): self._was_enabled: list[bool] = []
  def __enter__(self):
    self._was_enabled.append(gc.isenabled())
    gc.disable()
  def __exit__(self, *exc):
    if self._was_enabled.pop(): gc.enable()
  def __call__(self, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def paused(*args, **kwargs):
      was_enabled = gc.isenabled()
      gc.disable()
      try: return fn(*args, **kwargs)
      finally:
        if was_enabled: gc.enable()
    return paused

@functools.cache
def machine_cores() -> int:
  """The machine's CPU count, read once: os.cpu_count() asks the system on each call (8-40 µs on 2 shared cores), and
  every reduce asks while its graph is built."""
  return os.cpu_count() or 1

def cpu_count() -> int:
  """CPU threads to use: THREADS if set, else every core."""
  return Context.THREADS or machine_cores()

def cpu_model(cpuinfo_path: str = "/proc/cpuinfo") -> str:
  """The CPU's marketing name ('AMD EPYC 9555 64-Core Processor'): the first 'model name' of /proc/cpuinfo on Linux,
  else what the platform module reports."""
  try:
    with open(cpuinfo_path) as info:
      for line in info:
        name, _, value = line.partition(":")
        if name.strip() in ("model name", "Model") and value.strip(): return value.strip()
  except OSError: pass   # not Linux, or /proc is not mounted: ask the platform module
  return platform.processor() or platform.machine() or "unknown"

def getenv(key: str, default=0):
  value = os.environ.get(key)
  if value is None: return default
  return type(default)(value) if not isinstance(default, bool) else value not in ("", "0", "false", "False")

class SettingError(ValueError):
  """An environment variable (or a Context override) with a value tgrad does not accept; the message names the
  variable, the value and the values allowed."""

@dataclass(frozen=True)
class _Settings:
  DEBUG: int = 0        # 1 totals, 2 a line per kernel, 3 opts, 4 source, 5 uops
  BEAM: int = 0         # beam width of the kernel search; 0 uses the heuristics
  NOOPT: int = 0        # 1 turns the heuristics off (plain loops)
  DEVICE: str = ""      # default device; empty means CUDA if usable, else LLVM (checked by tgrad.device at first use)
  CACHELEVEL: int = 1   # 0 turns every disk cache off
  CACHE_MAX_BYTES: int = 1 << 30   # bytes of compiled binaries the disk cache keeps; least recently used go first
  IGNORE_BEAM_CACHE: int = 0
  BEAM_BUDGET: int = 300   # seconds one kernel's search may take; past them the best kernel verified so far wins
  THREADS: int = 0      # CPU threads for THREAD opts; 0 means all cores
  CUDA_GRAPH: int = 1   # 1 replays compiled programs on CUDA as CUDA graphs; 0 launches them kernel by kernel
  GRAPH_BRANCHES: int = 1   # 1: a CUDA graph's kernel waits only for the kernels whose memory it shares (independent
                            # kernels may run at once); 0: each waits for the one before (a chain; docs/env.md)
  SIDE_KERNELS: int = 1   # 1: a replayed program's kernels that read only weights start beside its least busy kernel
                          # before their first user (side_kernels.py; where the graph runner estimates busyness)
  PDL: int = 1          # 1: on sm_90+ a CUDA graph's kernels launch before their predecessor ends (Programmatic
                        # Dependent Launch) and wait for it on chip; 0 serializes them fully
  PDL_PREFETCH: int = 1  # 1: under PDL a kernel's blocks first prefetch their bytes of its largest read-only input
                         # into L2, while the predecessor still runs (runtime/cuda/prefetch.py); 0: they don't
  WGMMA: int = 1        # 1: on sm_90a a big half/bfloat16 matmul may be one warpgroup-MMA kernel (OptOps.WGMMA)
  WGMMA_TMA: int = 1    # 1: that kernel's heuristic tile loads by TMA with a producer warpgroup; 0: by cp.async
  SGEMM: int = 1        # 1: on CUDA a big float32 matmul without an epilogue is the float32 matmul template
                        # (OptOps.SGEMM); 0: the staged kernel of the generic opts
  F32_MATMUL: str = "3xtf32"   # "3xtf32": on sm_90a a big float32 matmul is one 3xTF32 warpgroup-MMA kernel
                               # (OptOps.TF32X3, float32-class; docs/env.md); "simt": the CUDA cores (SGEMM)
  JIT_PLAN: int = 1     # 1: a TinyJit packs its transient buffers into one arena per device; 0: one allocation each
  FLASH_ATTENTION: int = 1   # 1: scaled-dot-product attention on CUDA (half types) is one flash-attention kernel
  FLASH_DECODING: int = 1    # 1: one query position's attention (a decode step's, with its KV-cache append) is the
                             # flash-decoding kernel; 0: the plain graph (scores, softmax·V, the cache write)
  FLASH_CLUSTER: int = 16    # blocks of a flash-decoding thread block cluster on sm_90+: up to that many splits
                             # combine through shared memory (16: a non-portable size); 0: every split through global
                             # scratch and an atomic
  FLASH_DEVICE_VALUES: int = 0   # 1: flash decoding reads its variables' values (the key count, the cache slot) from
                                 # device memory written before each launch, so a replayed graph's nodes keep their
                                 # arguments (less host work a step, ~1 % more GPU time: docs/env.md); 0: the values
                                 # are kernel arguments, set in every node each step
  HALF_GEMM: int = 1    # 1: a prompt times a packed weight on CUDA dequantizes it into a temporary of the prompt's
                        # dtype (half, or float32)
                        # and runs the tensor-core matmul; 0: the packed float product (nn/quant.py)
  PACKED_GEMM: int = 0  # 1: on sm_90a that prompt is one warpgroup-MMA kernel dequantizing the packed tiles in shared
                        # memory (no temporary); 0 (the default: measured slower on an H100, docs/env.md): the half
                        # temporary and the dense matmul
  CPU_PACK: int = 1     # 1: a CPU matmul whose reused operand pays for it (a prompt times a weight, packed or dense)
                        # runs as a copy of it into column panels and the blocked matmul (codegen/cpu_gemm.py); 0: as
                        # its own kernel (a packed weight: the packed product, every row dequantizing the blocks again)
  RIDERS: int = 0       # 1: a small kernel runs inside a neighbouring one (schedule rule 5); 0: every kernel alone
                        # (the default: on an H100 riders made Gemma's decode step and prefill slower, docs/env.md)
  TOLERANCE: Optional[float] = None   # max relative error of a selected execution path; None: per dtype (tgrad/paths)

MAX_DEBUG = 5
# the integer settings: what each accepts, in words for the error message and as a test
_ALLOWED_VALUES: dict[str, tuple[str, Callable[[int], bool]]] = {
  "DEBUG": (f"a whole number from 0 to {MAX_DEBUG}", lambda v: 0 <= v <= MAX_DEBUG),
  "BEAM": ("a whole number >= 0 (the beam width; 0 uses the heuristics)", lambda v: v >= 0),
  "NOOPT": ("0 or 1", lambda v: v in (0, 1)),
  "CACHELEVEL": ("0 or 1", lambda v: v in (0, 1)),
  "CACHE_MAX_BYTES": ("a whole number >= 1 (bytes of compiled binaries the disk cache keeps)", lambda v: v >= 1),
  "IGNORE_BEAM_CACHE": ("0 or 1", lambda v: v in (0, 1)),
  "BEAM_BUDGET": ("a whole number >= 1 (seconds one kernel's search may take)", lambda v: v >= 1),
  "THREADS": ("a whole number >= 0 (0 uses every core)", lambda v: v >= 0),
  "CUDA_GRAPH": ("0 or 1", lambda v: v in (0, 1)),
  "GRAPH_BRANCHES": ("0 or 1", lambda v: v in (0, 1)),
  "SIDE_KERNELS": ("0 or 1", lambda v: v in (0, 1)),
  "PDL": ("0 or 1", lambda v: v in (0, 1)),
  "PDL_PREFETCH": ("0 or 1", lambda v: v in (0, 1)),
  "JIT_PLAN": ("0 or 1", lambda v: v in (0, 1)),
  "RIDERS": ("0 or 1", lambda v: v in (0, 1)),
  "FLASH_ATTENTION": ("0 or 1", lambda v: v in (0, 1)),
  "FLASH_DECODING": ("0 or 1", lambda v: v in (0, 1)),
  "FLASH_CLUSTER": ("0, 2, 4, 8 or 16 (blocks of a cluster; 0: none)", lambda v: v in (0, 2, 4, 8, 16)),
  "FLASH_DEVICE_VALUES": ("0 or 1", lambda v: v in (0, 1)),
  "HALF_GEMM": ("0 or 1", lambda v: v in (0, 1)),
  "PACKED_GEMM": ("0 or 1", lambda v: v in (0, 1)),
  "CPU_PACK": ("0 or 1", lambda v: v in (0, 1)),
  "WGMMA": ("0 or 1", lambda v: v in (0, 1)),
  "WGMMA_TMA": ("0 or 1", lambda v: v in (0, 1)),
  "SGEMM": ("0 or 1", lambda v: v in (0, 1)),
}
# the settings that take one of a few words
_ALLOWED_WORDS: dict[str, tuple[str, ...]] = {"F32_MATMUL": ("3xtf32", "simt")}
# the float settings, the same way; None (unset) is always allowed for these
_ALLOWED_FLOATS: dict[str, tuple[str, Callable[[float], bool]]] = {
  "TOLERANCE": ("a number >= 0 (the largest relative error a selected path may have), or unset for the per-dtype "
                "default", lambda v: 0 <= v < math.inf),
}

def _checked(name: str, value: Any, source: str) -> Any:
  """`value` for setting `name` as tgrad uses it, or SettingError. `source` says where it came from (for the message:
  'environment variable' or 'Context')."""
  if name in _ALLOWED_FLOATS: return _checked_float(name, value, source)
  if name in _ALLOWED_WORDS:
    words = _ALLOWED_WORDS[name]
    word = value.strip().lower() if isinstance(value, str) else value
    if word not in words: raise SettingError(f"{source} {name}={value!r} is not valid: expected one of {list(words)}")
    return word
  if name not in _ALLOWED_VALUES:   # DEVICE: any string here; the device registry checks the name
    if not isinstance(value, str): raise SettingError(f"{source} {name}={value!r} is not valid: expected a device name")
    return value
  allowed, test = _ALLOWED_VALUES[name]
  if isinstance(value, str):
    try: value = int(value.strip())
    except ValueError: raise SettingError(f"{source} {name}={value!r} is not valid: expected {allowed}") from None
  if not isinstance(value, int) or not test(value):
    raise SettingError(f"{source} {name}={value!r} is not valid: expected {allowed}")
  return int(value)

def _checked_float(name: str, value: Any, source: str) -> Optional[float]:
  allowed, test = _ALLOWED_FLOATS[name]
  if value is None: return None
  if isinstance(value, str):
    try: value = float(value.strip())
    except ValueError: raise SettingError(f"{source} {name}={value!r} is not valid: expected {allowed}") from None
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not test(value):  # NaN fails the test too
    raise SettingError(f"{source} {name}={value!r} is not valid: expected {allowed}")
  return float(value)

def _settings_from_environment() -> _Settings:
  """Every setting from its environment variable; unset or empty keeps the default."""
  values = {}
  for f in fields(_Settings):
    raw = os.environ.get(f.name, "")
    values[f.name] = _checked(f.name, raw, "environment variable") if raw.strip() else f.default
  return _Settings(**values)

_current = _settings_from_environment()

class _ContextMeta(type):
  def __getattr__(cls, name): return getattr(_current, name)

class Context(contextlib.ContextDecorator, metaclass=_ContextMeta):
  """Read settings as `Context.DEBUG`; override them in a scope with `with Context(DEBUG=2): ...`."""
  def __init__(self, **overrides):
    known = {f.name for f in fields(_Settings)}
    for name in overrides:
      if name not in known: raise SettingError(f"unknown setting {name!r}; known: {', '.join(sorted(known))}")
    self.overrides = {name: _checked(name, value, "Context") for name, value in overrides.items()}
    self.saved: Optional[_Settings] = None
  def __enter__(self):
    global _current
    self.saved, _current = _current, replace(_current, **self.overrides)
    return self
  def __exit__(self, *exc):
    global _current
    _current = self.saved

def current_settings() -> _Settings:
  """Every setting as now in force, as one frozen object: a hot path reads it once instead of asking `Context` for
  each field. A `Context` scope replaces the object (and restores the old one on exit), so the object's identity
  changes whenever any setting does."""
  return _current

# The settings that change generated code. Not TOLERANCE: it changes which measured path is selected, never the code
# of a path, so kernels and binaries cached under one tolerance serve every other.
CODE_SETTINGS = ("NOOPT", "PDL", "PDL_PREFETCH", "WGMMA", "WGMMA_TMA", "SGEMM", "F32_MATMUL", "FLASH_CLUSTER",
                 "FLASH_DEVICE_VALUES")

def settings_key(settings: Optional[_Settings] = None) -> tuple:
  """The settings that change generated code (of `settings`, else the current ones): part of every cache key."""
  settings = settings or _current
  return tuple(getattr(settings, name) for name in CODE_SETTINGS)

def code_settings(settings: Optional[_Settings] = None) -> dict:
  """`settings_key` with names, as JSON-ready values: what a benchmark record of an execution path was measured
  under (tgrad/paths/db.py), so a record made under other code-changing settings is not used."""
  settings = settings or _current
  return {name: getattr(settings, name) for name in CODE_SETTINGS}

@functools.cache
def cache_dir() -> str:
  return os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
