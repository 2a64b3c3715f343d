"""The CUDA driver API (libcuda.so.1) through ctypes, for what pycuda does not bind: graphs, stream capture, contexts
made current by handle, events waited on across devices, peer copies, and how many thread block clusters of a kernel
fit on the device at once (`clusters_that_fit`).

`driver()` loads the library once, with every entry point of DRIVER_FUNCTIONS typed (all return a CUresult);
`check(result, call)` turns a failure into CUDADriverError naming the call and the driver's own error name and text.
Nothing is loaded at import: the CUDA device has started the driver (pycuda's cuInit) before any of this runs.
"""
from __future__ import annotations
import ctypes, functools
from typing import Optional

DRIVER_LIBRARY = "libcuda.so.1"
CUDA_SUCCESS = 0
# cuCtxEnablePeerAccess on a pair already enabled (cuda.h's CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED): not a failure
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704
# Kernels launched by pycuda without a stream go to the NULL stream, which the unsuffixed driver entry points (not
# the _ptsz ones) read as the legacy default stream of the current context: every eager kernel, copy and graph of a
# device runs there, so they are ordered with each other.
DEFAULT_STREAM = 0
# cuStreamBeginCapture modes (CUstreamCaptureMode in cuda.h). Thread-local: only this thread's calls are checked for
# capture safety. Relaxed: none are, so a library that allocates during its first captured call (NCCL connecting its
# peers lazily) may do so.
CAPTURE_MODE_THREAD_LOCAL = 1
CAPTURE_MODE_RELAXED = 2
# stream flag (CU_STREAM_NON_BLOCKING): the stream does not synchronize with the legacy default stream
STREAM_NON_BLOCKING = 1
# event flag (CU_EVENT_DISABLE_TIMING): an event used only for ordering, cheaper to record and wait on
EVENT_DISABLE_TIMING = 2
# cuMemHostAlloc flag (CU_MEMHOSTALLOC_PORTABLE): pinned for every context, so two GPUs can DMA from the same bytes
HOST_ALLOC_PORTABLE = 1

CUresult, CUfunction, CUgraph, CUgraphNode, CUgraphExec = ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, \
  ctypes.c_void_p, ctypes.c_void_p
CUstream, CUkernel, CUcontext, CUevent = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
CUmodule = ctypes.c_void_p
CUdeviceptr = ctypes.c_uint64

class KernelNodeParams(ctypes.Structure):
  """CUDA_KERNEL_NODE_PARAMS_v2 of cuda.h (CUDA 12.0 and later; what CUDA_KERNEL_NODE_PARAMS names there): the v1
  struct plus `kern` and `ctx`, 72 bytes. Only the _v2 entry points below take this layout."""
  _fields_ = [("func", CUfunction),
              ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
              ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
              ("sharedMemBytes", ctypes.c_uint),
              ("kernelParams", ctypes.POINTER(ctypes.c_void_p)), ("extra", ctypes.POINTER(ctypes.c_void_p)),
              ("kern", CUkernel), ("ctx", CUcontext)]

class EdgeData(ctypes.Structure):
  """CUgraphEdgeData of cuda.h (CUDA 12.3 and later): when an edge fires (from_port), for which part of the downstream
  node (to_port, always 0) and its kind (type); all zero is a full dependency with memory visibility."""
  _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
              ("reserved", ctypes.c_ubyte * 5)]

class LaunchAttribute(ctypes.Structure):
  """CUlaunchAttribute of cuda.h: an attribute id, padding to 8 bytes, and a 64-byte value union, 72 bytes."""
  _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]

class LaunchConfig(ctypes.Structure):
  """CUlaunchConfig of cuda.h (CUDA 12.0 and later): grid and block sizes, dynamic shared memory, stream, and the
  launch attributes, 56 bytes."""
  _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
              ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
              ("sharedMemBytes", ctypes.c_uint), ("hStream", CUstream),
              ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]

# CUfunction_attribute CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED (pycuda's enum has no name for it) and
# CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
FUNCTION_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
FUNCTION_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

# A programmatic edge (CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC from CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC): the
# downstream kernel launches once every block of the upstream one has run griddepcontrol.launch_dependents (or
# exited), and its own griddepcontrol.wait holds it until the upstream kernel has completed with its writes visible.
DEPENDENCY_TYPE_PROGRAMMATIC = 1
KERNEL_NODE_PORT_PROGRAMMATIC = 1

_P = ctypes.POINTER
# Every driver entry point used by tgrad's ctypes layer, by its exported (versioned) name, with its argument types.
DRIVER_FUNCTIONS: dict[str, list] = {
  "cuGetErrorName": [CUresult, _P(ctypes.c_char_p)],
  "cuGetErrorString": [CUresult, _P(ctypes.c_char_p)],
  # graphs (graph.py)
  "cuStreamBeginCapture_v2": [CUstream, ctypes.c_int],
  "cuStreamEndCapture": [CUstream, _P(CUgraph)],
  "cuGraphCreate": [_P(CUgraph), ctypes.c_uint],
  "cuGraphDestroy": [CUgraph],
  "cuGraphGetNodes": [CUgraph, _P(CUgraphNode), _P(ctypes.c_size_t)],
  "cuGraphKernelNodeGetParams_v2": [CUgraphNode, _P(KernelNodeParams)],
  "cuGraphAddKernelNode_v2": [_P(CUgraphNode), CUgraph, _P(CUgraphNode), ctypes.c_size_t, _P(KernelNodeParams)],
  "cuGraphAddChildGraphNode": [_P(CUgraphNode), CUgraph, _P(CUgraphNode), ctypes.c_size_t, CUgraph],
  "cuGraphInstantiateWithFlags": [_P(CUgraphExec), CUgraph, ctypes.c_ulonglong],
  "cuGraphExecKernelNodeSetParams_v2": [CUgraphExec, CUgraphNode, _P(KernelNodeParams)],
  "cuGraphUpload": [CUgraphExec, CUstream],
  "cuGraphLaunch": [CUgraphExec, CUstream],
  "cuGraphExecDestroy": [CUgraphExec],
  # contexts (runtime.py, nccl.py: a library that calls cudaSetDevice changes the current context)
  "cuCtxGetCurrent": [_P(CUcontext)],
  "cuCtxSetCurrent": [CUcontext],
  "cuCtxEnablePeerAccess": [CUcontext, ctypes.c_uint],
  "cuDeviceCanAccessPeer": [_P(ctypes.c_int), ctypes.c_int, ctypes.c_int],
  # ordering across devices and copies between them (peer.py)
  "cuEventCreate": [_P(CUevent), ctypes.c_uint],
  "cuEventRecord": [CUevent, CUstream],
  "cuEventDestroy_v2": [CUevent],
  "cuStreamWaitEvent": [CUstream, CUevent, ctypes.c_uint],
  "cuMemcpyPeerAsync": [CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, ctypes.c_size_t, CUstream],
  "cuMemcpyDtoDAsync_v2": [CUdeviceptr, CUdeviceptr, ctypes.c_size_t, CUstream],
  "cuMemcpyDtoHAsync_v2": [ctypes.c_void_p, CUdeviceptr, ctypes.c_size_t, CUstream],
  "cuMemcpyHtoDAsync_v2": [CUdeviceptr, ctypes.c_void_p, ctypes.c_size_t, CUstream],
  "cuMemHostAlloc": [_P(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint],
  "cuMemFreeHost": [ctypes.c_void_p],
  # launches with the arguments by reference (kernel_params.py): function, grid x/y/z, block x/y/z, dynamic shared
  # bytes, stream, kernelParams (one pointer per argument), extra
  "cuLaunchKernel": [CUfunction, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                     ctypes.c_uint, ctypes.c_uint, CUstream, _P(ctypes.c_void_p), _P(ctypes.c_void_p)],
  # tensor maps for TMA loads (tensor_map.py): the map, data type, rank, address, sizes, byte strides, box, element
  # strides, interleave, swizzle, L2 promotion, out-of-bounds fill
  "cuTensorMapEncodeTiled": [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p, _P(ctypes.c_uint64),
                             _P(ctypes.c_uint64), _P(ctypes.c_uint32), _P(ctypes.c_uint32), ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_int],
}

# Entry points a driver may lack (older than the CUDA release named): without them the feature is not used.
OPTIONAL_DRIVER_FUNCTIONS: dict[str, list] = {
  "cuGraphAddDependencies_v2": [CUgraph, _P(CUgraphNode), _P(CUgraphNode), _P(EdgeData), ctypes.c_size_t],  # 12.3
  "cuModuleLoadData": [_P(CUmodule), ctypes.c_void_p],
  "cuModuleGetFunction": [_P(CUfunction), CUmodule, ctypes.c_char_p],
  "cuModuleUnload": [CUmodule],
  "cuFuncSetAttribute": [CUfunction, ctypes.c_int, ctypes.c_int],
  "cuOccupancyMaxActiveClusters": [_P(ctypes.c_int), CUfunction, _P(LaunchConfig)],   # 12.0
  "cuStreamBatchMemOp_v2": [CUstream, ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint],   # device_values.py
}

class CUDADriverError(RuntimeError):
  """A driver call failed, or the driver (libcuda.so.1, CUDA 12.0 or later) could not be loaded."""

@functools.cache
def driver() -> ctypes.CDLL:
  """libcuda.so.1 with DRIVER_FUNCTIONS typed; loaded on first use (the CUDA device has already initialized it)."""
  try: lib = ctypes.CDLL(DRIVER_LIBRARY)
  except OSError as e: raise CUDADriverError(f"tgrad needs the CUDA driver library {DRIVER_LIBRARY}: {e}") from e
  for name, argtypes in DRIVER_FUNCTIONS.items():
    try: function = getattr(lib, name)
    except AttributeError as e:
      raise CUDADriverError(f"{DRIVER_LIBRARY} has no {name}: tgrad needs a driver for CUDA 12.0 or later") from e
    function.argtypes, function.restype = argtypes, CUresult
  for name, argtypes in OPTIONAL_DRIVER_FUNCTIONS.items():
    if (function := getattr(lib, name, None)) is not None: function.argtypes, function.restype = argtypes, CUresult
  return lib

def has_programmatic_edges() -> bool:
  """Whether the driver can make programmatic graph edges (CUDA 12.3 or later)."""
  return hasattr(driver(), "cuGraphAddDependencies_v2")

def error_name(result: int) -> str:
  """cuGetErrorName and cuGetErrorString of a CUresult, e.g. 'CUDA_ERROR_INVALID_VALUE (1): invalid argument'."""
  name, text = ctypes.c_char_p(), ctypes.c_char_p()
  lib = driver()
  if lib.cuGetErrorName(result, ctypes.byref(name)) != CUDA_SUCCESS or name.value is None: return f"CUresult {result}"
  described = lib.cuGetErrorString(result, ctypes.byref(text)) == CUDA_SUCCESS and text.value is not None
  return f"{name.value.decode()} ({result})" + (f": {text.value.decode()}" if described else "")

def check(result: int, call: str) -> None:
  """Raise CUDADriverError naming the driver call and its error unless result is CUDA_SUCCESS."""
  if result != CUDA_SUCCESS: raise CUDADriverError(f"{call} failed: {error_name(result)}")

def current_context() -> int:
  """The handle of the calling thread's current CUDA context (0 when none)."""
  context = CUcontext()
  check(driver().cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
  return context.value or 0

def set_current_context(handle: int) -> None:
  """Make the context `handle` current on this thread, in place of the one on top of its stack."""
  check(driver().cuCtxSetCurrent(CUcontext(handle)), "cuCtxSetCurrent")

class Event:
  """A driver event for ordering only (no timing), created in the context current when it is made: record it on a
  stream of that context; any device's stream may wait on it."""
  def __init__(self):
    self.handle = CUevent()
    check(driver().cuEventCreate(ctypes.byref(self.handle), EVENT_DISABLE_TIMING), "cuEventCreate")
  def record(self, stream: int = DEFAULT_STREAM) -> None:
    check(driver().cuEventRecord(self.handle, CUstream(stream)), "cuEventRecord")
  def wait_on(self, stream: int = DEFAULT_STREAM) -> None:
    """Make `stream` (of the current context) wait until the work before this event's last record is done."""
    check(driver().cuStreamWaitEvent(CUstream(stream), self.handle, 0), "cuStreamWaitEvent")
  def __del__(self):
    try:
      if self.handle: driver().cuEventDestroy_v2(self.handle)
    except (CUDADriverError, AttributeError, TypeError): pass   # interpreter shutdown

def clusters_that_fit(binary: bytes, name: str, cluster: int, block_threads: int, shared_bytes: int = 0,
                      non_portable: bool = False) -> Optional[int]:
  """How many thread block clusters of kernel `name` of the cubin `binary` (its compile-time `__cluster_dims__` of
  `cluster` blocks, `block_threads` threads and `shared_bytes` of dynamic shared memory a block) the current context's
  device holds at once: 0 where it cannot place one at all (a GPU, or a slice of one, with fewer free SMs in a GPC than
  the cluster has blocks), None where the driver can't say (an entry point missing, or the query failed). The cubin is
  loaded into a module of its own for the query and unloaded after it."""
  lib = driver()
  if not all(hasattr(lib, f) for f in ("cuModuleLoadData", "cuModuleGetFunction", "cuOccupancyMaxActiveClusters")):
    return None
  module, function, count = CUmodule(), CUfunction(), ctypes.c_int()
  image = ctypes.create_string_buffer(binary, len(binary))
  if lib.cuModuleLoadData(ctypes.byref(module), image) != CUDA_SUCCESS: return None
  try:
    if lib.cuModuleGetFunction(ctypes.byref(function), module, name.encode()) != CUDA_SUCCESS: return None
    if non_portable and lib.cuFuncSetAttribute(function, FUNCTION_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                                               1) != CUDA_SUCCESS: return None
    if shared_bytes and lib.cuFuncSetAttribute(function, FUNCTION_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                               shared_bytes) != CUDA_SUCCESS: return None
    # the cluster's size comes from the kernel's own __cluster_dims__: the config names none (a size given there
    # would have to match it), and its grid is one cluster
    config = LaunchConfig(cluster, 1, 1, block_threads, 1, 1, shared_bytes, None, None, 0)
    if lib.cuOccupancyMaxActiveClusters(ctypes.byref(count), function, ctypes.byref(config)) != CUDA_SUCCESS:
      return None
    return count.value
  finally: lib.cuModuleUnload(module)
