"""CUDA graphs: a chain of compiled kernels replayed by one driver call, with per-kernel argument patching.

Input: a list of KernelLaunch (a pycuda Function, launch dims, dynamic shared bytes, argument values and kinds).
Output: a CUDAGraph whose `launch()` runs every kernel in order, asynchronously, on the stream tgrad's eager kernels
use, and whose `update(i, args)` patches kernel i's arguments (new buffer pointers, new variable values) in the
instantiated graph. pycuda has no graph bindings, so this module speaks to the driver API (libcuda.so.1) through
ctypes on pycuda's current context; it imports neither pycuda nor the driver until a graph is built.
The CUDA_GRAPH switch (docs/env.md) turns graphs off: `graphs_enabled()`.
"""
from __future__ import annotations
import ctypes, sys, weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence
from tgrad.helpers import Context, prod
from tgrad.runtime.cuda.kernel_params import TENSOR_MAP_KIND, KernelArguments
from tgrad.runtime.cuda.kernel_params import TensorMapValue as _TensorMapValue   # noqa: F401  (the name tests use)
from tgrad.runtime.cuda.tensor_map import TENSOR_MAP_BYTES, pack_parameters
from tgrad.runtime.cuda.device_values import stage_all

from tgrad.runtime.cuda.driver import (CAPTURE_MODE_THREAD_LOCAL, CUDA_SUCCESS, DEFAULT_STREAM, DRIVER_FUNCTIONS,
  DEPENDENCY_TYPE_PROGRAMMATIC, KERNEL_NODE_PORT_PROGRAMMATIC, STREAM_NON_BLOCKING, CUDADriverError, CUgraph,
  CUgraphExec, CUgraphNode, CUstream, EdgeData, KernelNodeParams, check, driver, error_name, has_programmatic_edges)

__all__ = ["CUDAGraph", "CUDAGraphError", "CapturedGraph", "CUDAGraphRunner", "ChildGraph", "DRIVER_FUNCTIONS",
           "KernelLaunch", "KernelNodeParams", "capture", "check", "driver", "error_name", "graphs_enabled"]

ARG_KINDS = {"P": (0, 2**64 - 1), "i": (-2**31, 2**31 - 1), "q": (-2**63, 2**63 - 1)}   # kind → allowed value range
_P = ctypes.POINTER

# A failed graph call is a failed driver call (driver.py); the name graph code and its tests have always caught.
CUDAGraphError = CUDADriverError

def graphs_enabled() -> bool:
  """Whether compiled programs on CUDA replay as CUDA graphs (CUDA_GRAPH=1, the default) or kernel by kernel."""
  return bool(Context.CUDA_GRAPH)

@dataclass
class KernelLaunch:
  """One kernel node: a pycuda Function, grid and block (x, y, z), dynamic shared bytes, and its arguments: tensor maps
  (kind "M", 128 bytes each, for a TMA kernel), device pointers (kind "P", uint64), then variable values (kind "q",
  int64, as tgrad's kernels take them; "i" for int32), one kind letter per argument."""
  function: Any
  grid: tuple[int, int, int]
  block: tuple[int, int, int]
  shared_bytes: int
  args: list[int]
  arg_kinds: str
  waits_for_prior_grids: bool = False   # rendered with the dependent-launch prologue (runtime/cuda/renderer.py)

  def __post_init__(self):
    for what, dims in (("grid", self.grid), ("block", self.block)):
      if len(dims) != 3 or not all(isinstance(d, int) and d >= 1 for d in dims):
        raise ValueError(f"KernelLaunch {what} must be 3 positive ints (x, y, z), got {dims!r}")
    if not isinstance(self.shared_bytes, int) or self.shared_bytes < 0:
      raise ValueError(f"KernelLaunch shared_bytes must be an int >= 0, got {self.shared_bytes!r}")
    if len(self.args) != len(self.arg_kinds):
      raise ValueError(f"KernelLaunch has {len(self.args)} args but {len(self.arg_kinds)} arg kinds "
                       f"({self.arg_kinds!r})")
    for position, (kind, value) in enumerate(zip(self.arg_kinds, self.args)): _check_arg(kind, value, position)

  @staticmethod
  def for_program(program: Any, pointers: Sequence[int], global_size: Sequence[int], local_size: Sequence[int],
                  vals: Sequence[int] = ()) -> KernelLaunch:
    """The launch a CUDAProgram call with these buffers, sizes (x first, up to 3) and variable values would make: a
    TMA kernel's tensor maps first, made (or found in the program's cache) for these pointers."""
    grid = tuple(global_size) + (1,) * (3 - len(global_size))
    block = tuple(local_size) + (1,) * (3 - len(local_size))
    make_maps = getattr(program, "tensor_maps", None)
    maps = list(make_maps(pointers)) if make_maps is not None else []
    return KernelLaunch(program.function, grid, block, program.shared_bytes,  # type: ignore[arg-type]
                        maps + [int(p) for p in pointers] + [int(v) for v in vals],
                        TENSOR_MAP_KIND * len(maps) + "P" * len(pointers) + "q" * len(vals),
                        bool(getattr(program, "waits_for_prior_grids", False)))

def programmatic_edges(launches: Sequence[KernelLaunch | ChildGraph], enabled: bool) -> list[bool]:
  """For each launch after the first: whether its edge from the launch before is programmatic — PDL on (`enabled`),
  both are kernels, and this one waits for prior grids itself. Any other edge is a full dependency."""
  return [enabled and isinstance(before, KernelLaunch) and isinstance(launch, KernelLaunch) and
          launch.waits_for_prior_grids for before, launch in zip(launches, launches[1:])]

# A node's memory accesses for `data_dependencies`: (first byte, end byte, writes) per buffer it touches, or None for a
# node whose accesses are unknown (a captured collective), which orders against every node before and after it.
Access = tuple[int, int, bool]
INPUT_SLOT_KIND = "input"   # jit.Slot.kind of a buffer bound per call (jit.py's INPUT: this layer can't import it)
ANY_ADDRESS = 1 << 64       # the end of the range an input slot stands for: every address

def data_dependencies(accesses: Sequence[Optional[Sequence[Access]]]) -> list[tuple[int, ...]]:
  """For each node (in program order) the earlier nodes it must wait for so that every pair of nodes whose byte ranges
  overlap, at least one writing (read after write, write after read, write after write), keeps its order, with the
  edges other edges imply left out (so a chain stays a chain: each node's only edge the one before it). Earlier
  accesses a write covers exactly are dropped from the search: a later node that conflicts with them conflicts with
  the write too, and so waits for them through it."""
  live: list[tuple[int, int, bool, int]] = []   # (start, end, writes, node) that a later node may still conflict with
  reach: list[int] = []   # per node, a bitset of every node it waits for, directly or not
  result: list[tuple[int, ...]] = []
  barrier: Optional[int] = None   # the last node of unknown accesses
  for node, ranges in enumerate(accesses):
    if ranges is None: direct = set(range(node))
    else:
      direct = {other for start, end, writes in ranges for lo, hi, other_writes, other in live
                if lo < end and start < hi and (writes or other_writes)}
      if barrier is not None: direct.add(barrier)
    implied = 0
    for d in direct: implied |= reach[d]
    kept = tuple(sorted(d for d in direct if not (implied >> d) & 1))
    result.append(kept)
    reach.append(implied | sum(1 << d for d in direct))
    if ranges is None:
      barrier, live = node, []
      continue
    for start, end, writes in ranges:
      if writes: live = [entry for entry in live if (entry[0], entry[1]) != (start, end)]
      live.append((start, end, writes, node))
  return result

def starting_with_previous(instructions: Sequence[Any], dependencies: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
  """`dependencies` with each instruction placed to start with the one before it (`starts_with_previous`: a side
  kernel after its anchor, tgrad/side_kernels.py) also waiting for what that anchor waits for: it then starts when
  the anchor does, not as soon as its own memory is free (beside whatever the chain runs then)."""
  out = list(dependencies)
  anchor_deps: tuple[int, ...] = ()
  for node, ins in enumerate(instructions):
    if not getattr(ins, "starts_with_previous", False): anchor_deps = dependencies[node]
    else: out[node] = tuple(sorted(set(dependencies[node]).union(anchor_deps)))
  return out

def _check_arg(kind: str, value, position: int) -> None:
  if kind == TENSOR_MAP_KIND:
    if not isinstance(value, bytes) or len(value) != TENSOR_MAP_BYTES:
      raise ValueError(f"argument {position} of kind {kind!r} must be {TENSOR_MAP_BYTES} bytes (a tensor map)")
    return
  if kind not in ARG_KINDS: raise ValueError(f"argument {position}: kind {kind!r} is not one of {list(ARG_KINDS)}")
  low, high = ARG_KINDS[kind]
  if not isinstance(value, int) or not low <= value <= high:
    raise ValueError(f"argument {position} of kind {kind!r} must be an int in [{low}, {high}], got {value!r}")

# pycuda's Function does not expose its CUfunction. Launching it once inside a stream capture records a kernel node
# whose parameters name it: `func` (a CUfunction), or `kern` and `ctx` where the driver loaded it as a CUkernel.
# They are kept per Function; the strong reference to the Function keeps its id unique.
_kernel_identities: dict[int, tuple[Any, tuple[int, int, int]]] = {}

def kernel_identity(launch: KernelLaunch) -> tuple[int, int, int]:
  """(func, kern, ctx) of a kernel node that runs launch.function, learned by capturing (not running) one launch of
  it through pycuda on a private stream."""
  if (known := _kernel_identities.get(id(launch.function))) is not None: return known[1]
  import numpy as np
  import pycuda.driver as cuda
  lib, stream, graph = driver(), cuda.Stream(flags=STREAM_NON_BLOCKING), CUgraph()
  numpy_of_kind = {"P": np.uint64, "i": np.int32, "q": np.int64}
  maps = launch.arg_kinds.count(TENSOR_MAP_KIND)
  check(lib.cuStreamBeginCapture_v2(stream.handle, CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture_v2")
  try:
    if maps:   # a TMA kernel, through a packed buffer that is never run (kernel_params.py: not its real layout)
      kinds = launch.arg_kinds[maps:]
      pointers = [a for kind, a in zip(kinds, launch.args[maps:]) if kind == "P"]
      packed = pack_parameters(launch.args[:maps], pointers, launch.args[maps + len(pointers):])
      launch.function._launch_kernel(launch.grid, launch.block, packed, launch.shared_bytes, stream)
    else:
      args = [numpy_of_kind[kind](a) for kind, a in zip(launch.arg_kinds, launch.args)]
      launch.function(*args, grid=launch.grid, block=launch.block, shared=launch.shared_bytes, stream=stream)
  except BaseException:
    if lib.cuStreamEndCapture(stream.handle, ctypes.byref(graph)) == CUDA_SUCCESS and graph: lib.cuGraphDestroy(graph)
    raise
  check(lib.cuStreamEndCapture(stream.handle, ctypes.byref(graph)), "cuStreamEndCapture")
  try:
    node, count = CUgraphNode(), ctypes.c_size_t(1)
    check(lib.cuGraphGetNodes(graph, ctypes.byref(node), ctypes.byref(count)), "cuGraphGetNodes")
    if count.value != 1: raise CUDAGraphError(f"capturing one kernel launch recorded {count.value} graph nodes")
    params = KernelNodeParams()
    check(lib.cuGraphKernelNodeGetParams_v2(node, ctypes.byref(params)), "cuGraphKernelNodeGetParams_v2")
  finally: check(lib.cuGraphDestroy(graph), "cuGraphDestroy")
  if not params.func and not params.kern: raise CUDAGraphError("the captured kernel node names no kernel")
  identity = (params.func or 0, params.kern or 0, params.ctx or 0)
  _kernel_identities[id(launch.function)] = (launch.function, identity)
  return identity

class _KernelNode:
  """A graph node's parameters and the ctypes storage its kernelParams array points at (kept alive with it)."""
  def __init__(self, launch: KernelLaunch, identity: tuple[int, int, int]):
    self.kinds, self.current = launch.arg_kinds, list(launch.args)
    self.arguments = KernelArguments(launch.args, launch.arg_kinds)   # by reference: the driver places each one
    self.values, self.pointers = self.arguments.values, self.arguments.pointers
    func, kern, ctx = identity
    self.params = KernelNodeParams(func, *launch.grid, *launch.block, launch.shared_bytes, self.arguments.array(),
                                   None, kern, ctx)
    self.handle = CUgraphNode()

@dataclass(frozen=True)
class ChildGraph:
  """A graph made elsewhere (a captured collective: nccl.py) that runs as one node of a CUDAGraph's chain. `graph` is
  its CUgraph handle; the driver copies it into the parent, and `owner` (whatever keeps the original and the
  resources its nodes use alive, such as NCCL's buffers for that capture) is held as long as the parent is."""
  graph: int
  owner: Any = None

def begin_capture(stream: int, mode: int = CAPTURE_MODE_THREAD_LOCAL) -> None:
  """Start recording the work queued on `stream` (not the legacy default stream) into a graph instead of running it."""
  check(driver().cuStreamBeginCapture_v2(CUstream(stream), mode), "cuStreamBeginCapture_v2")

def end_capture(stream: int) -> int:
  """Stop recording on `stream`; the CUgraph handle of what was queued (the caller destroys it: destroy_graph)."""
  graph = CUgraph()
  check(driver().cuStreamEndCapture(CUstream(stream), ctypes.byref(graph)), "cuStreamEndCapture")
  return graph.value or 0

def destroy_graph(graph: int) -> None: check(driver().cuGraphDestroy(CUgraph(graph)), "cuGraphDestroy")

def capture(stream: int, record: Callable[[], None], mode: int = CAPTURE_MODE_THREAD_LOCAL) -> int:
  """The CUgraph of what `record()` queues on `stream` (a stream of the current context), recorded, not run."""
  begin_capture(stream, mode)
  try: record()
  except BaseException:
    try: destroy_graph(end_capture(stream))
    except CUDAGraphError: pass   # the capture was already invalidated by the failure being raised
    raise
  return end_capture(stream)

class CapturedGraph:
  """A graph recorded by stream capture, instantiated in the current context and launched on that context's legacy
  default stream, after the eager work queued there. `owned`: close() destroys the recording too."""
  def __init__(self, graph: int, owned: bool = True):
    self._lib, self.graph, self._exec, self.owned = driver(), CUgraph(graph), CUgraphExec(), owned
    try:
      check(self._lib.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), self.graph, 0),
            "cuGraphInstantiateWithFlags (a captured graph)")
      check(self._lib.cuGraphUpload(self._exec, CUstream(DEFAULT_STREAM)), "cuGraphUpload")
    except BaseException:
      self.close()
      raise
  def launch(self) -> None:
    if not self._exec: raise CUDAGraphError("launch() on a closed captured graph")
    check(self._lib.cuGraphLaunch(self._exec, CUstream(DEFAULT_STREAM)), "cuGraphLaunch")
  def close(self) -> None:
    if self._exec: check(self._lib.cuGraphExecDestroy(self._exec), "cuGraphExecDestroy")
    self._exec = CUgraphExec()
    if self.graph and self.owned: check(self._lib.cuGraphDestroy(self.graph), "cuGraphDestroy")
    self.graph = CUgraph()
  def __del__(self):
    try: self.close()
    except (CUDAGraphError, AttributeError): pass   # interpreter shutdown or a half-built graph

class _ChildNode:
  """A child-graph node: the graph it copies, and the handle the driver gives the node."""
  def __init__(self, child: ChildGraph):
    self.child, self.handle = child, CUgraphNode()

class CUDAGraph:
  """The launches as one CUDA graph, each node depending on the one before (a kernel that waits for prior grids
  programmatically under PDL=1: see programmatic_edges), or with `dependencies` on the nodes each one lists (indices
  of earlier nodes: `data_dependencies`; the edge from the node just before stays programmatic where PDL allows it),
  instantiated once and replayed by `launch()`. A launch is a
  KernelLaunch, or a ChildGraph (a captured collective) that runs as one node in its place. `update(i, args)` patches
  kernel i of the instantiated graph; launches already queued keep their arguments. `close()` (or garbage
  collection) destroys the graph."""
  def __init__(self, launches: Sequence[KernelLaunch | ChildGraph], stream: int = DEFAULT_STREAM,
               dependencies: Optional[Sequence[tuple[int, ...]]] = None):
    if not launches: raise ValueError("a CUDA graph needs at least one kernel launch")
    self.stream = CUstream(stream)
    self.param_updates = 0   # kernel nodes patched by update() (unchanged arguments are not patched)
    self._lib = driver()
    self._graph, self._exec = CUgraph(), CUgraphExec()
    self.nodes: list[Any] = [_ChildNode(launch) if isinstance(launch, ChildGraph) else
                             _KernelNode(launch, kernel_identity(launch)) for launch in launches]
    check(self._lib.cuGraphCreate(ctypes.byref(self._graph), 0), "cuGraphCreate")
    self.programmatic = programmatic_edges(launches, bool(Context.PDL) and has_programmatic_edges())
    self.dependencies = [tuple(d) for d in dependencies] if dependencies is not None else \
      [(index - 1,) if index else () for index in range(len(launches))]
    try:
      for index, (node, launch) in enumerate(zip(self.nodes, launches)):
        waits_for = self.dependencies[index]
        # the edge from the node before is programmatic where PDL allows it; every other edge is a full one
        programmatic = index > 0 and self.programmatic[index - 1] and index - 1 in waits_for
        full = [self.nodes[d].handle for d in waits_for if not (programmatic and d == index - 1)]
        handles = (CUgraphNode * len(full))(*full) if full else None
        count = len(full)
        if isinstance(node, _ChildNode):
          check(self._lib.cuGraphAddChildGraphNode(ctypes.byref(node.handle), self._graph, handles, count,
                                                   CUgraph(node.child.graph)),
                f"cuGraphAddChildGraphNode (node {index} of {len(self.nodes)})")
        else:
          check(self._lib.cuGraphAddKernelNode_v2(ctypes.byref(node.handle), self._graph, handles, count,
                                                  ctypes.byref(node.params)),
                f"cuGraphAddKernelNode_v2 (node {index} of {len(self.nodes)}, grid {launch.grid}, "
                f"block {launch.block}, {launch.shared_bytes} shared bytes)")
        if programmatic: self._add_programmatic_edge(self.nodes[index - 1], node, index)
      check(self._lib.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), self._graph, 0),
            f"cuGraphInstantiateWithFlags ({len(self.nodes)} nodes)")
      check(self._lib.cuGraphUpload(self._exec, self.stream), "cuGraphUpload")
    except BaseException:
      self.close()
      raise
    self._launch: Callable[[Any, Any], int] = self._lib.cuGraphLaunch
    # the state each child graph's owner keeps of its launches (nccl.Communicators.graph_launched), once per owner
    states = [getattr(launch.owner, "communicators", None) for launch in launches if isinstance(launch, ChildGraph)]
    self._launch_states = list({id(state): state for state in states if state is not None}.values())
    if states: _graphs_with_children.add(self)

  def _add_programmatic_edge(self, upstream: _KernelNode, downstream: _KernelNode, index: int) -> None:
    edge = EdgeData(KERNEL_NODE_PORT_PROGRAMMATIC, 0, DEPENDENCY_TYPE_PROGRAMMATIC)
    check(self._lib.cuGraphAddDependencies_v2(self._graph, ctypes.byref(upstream.handle),
                                              ctypes.byref(downstream.handle), ctypes.byref(edge), 1),
          f"cuGraphAddDependencies_v2 (programmatic edge into node {index} of {len(self.nodes)})")

  def __len__(self) -> int: return len(self.nodes)

  def update(self, index: int, args: Sequence[int], grid: Optional[Sequence[int]] = None) -> None:
    """Set kernel `index`'s arguments (same count and kinds as its launch) and, if given, its grid (x, y, z: a launch
    size that depends on a symbolic variable) for later launches; a no-op if unchanged."""
    if not 0 <= index < len(self.nodes): raise IndexError(f"kernel node {index} of a graph of {len(self.nodes)}")
    node, args = self.nodes[index], list(args)
    if isinstance(node, _ChildNode): raise ValueError(f"node {index} is a child graph: it has no kernel arguments")
    params = node.params
    new_grid = tuple(grid) if grid is not None else (params.gridDimX, params.gridDimY, params.gridDimZ)
    grid_changed = new_grid != (params.gridDimX, params.gridDimY, params.gridDimZ)
    if args == node.current and not grid_changed: return
    if len(args) != len(node.values):
      raise ValueError(f"kernel node {index} takes {len(node.values)} args ({node.kinds!r}), got {len(args)}")
    if not self._exec: raise CUDAGraphError("update() on a closed CUDA graph")
    changed = [position for position, (old, new) in enumerate(zip(node.current, args)) if old != new]
    for position in changed: _check_arg(node.kinds[position], args[position], position)
    for position in changed: node.values[position].value = args[position]
    node.current = args
    params.gridDimX, params.gridDimY, params.gridDimZ = new_grid
    check(self._lib.cuGraphExecKernelNodeSetParams_v2(self._exec, node.handle, ctypes.byref(node.params)),
          f"cuGraphExecKernelNodeSetParams_v2 (node {index})")
    self.param_updates += 1

  def update_variables(self, index: int, values: Sequence[int], global_size: Sequence[int]) -> None:
    """Set kernel `index`'s variable values (its last arguments, after the pointers) and its grid (the launch's
    global size, x first) for later launches; its pointers stay. A no-op if unchanged."""
    if not 0 <= index < len(self.nodes): raise IndexError(f"kernel node {index} of a graph of {len(self.nodes)}")
    node = self.nodes[index]
    pointers = len(node.current) - len(values)
    if pointers < 0:
      raise ValueError(f"kernel node {index} takes {len(node.values)} args ({node.kinds!r}), got {len(values)} values")
    self.update(index, node.current[:pointers] + [int(v) for v in values],
                tuple(global_size) + (1,) * (3 - len(global_size)))

  def launch(self) -> None:
    """Queue every kernel of the graph on the stream; returns before they run."""
    if not self._exec: raise CUDAGraphError("launch() on a closed CUDA graph")
    if (result := self._launch(self._exec, self.stream)) != CUDA_SUCCESS: check(result, "cuGraphLaunch")
    for state in self._launch_states: state.graph_launched = True

  def close(self) -> None:
    """Destroy the instantiated and the template graph (queued launches still finish)."""
    if self._exec: check(self._lib.cuGraphExecDestroy(self._exec), "cuGraphExecDestroy")
    self._exec = CUgraphExec()
    if self._graph: check(self._lib.cuGraphDestroy(self._graph), "cuGraphDestroy")
    self._graph = CUgraph()

  def __del__(self):
    try: self.close()
    except (CUDAGraphError, AttributeError): pass   # interpreter shutdown or a half-built graph: nothing to report to


def _guest_context(device: str) -> Any:
  """The context to make current around a device's graphs: None for the resident one (runtime.py), and when the CUDA
  runtime was never loaded (no device is started: a test's recording graphs)."""
  runtime = sys.modules.get("tgrad.runtime.cuda.runtime")
  return None if runtime is None else runtime.guest_context(device)

_live_runners: weakref.WeakSet = weakref.WeakSet()   # every CUDAGraphRunner not yet collected (close_every_graph)

_graphs_with_children: weakref.WeakSet = weakref.WeakSet()   # CUDAGraphs holding a child graph (a captured collective)

def close_every_graph() -> None:
  """Destroy every TinyJit CUDA graph of this process (their runners build them again if called) and every other
  CUDAGraph that holds a child graph. At exit this comes before NCCL's communicators are destroyed: a graph holding a
  captured collective keeps NCCL's resources referenced, and ncclCommDestroy waits for them."""
  for runner in list(_live_runners): runner.close()
  for graph in list(_graphs_with_children):
    try: graph.close()
    except CUDAGraphError: pass   # made in a context that is gone: nothing left to release

class CUDAGraphRunner:
  """A TinyJit graph runner (jit.py's GraphRunner contract) for CUDA: each run of consecutive kernel instructions is
  one CUDAGraph, launched with one call; other instructions (copies) run between them from Python. `bind` patches
  only the kernel nodes that read a rebound input slot. Instructions are duck-typed: `.runner` (a CompiledKernel has
  `.program`, `.global_size`, `.local_size`, `.variables`), `.args` (slot indices) and `.var_vals`.
  A runner with `cuda_child_graph(device, buffers)` (a collective: nccl.py) that returns a ChildGraph joins the chain
  as one node; when it returns None it runs from Python like a copy. A rebound slot that such a node reads makes the
  whole program be built again at the next call (a captured collective's pointers can't be patched).
  On a device whose context is not the thread's resident one (runtime.py: a second GPU), its context is made current
  around building, patching and launching. A collective over several GPUs is in each GPU's instructions (jit.py's
  device_runs: `embeds_collectives`); its runner's `cuda_child_graph` gives this device's part."""
  embeds_collectives = True
  def __init__(self, device: str, instructions: Sequence[Any], slots: Sequence[Any]):
    self.device, self.slots = device, slots
    self.steps: list[Any] = []    # a CUDAGraph, or a no-argument call for an instruction that is not a kernel
    self.node_of: dict[int, list[tuple[CUDAGraph, int, Any]]] = {}   # slot → (graph, node index, instruction)
    self.node_of_instruction: dict[int, tuple[CUDAGraph, int]] = {}   # id(kernel instruction) → (graph, node index)
    self.child_slots: set[int] = set()   # slots read by a child-graph node
    self.instructions = list(instructions)
    # the kernels whose runners read variables from device memory (flash decoding): staged before every call
    self.staged = [ins for ins in self.instructions if getattr(ins.runner, "value_table", None) is not None]
    self.built = False
    self.guest_context = _guest_context(device)
    _live_runners.add(self)
  def close(self) -> None:
    """Destroy this runner's graphs (in its device's context); the next call builds them again."""
    if self.guest_context is not None: self.guest_context.enter()
    try: self._forget()
    finally:
      if self.guest_context is not None: self.guest_context.leave()
  def _launch_of(self, instruction: Any) -> KernelLaunch:
    runner = instruction.runner
    pointers = [int(self.slots[s].buffer.handle) for s in instruction.args]
    vals = list(runner.argument_values(instruction.var_vals))
    global_size, local_size = runner.launch_dims(instruction.var_vals)   # sizes of symbolic kernels per call
    return KernelLaunch.for_program(runner.program, pointers, global_size, local_size, vals)
  def _child_of(self, instruction: Any) -> Optional[ChildGraph]:
    make = getattr(instruction.runner, "cuda_child_graph", None)
    return None if make is None else make(self.device, [self.slots[s].buffer for s in instruction.args])
  def _accesses(self, ins: Any, launch: KernelLaunch | ChildGraph) -> Optional[list[Access]]:
    """The byte ranges a kernel instruction reads and writes (outputs first), for `data_dependencies`; None for a
    child graph. An input slot's range is every address: a later call may bind it to any buffer, even one this graph
    writes, and no rebinding then changes the edges."""
    if isinstance(launch, ChildGraph): return None
    ranges = []
    for position, s in enumerate(ins.args):
      slot, writes = self.slots[s], position < getattr(ins, "output_count", 1)
      if getattr(slot, "kind", None) == INPUT_SLOT_KIND: ranges.append((0, ANY_ADDRESS, writes))
      else:
        start = int(slot.buffer.handle)
        ranges.append((start, start + max(slot.buffer.nbytes, 1), writes))
    return ranges
  @staticmethod
  def busy_fraction(instruction: Any) -> Optional[float]:
    """How much of its GPU a kernel instruction keeps busy, for side-kernel placement (tgrad/side_kernels.py): its
    blocks over the GPU's SMs, at most 1; None for what is not a kernel, and where kernels don't branch
    (GRAPH_BRANCHES=0: a side kernel would wait for the one before it wherever it is)."""
    runner = instruction.runner
    if not Context.GRAPH_BRANCHES or not hasattr(runner, "program"): return None
    from tgrad.device import Device
    global_size, _ = runner.launch_dims(instruction.var_vals)
    return min(1.0, int(prod(global_size)) / Device[instruction.device].sm_count)
  def _build(self) -> None:
    pending: list[Any] = []
    launches: list[KernelLaunch | ChildGraph] = []
    def flush() -> None:
      if not pending: return
      dependencies = data_dependencies([self._accesses(ins, launch) for ins, launch in zip(pending, launches)]) \
        if Context.GRAPH_BRANCHES else None
      if dependencies is not None: dependencies = starting_with_previous(pending, dependencies)
      graph = CUDAGraph(list(launches), dependencies=dependencies)
      for index, (ins, launch) in enumerate(zip(pending, launches)):
        if isinstance(launch, ChildGraph):
          self.child_slots.update(ins.args)
          continue
        for s in dict.fromkeys(ins.args): self.node_of.setdefault(s, []).append((graph, index, ins))
        self.node_of_instruction[id(ins)] = (graph, index)
      self.steps.append(graph)
      pending.clear()
      launches.clear()
    for ins in self.instructions:
      if hasattr(ins.runner, "program"): launch: Optional[KernelLaunch | ChildGraph] = self._launch_of(ins)
      else: launch = self._child_of(ins)
      if launch is None and len(getattr(ins, "devices", ())) > 1 and getattr(ins.runner, "per_device", False):
        raise CUDAGraphError(f"{ins.runner.name}: a collective in {self.device}'s graph gave no part for it")
      if launch is not None:
        pending.append(ins)
        launches.append(launch)
      else:
        flush()
        self.steps.append(lambda ins=ins: ins.runner([self.slots[s].buffer for s in ins.args], False, ins.var_vals))
    flush()
    self.built = True
  def _forget(self) -> None:
    """Drop every graph: the next call builds them again from the slots as they are then."""
    for step in self.steps:
      if isinstance(step, CUDAGraph): step.close()
    self.steps, self.node_of, self.node_of_instruction, self.child_slots = [], {}, {}, set()
    self.built = False
  def bind(self, changed_slots: Sequence[int]) -> None:
    if not self.built: return   # the first run builds every node from the slots as they are then
    if self.child_slots.intersection(changed_slots): return self._forget()
    if self.guest_context is not None: self.guest_context.enter()
    try:
      patched: set[tuple[int, int]] = set()
      for s in changed_slots:
        for graph, index, ins in self.node_of.get(s, ()):
          if (id(graph), index) in patched: continue
          patched.add((id(graph), index))
          graph.update(index, self._launch_of(ins).args)
    finally:
      if self.guest_context is not None: self.guest_context.leave()
  def rebind_variables(self, instructions: Sequence[Any]) -> None:
    """Patch the kernel nodes of these instructions (whose var_vals changed): new variable arguments and grid. Runs
    every replay of a symbolic program, so it does only that: no pointers read, no launch rebuilt."""
    if not self.built: return
    if self.guest_context is not None: self.guest_context.enter()
    try:
      for ins in instructions:
        if (node := self.node_of_instruction.get(id(ins))) is None: continue   # not a kernel of these graphs
        graph, index = node
        runner = ins.runner
        graph.update_variables(index, list(runner.argument_values(ins.var_vals)),
                              runner.launch_dims(ins.var_vals)[0])
    finally:
      if self.guest_context is not None: self.guest_context.leave()
  def prepare(self) -> None:
    """Build the graphs now (instantiated and uploaded), so the next call only launches."""
    if self.built: return
    if self.guest_context is not None: self.guest_context.enter()
    try: self._build()
    finally:
      if self.guest_context is not None: self.guest_context.leave()
  def __call__(self) -> None:
    if self.guest_context is not None: self.guest_context.enter()
    try:
      if not self.built: self._build()
      if self.staged:   # values in device memory (device_values.py), queued before the graphs
        stage_all([pair for ins in self.staged for pair in ins.runner.staged_values(ins.var_vals)])
      for step in self.steps:
        if isinstance(step, CUDAGraph): step.launch()
        else: step()
    finally:
      if self.guest_context is not None: self.guest_context.leave()
