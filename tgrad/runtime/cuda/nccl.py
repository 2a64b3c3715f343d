"""Collectives between the GPUs of one process through NCCL (libnccl.so.2), called with ctypes.

Input: started CUDA devices (runtime.py) and one device pointer per device. Output: all-reduce (sum, prod, max, min,
avg), all-gather, reduce-scatter and broadcast queued on each device's stream: `NCCLCollectives(devices)`. One
communicator per device set (ncclCommInitAll, cached for the process); the per-device calls of one collective are
one NCCL group (ncclGroupStart/End), which is how one thread drives several GPUs. NCCL picks ring or tree itself.

Why ctypes: libnccl.so.2 ships alone in the `nvidia-nccl-cu13` / `nvidia-nccl-cu12` wheels (`pip install
'tgrad[multi-gpu]'`) and in CUDA installs; a dozen C entry points with plain arguments are all tgrad calls, so ctypes
binds them with no compiled extension to build or match to a CUDA version, as graph.py does for the driver. The
`nccl4py` bindings would add a dependency with its own CUDA pinning for the same twelve calls.

Streams: eager collectives run on each device's legacy default stream (handle 0), where its kernels, copies and
graphs run, so they are ordered with them. CUDA graphs: `capture(record)` records a collective on every device's
capture stream at once (cuStreamBeginCapture in relaxed mode, so NCCL may set up connections while recording) and
returns a CapturedCollective: one graph per device, launched together by `launch()` (each on its device's default
stream), or embedded in a device's kernel graph as a child node (`child(rank)` → graph.ChildGraph). A captured
collective keeps the pointers it was recorded with: new values in the same buffers replay; new buffers need a new
capture. Every device's graph must be launched before anything on the host waits for one of them (an NCCL kernel
waits for its peers).
NCCL calls cudaSetDevice, which replaces the thread's current context; every call here puts the caller's back.
"""
from __future__ import annotations
import atexit, ctypes, functools, importlib.util, os, sys, threading, weakref
from typing import Any, Callable, Optional, Sequence

LIBRARY_NAME = "libnccl.so.2"
# The wheels that ship the library: both nvidia-nccl-cu12 and -cu13 install it as nvidia/nccl/lib/libnccl.so.2.
WHEEL_PACKAGE = "nvidia.nccl"
INSTALL_HINT = "pip install 'tgrad[multi-gpu]' (the nvidia-nccl-cu13 wheel; nvidia-nccl-cu12 for a CUDA 12 driver)"
UNIQUE_ID_BYTES = 128   # NCCL_UNIQUE_ID_BYTES in nccl.h
SUCCESS = 0
# ncclResult_t in nccl.h
RESULT_NAMES = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
                4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress",
                8: "ncclTimeout"}
# ncclRedOp_t in nccl.h
REDUCE_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
# ncclDataType_t in nccl.h, by tgrad dtype name. bool reduces as uint8 with max (any) and min (all) only; int16 and
# uint16 have no NCCL type and only move (all-gather, broadcast move bytes, whatever the dtype).
NCCL_TYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6, "float32": 7,
              "float64": 8, "bfloat16": 9, "bool": 1}
BYTES_TYPE = NCCL_TYPES["uint8"]
BOOL_REDUCE_OPS = ("max", "min")
ITEMSIZES = {"int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
             "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "bool": 1}

class NCCLUnavailable(RuntimeError):
  """libnccl.so.2 can't be found or loaded: the message says where tgrad looked and what installs it."""

class NCCLError(RuntimeError):
  """An NCCL call failed: `call`, `code` (ncclResult_t) and NCCL's own description are in the message."""
  def __init__(self, call: str, code: int, text: str):
    self.call, self.code = call, code
    super().__init__(f"{call} failed: {RESULT_NAMES.get(code, 'ncclResult')} ({code}): {text}")

class UniqueId(ctypes.Structure):
  """ncclUniqueId: 128 opaque bytes made by one rank and given to all (ncclCommInitRank takes it by value)."""
  _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]
  def to_bytes(self) -> bytes: return ctypes.string_at(ctypes.addressof(self), UNIQUE_ID_BYTES)
  @staticmethod
  def from_bytes(data: bytes) -> UniqueId:
    """The id another process sent (docs/distributed.md: through a TCP store)."""
    if len(data) != UNIQUE_ID_BYTES: raise ValueError(f"an NCCL unique id is {UNIQUE_ID_BYTES} bytes, got {len(data)}")
    return UniqueId.from_buffer_copy(data)

Comm, Stream, Pointer = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
_P = ctypes.POINTER
# Every entry point tgrad calls, with its argument types; all return ncclResult_t except the two error-text calls.
NCCL_FUNCTIONS: dict[str, list] = {
  "ncclGetVersion": [_P(ctypes.c_int)],
  "ncclGetUniqueId": [_P(UniqueId)],
  "ncclCommInitAll": [_P(Comm), ctypes.c_int, _P(ctypes.c_int)],
  "ncclCommInitRank": [_P(Comm), ctypes.c_int, UniqueId, ctypes.c_int],
  "ncclCommDestroy": [Comm],
  "ncclCommCount": [Comm, _P(ctypes.c_int)],
  "ncclCommCuDevice": [Comm, _P(ctypes.c_int)],
  "ncclGroupStart": [],
  "ncclGroupEnd": [],
  "ncclAllReduce": [Pointer, Pointer, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, Comm, Stream],
  "ncclBroadcast": [Pointer, Pointer, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, Comm, Stream],
  "ncclReduceScatter": [Pointer, Pointer, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, Comm, Stream],
  "ncclAllGather": [Pointer, Pointer, ctypes.c_size_t, ctypes.c_int, Comm, Stream],
}
TEXT_FUNCTIONS: dict[str, list] = {"ncclGetErrorString": [ctypes.c_int], "ncclGetLastError": [Comm]}

def library_candidates(package_dirs: Optional[Sequence[str]] = None) -> list[str]:
  """Where libnccl.so.2 may be, in order: the lib/ folder of each directory of the nvidia.nccl package (found in
  sys.path, or `package_dirs` given by a test), then the bare name, for the dynamic loader's own search
  (LD_LIBRARY_PATH, ldconfig's cache: a system or CUDA-toolkit install)."""
  if package_dirs is None:
    try: spec = importlib.util.find_spec(WHEEL_PACKAGE)
    except ModuleNotFoundError: spec = None   # no nvidia namespace at all
    package_dirs = list(spec.submodule_search_locations or []) if spec is not None else []
  return [os.path.join(folder, "lib", LIBRARY_NAME) for folder in package_dirs] + [LIBRARY_NAME]

class NCCLLibrary:
  """A loaded libnccl with NCCL_FUNCTIONS typed: `check(result, call)` raises NCCLError with NCCL's error text."""
  def __init__(self, path: str, lib: ctypes.CDLL):
    self.path, self.lib = path, lib
    for name, argtypes in {**NCCL_FUNCTIONS, **TEXT_FUNCTIONS}.items():
      try: function = getattr(lib, name)
      except AttributeError as e: raise NCCLUnavailable(f"{path} has no {name}: not an NCCL 2 library") from e
      function.argtypes = argtypes
      function.restype = ctypes.c_char_p if name in TEXT_FUNCTIONS else ctypes.c_int
  @functools.cached_property
  def version(self) -> tuple[int, int, int]:
    """(major, minor, patch), e.g. (2, 27, 3); NCCL codes it as major·10000 + minor·100 + patch since 2.9."""
    code = ctypes.c_int()
    self.check(self.lib.ncclGetVersion(ctypes.byref(code)), "ncclGetVersion")
    major, rest = divmod(code.value, 10000) if code.value >= 10000 else divmod(code.value, 1000)
    return (major, rest // 100, rest % 100)
  def error_text(self, result: int, comm: Optional[int] = None) -> str:
    """ncclGetErrorString of a result, and ncclGetLastError (the thread's last detailed message) when there is one."""
    text = (self.lib.ncclGetErrorString(result) or b"").decode(errors="replace")
    last = (self.lib.ncclGetLastError(Comm(comm)) or b"").decode(errors="replace").strip()
    return f"{text}; {last}" if last and last not in text else text
  def check(self, result: int, call: str, comm: Optional[int] = None) -> None:
    if result != SUCCESS: raise NCCLError(call, result, self.error_text(result, comm))
  def unique_id(self) -> UniqueId:
    """A fresh ncclUniqueId (for ncclCommInitRank across processes or hosts: docs/distributed.md)."""
    made = UniqueId()
    self.check(self.lib.ncclGetUniqueId(ctypes.byref(made)), "ncclGetUniqueId")
    return made

# NCCL's support for a communicator's captured collectives running beside other launches of it (other graphs, eager
# calls) made the first launch of a CUDA graph holding gemma-3-270m's 38 tensor-parallel all-reduces block in
# cuGraphLaunch forever on two H100s (the same graph without it runs). tgrad needs no such mixing: each GPU's graphs
# run in order on that GPU's one stream, and an eager collective after a graph launch waits for the GPUs first
# (NCCLCollectives._group). Set before the library loads; a value the user set is kept.
GRAPH_MIXING_SETTING = ("NCCL_GRAPH_MIXING_SUPPORT", "0")

def load(candidates: Optional[Sequence[str]] = None) -> NCCLLibrary:
  """The first candidate (library_candidates()) that loads; NCCLUnavailable lists every try when none does."""
  os.environ.setdefault(*GRAPH_MIXING_SETTING)
  tried = []
  for path in candidates if candidates is not None else library_candidates():
    if os.sep in path and not os.path.exists(path):
      tried.append(f"{path}: no such file")
      continue
    try: return NCCLLibrary(path, ctypes.CDLL(path))
    except OSError as error: tried.append(f"{path}: {error}")
  raise NCCLUnavailable(f"NCCL ({LIBRARY_NAME}) could not be loaded; tried " + "; ".join(tried) +
                        f". Install it with {INSTALL_HINT}, or put a system NCCL on LD_LIBRARY_PATH")

@functools.cache
def nccl() -> NCCLLibrary:
  """The process's NCCL, loaded on first use."""
  return load()

def is_available() -> bool:
  """Whether NCCL loads (no GPU needed)."""
  try: nccl()
  except NCCLUnavailable: return False
  return True

def nccl_type(dtype: Any, op: Optional[str] = None) -> int:
  """The ncclDataType_t a reduction `op` of `dtype` (a tgrad DType or its name) runs in; TypeError when NCCL has no
  such reduction (int16, uint16; bool except max and min)."""
  name = dtype if isinstance(dtype, str) else getattr(dtype, "name", repr(dtype))
  if name not in NCCL_TYPES:
    raise TypeError(f"NCCL has no reduction of dtype {name}: it reduces {', '.join(sorted(NCCL_TYPES))}")
  if name == "bool" and op not in BOOL_REDUCE_OPS:
    raise TypeError(f"a reduction {op!r} of bool: NCCL reduces bool (as uint8) only with {BOOL_REDUCE_OPS}")
  return NCCL_TYPES[name]

def itemsize(dtype: Any) -> int:
  name = dtype if isinstance(dtype, str) else getattr(dtype, "name", repr(dtype))
  if name not in ITEMSIZES: raise TypeError(f"unknown dtype {name!r} for a collective; known: {sorted(ITEMSIZES)}")
  return ITEMSIZES[name]

def reduce_op(op: str) -> int:
  if op not in REDUCE_OPS: raise ValueError(f"unknown reduction {op!r}; NCCL reduces with {list(REDUCE_OPS)}")
  return REDUCE_OPS[op]

class _ContextKept:
  """`with _ContextKept():` puts the thread's current CUDA context back after NCCL's cudaSetDevice calls."""
  def __enter__(self):
    from tgrad.runtime.cuda.driver import CUDADriverError, current_context
    try: self.saved = current_context()
    except CUDADriverError: self.saved = 0   # no driver library: no context to keep (NCCL will say what failed)
  def __exit__(self, *exc):
    from tgrad.runtime.cuda.driver import set_current_context
    if self.saved: set_current_context(self.saved)

class Communicators:
  """One NCCL communicator per device of a device set, rank i on the i-th device (ncclCommInitAll)."""
  def __init__(self, ordinals: tuple[int, ...]):
    self.ordinals, self.library = ordinals, nccl()
    comms = (Comm * len(ordinals))()
    with _ContextKept():
      self.library.check(self.library.lib.ncclCommInitAll(comms, len(ordinals), (ctypes.c_int * len(ordinals))(
        *ordinals)), f"ncclCommInitAll (GPUs {list(ordinals)})")
    self.comms = [comm for comm in comms]
    self.graph_launched = False   # a CUDA graph holding a captured collective of these was launched since the last wait
    # registered after the devices started, so it runs before their contexts close (atexit runs last-in first-out)
    atexit.register(_release_at_exit)
  def destroy(self) -> None:
    """ncclCommDestroy each communicator (after the work queued on them is done, and after every CUDA graph that
    holds a captured collective of theirs is destroyed: until then NCCL keeps waiting for those graphs)."""
    comms, self.comms = self.comms, []
    lib = self.library.lib
    finalize = getattr(lib, "ncclCommFinalize", None)   # NCCL 2.14+
    with _ContextKept():
      if finalize is not None:   # every rank finalizes at once: one thread drives all of them, so as one group
        finalize.argtypes, finalize.restype = [Comm], ctypes.c_int
        lib.ncclGroupStart()
        for comm in comms: finalize(Comm(comm))
        lib.ncclGroupEnd()
      for comm in comms: lib.ncclCommDestroy(Comm(comm))

_communicators: dict[tuple[int, ...], Communicators] = {}
_live_captures: weakref.WeakSet = weakref.WeakSet()   # every CapturedCollective not yet collected

# How long the exit waits for ncclCommDestroy before leaving the communicators to the end of the process (a graph
# that holds a captured collective and was not destroyed keeps NCCL waiting forever; the driver frees it all anyway)
EXIT_DESTROY_SECONDS = 5.0

def _release_at_exit() -> None:
  """At exit: every CUDA graph and captured collective first, then the communicators, each set with a time limit."""
  if not any(found.comms for found in _communicators.values()): return
  from tgrad.runtime.cuda.graph import close_every_graph
  close_every_graph()
  for captured in list(_live_captures): captured.close()
  for found in list(_communicators.values()):
    if not found.comms: continue
    destroying = threading.Thread(target=found.destroy, name="ncclCommDestroy", daemon=True)
    destroying.start()
    destroying.join(EXIT_DESTROY_SECONDS)
    if destroying.is_alive():
      sys.stderr.write(f"tgrad: NCCL communicators of GPUs {list(found.ordinals)} not destroyed within "
                       f"{EXIT_DESTROY_SECONDS:.0f} s at exit; left to the end of the process\n")

def communicators(ordinals: tuple[int, ...]) -> Communicators:
  """The process's communicators of this device set, made on first use."""
  if (found := _communicators.get(ordinals)) is None or not found.comms:
    found = _communicators[ordinals] = Communicators(ordinals)
  return found

class NCCLCollectives:
  """Collectives over `devices` (started CUDA devices of distinct GPUs, each with `.ordinal` and `.context`), rank i
  on devices[i]. Each method takes one device pointer (or a Buffer handle: anything int() accepts) per device, a
  dtype (a tgrad DType or its name) and element counts, and queues one NCCL group on the devices' streams (`streams`:
  one handle per device; default each device's legacy default stream). Inputs may be the outputs (in place)."""
  def __init__(self, devices: Sequence[Any]):
    ordinals = tuple(device.ordinal for device in devices)
    if not ordinals: raise ValueError("collectives need at least one device")
    if len(set(ordinals)) != len(ordinals): raise ValueError(f"collectives over GPUs {list(ordinals)}: each only once")
    self.devices, self.ordinals = list(devices), ordinals
    self.comms = communicators(ordinals)

  def __len__(self) -> int: return len(self.devices)

  def _pointers(self, what: str, handles: Sequence[Any]) -> list[int]:
    if len(handles) != len(self.devices):
      raise ValueError(f"{what}: {len(handles)} buffers for {len(self.devices)} devices (GPUs {list(self.ordinals)})")
    return [int(handle) for handle in handles]

  def _group(self, call: str, issue: Callable[[int, int, int], int], streams: Optional[Sequence[int]]) -> None:
    """issue(rank, comm, stream) → ncclResult_t for every rank, inside one ncclGroupStart/End."""
    if streams is not None and len(streams) != len(self.devices):
      raise ValueError(f"{call}: {len(streams)} streams for {len(self.devices)} devices")
    library, comms = self.comms.library, self.comms.comms
    if streams is None and self.comms.graph_launched:   # without NCCL's graph mixing: graphs first, then this call
      for device in self.devices: device.synchronize()
      self.comms.graph_launched = False
    with _ContextKept():
      library.check(library.lib.ncclGroupStart(), "ncclGroupStart")
      try:
        for rank, comm in enumerate(comms):
          library.check(issue(rank, comm, 0 if streams is None else int(streams[rank])), f"{call} (rank {rank})", comm)
      finally: ended = library.lib.ncclGroupEnd()
      library.check(ended, f"ncclGroupEnd ({call} on GPUs {list(self.ordinals)})")

  def all_reduce(self, buffers: Sequence[Any], op: str, dtype: Any, count: int,
                 outputs: Optional[Sequence[Any]] = None, streams: Optional[Sequence[int]] = None) -> None:
    """outputs[i] (default buffers[i], in place) = op over ranks of buffers[r], `count` elements each."""
    sends = self._pointers("all_reduce", buffers)
    receives = self._pointers("all_reduce outputs", outputs) if outputs is not None else sends
    kind, reduction, n = nccl_type(dtype, op), reduce_op(op), _count(count)
    lib = self.comms.library.lib
    self._group("ncclAllReduce", lambda rank, comm, stream: lib.ncclAllReduce(
      sends[rank], receives[rank], n, kind, reduction, comm, stream), streams)

  def all_gather(self, inputs: Sequence[Any], outputs: Sequence[Any], dtype: Any, count: int,
                 streams: Optional[Sequence[int]] = None) -> None:
    """outputs[i] = inputs[0] ‖ inputs[1] ‖ … (`count` elements from each rank; outputs hold count·ranks)."""
    sends, receives = self._pointers("all_gather", inputs), self._pointers("all_gather outputs", outputs)
    nbytes, lib = _count(count) * itemsize(dtype), self.comms.library.lib
    self._group("ncclAllGather", lambda rank, comm, stream: lib.ncclAllGather(
      sends[rank], receives[rank], nbytes, BYTES_TYPE, comm, stream), streams)

  def reduce_scatter(self, inputs: Sequence[Any], outputs: Sequence[Any], op: str, dtype: Any, count: int,
                     streams: Optional[Sequence[int]] = None) -> None:
    """outputs[i] = op over ranks of block i of inputs[r] (inputs hold count·ranks elements, outputs `count`)."""
    sends, receives = self._pointers("reduce_scatter", inputs), self._pointers("reduce_scatter outputs", outputs)
    kind, reduction, n = nccl_type(dtype, op), reduce_op(op), _count(count)
    lib = self.comms.library.lib
    self._group("ncclReduceScatter", lambda rank, comm, stream: lib.ncclReduceScatter(
      sends[rank], receives[rank], n, kind, reduction, comm, stream), streams)

  def broadcast(self, buffers: Sequence[Any], dtype: Any, count: int, root: int = 0,
                outputs: Optional[Sequence[Any]] = None, streams: Optional[Sequence[int]] = None) -> None:
    """outputs[i] (default buffers[i]) = buffers[root], `count` elements."""
    if not isinstance(root, int) or not 0 <= root < len(self.devices):
      raise ValueError(f"broadcast root {root!r}: a rank in [0, {len(self.devices)})")
    sends = self._pointers("broadcast", buffers)
    receives = self._pointers("broadcast outputs", outputs) if outputs is not None else sends
    nbytes, lib = _count(count) * itemsize(dtype), self.comms.library.lib
    self._group("ncclBroadcast", lambda rank, comm, stream: lib.ncclBroadcast(
      sends[rank], receives[rank], nbytes, BYTES_TYPE, root, comm, stream), streams)

  def capture(self, record: Callable[[list[int]], None]) -> CapturedCollective:
    """Record what `record(streams)` queues (collectives of this object, called with `streams=streams`) into one
    graph per device, instead of running it."""
    from tgrad.runtime.cuda.driver import CAPTURE_MODE_RELAXED
    from tgrad.runtime.cuda.graph import begin_capture, destroy_graph, end_capture
    streams = [device.capture_stream() for device in self.devices]
    started: list[int] = []
    graphs: list[int] = []
    try:
      for device, stream in zip(self.devices, streams):
        with _Current(device): begin_capture(stream, CAPTURE_MODE_RELAXED)
        started.append(stream)
      record(streams)
    finally:
      for device, stream in zip(self.devices, started):
        with _Current(device): graphs.append(end_capture(stream))
    if len(graphs) != len(self.devices):   # record raised: the partial graphs are dropped with the error
      for graph in graphs: destroy_graph(graph)
    return CapturedCollective(self.devices, graphs, self.comms)

def _count(count: int) -> int:
  if not isinstance(count, int) or isinstance(count, bool) or count < 0:
    raise ValueError(f"a collective's element count must be an int >= 0, got {count!r}")
  return count

class _Current:
  """`with _Current(device):` runs the body with the device's context current."""
  def __init__(self, device: Any): self.context = device.context
  def __enter__(self): self.context.enter()
  def __exit__(self, *exc): self.context.leave()

class CapturedCollective:
  """A collective recorded once per device: `launch()` queues every device's graph on its default stream;
  `child(rank)` is device `rank`'s recorded graph as a node for that device's kernel graph (graph.ChildGraph).
  Instantiated on first launch; `close()` frees everything."""
  def __init__(self, devices: Sequence[Any], graphs: list[int], communicators: Optional[Communicators] = None):
    self.devices, self.graphs, self.communicators = list(devices), graphs, communicators
    self.executables: Optional[list[Any]] = None
    _live_captures.add(self)
  def child(self, rank: int) -> Any:
    from tgrad.runtime.cuda.graph import ChildGraph
    return ChildGraph(self.graphs[rank], owner=self)
  def launch(self) -> None:
    from tgrad.runtime.cuda.graph import CapturedGraph
    if not self.graphs: raise ValueError("launch() on a closed captured collective")
    if self.executables is None:
      executables = []
      for device, graph in zip(self.devices, self.graphs):   # the recordings stay ours (child() may embed them)
        with _Current(device): executables.append(CapturedGraph(graph, owned=False))
      self.executables = executables
    for device, executable in zip(self.devices, self.executables):
      with _Current(device): executable.launch()
    if self.communicators is not None: self.communicators.graph_launched = True
  def close(self) -> None:
    from tgrad.runtime.cuda.graph import destroy_graph
    for device, executable in zip(self.devices, self.executables or []):
      with _Current(device): executable.close()
    self.executables = None
    for graph in self.graphs: destroy_graph(graph)
    self.graphs = []
