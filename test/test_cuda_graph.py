"""CUDA graphs (tgrad/runtime/cuda/graph.py): replays of real tgrad kernels against their eager results and numpy,
argument patching between replays, a 500-node graph, ordering with eager kernels on the same stream.

Tests marked `gpu` need an NVIDIA GPU and pycuda (test/conftest.py skips them otherwise). The rest run everywhere:
the module imports without pycuda or a driver, and its ctypes struct has the layout of cuda.h's
CUDA_KERNEL_NODE_PARAMS_v2 (CUDA 12 and 13).
"""
import ctypes, os, subprocess, sys
import numpy as np
import pytest
from tgrad.helpers import Context
from tgrad.runtime.cuda.graph import (CUDAGraph, CUDAGraphError, DRIVER_FUNCTIONS, KernelLaunch, KernelNodeParams,
                                      check, graphs_enabled)

gpu = pytest.mark.gpu
REPLAYS = 20
CHAIN_NODES = 500
ROWS, COLS = 37, 129   # odd sizes: partial blocks and masked tails
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---- no GPU needed

def test_kernel_node_params_layout_matches_cuda_h():
  # cuda.h (12.0+): CUfunction func; 7 unsigned ints (grid x y z, block x y z, sharedMemBytes); 4 bytes of padding;
  # void **kernelParams; void **extra; CUkernel kern; CUcontext ctx. 64-bit pointers: 72 bytes in all.
  expected = {"func": 0, "gridDimX": 8, "gridDimY": 12, "gridDimZ": 16, "blockDimX": 20, "blockDimY": 24,
              "blockDimZ": 28, "sharedMemBytes": 32, "kernelParams": 40, "extra": 48, "kern": 56, "ctx": 64}
  assert {name: getattr(KernelNodeParams, name).offset for name, _ in KernelNodeParams._fields_} == expected
  assert ctypes.sizeof(KernelNodeParams) == 72
  assert ctypes.alignment(KernelNodeParams) == 8

def test_struct_taking_calls_are_the_v2_entry_points():
  # the unversioned exports take the 56-byte CUDA_KERNEL_NODE_PARAMS_v1; binding them with the v2 struct is wrong
  for name in ("cuGraphAddKernelNode", "cuGraphKernelNodeGetParams", "cuGraphExecKernelNodeSetParams"):
    assert name + "_v2" in DRIVER_FUNCTIONS and name not in DRIVER_FUNCTIONS
    assert ctypes.POINTER(KernelNodeParams) in DRIVER_FUNCTIONS[name + "_v2"]

def test_module_imports_without_pycuda_and_reads_the_switch():
  script = ("import sys; sys.modules['pycuda'] = None\n"   # any `import pycuda` now fails
            "import tgrad.runtime.cuda.graph as g\n"
            "assert 'pycuda' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
            "print(g.graphs_enabled())")
  for value, expected in (("0", "False"), ("1", "True")):
    env = dict(os.environ, CUDA_GRAPH=value, PYTHONPATH=REPO_ROOT)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected

def test_switch_in_context():
  assert graphs_enabled() == bool(Context.CUDA_GRAPH)
  with Context(CUDA_GRAPH=0): assert not graphs_enabled()
  with Context(CUDA_GRAPH=1): assert graphs_enabled()

@pytest.mark.parametrize("fields, message", [
  (dict(grid=(1, 1)), "grid must be 3 positive ints"),
  (dict(block=(0, 1, 1)), "block must be 3 positive ints"),
  (dict(shared_bytes=-1), "shared_bytes"),
  (dict(args=[1, 2]), "has 2 args but 3 arg kinds"),
  (dict(arg_kinds="PPf"), "kind 'f'"),
  (dict(args=[1, 2, 2**31]), "argument 2 of kind 'i'"),
  (dict(args=[-1, 2, 3]), "argument 0 of kind 'P'"),
])
def test_kernel_launch_rejects_bad_fields(fields, message):
  good = dict(function=None, grid=(2, 1, 1), block=(32, 1, 1), shared_bytes=0, args=[1, 2, 3], arg_kinds="PPi")
  with pytest.raises(ValueError, match=message): KernelLaunch(**{**good, **fields})

def test_kernel_launch_for_program_pads_dims():
  class Program:
    function, shared_bytes = "fn", 128
  launch = KernelLaunch.for_program(Program(), [16, 32], (5, 2), (64,), vals=(7,))
  assert (launch.grid, launch.block, launch.shared_bytes) == ((5, 2, 1), (64, 1, 1), 128)
  assert (launch.args, launch.arg_kinds) == ([16, 32, 7], "PPq")   # variables are 64-bit kernel parameters

def test_empty_graph_rejected():
  with pytest.raises(ValueError, match="at least one kernel"): CUDAGraph([])

def test_missing_driver_is_a_clear_error():
  try: ctypes.CDLL("libcuda.so.1")
  except OSError: pass
  else: pytest.skip("a CUDA driver is installed here")
  launch = KernelLaunch(None, (1, 1, 1), (1, 1, 1), 0, [], "")
  with pytest.raises(CUDAGraphError, match="libcuda.so.1"): CUDAGraph([launch])

# ---- on a GPU

def lowered_kernels(out):
  """Run out's schedule eagerly, then return (program, global_size, local_size, buffers) for each of its kernels,
  in schedule order: the kernels the eager run launched, with the buffers they used."""
  from tgrad.ops import Ops
  from tgrad.schedule import create_schedule
  from tgrad.realize import get_runner, run_schedule
  items = create_schedule([out], commit=True)
  run_schedule(items)
  kernels = []
  for item in items:
    if item.ast.op is not Ops.SINK: continue
    runner = get_runner(item.outputs[0].device, item.ast)
    buffers = list(item.bufs)
    values = [int(item.var_vals[name]) for name in runner.variables]   # e.g. the lifted Python scalar 0.5
    kernels.append((runner.program, runner.global_size, runner.local_size, buffers, values))
  return kernels

def launch_of(kernel, buffers=None) -> KernelLaunch:
  program, global_size, local_size, own_buffers, values = kernel
  return KernelLaunch.for_program(program, [int(b.handle) for b in buffers or own_buffers], global_size, local_size,
                                  values)

def pipeline(x_host: np.ndarray, w_host: np.ndarray):
  """Three tgrad kernels: y = relu(x·w + 1); s = Σ_cols y; z = 0.5·exp2(y / (s + 1)). Returns (z lazy, reference)."""
  from tgrad import Tensor
  x, w = Tensor(x_host, device="CUDA"), Tensor(w_host, device="CUDA")
  y = (x * w + 1).relu().contiguous()
  z = (y / (y.sum(axis=1, keepdim=True) + 1).contiguous()).exp2() * 0.5   # its own kernel (not a row kernel)
  return z.lazydata, reference(x_host, w_host)

def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  y = np.maximum(x.astype(np.float64) * w + 1, 0)
  return np.exp2(y / (y.sum(axis=1, keepdims=True) + 1)) * 0.5

def random_inputs(rng):
  return (rng.standard_normal((ROWS, COLS)).astype(np.float32), rng.standard_normal(COLS).astype(np.float32))

@gpu
def test_replay_matches_eager_kernels():
  x, w = random_inputs(np.random.default_rng(1))
  out, expected = pipeline(x, w)
  kernels = lowered_kernels(out)
  assert len(kernels) == 3
  eager = kernels[-1][3][0].copyout()
  np.testing.assert_allclose(eager.reshape(ROWS, COLS), expected, rtol=1e-5, atol=1e-6)
  for kernel in kernels: kernel[3][0].copyin(np.full(kernel[3][0].size, np.nan, np.float32))   # poison outputs
  graph = CUDAGraph([launch_of(k) for k in kernels])
  assert len(graph) == 3
  graph.launch()
  for kernel in kernels: assert not np.isnan(kernel[3][0].copyout()).any()
  np.testing.assert_array_equal(kernels[-1][3][0].copyout(), eager)   # the same kernels: the same bits
  graph.close()
  with pytest.raises(CUDAGraphError, match="closed"): graph.launch()

@gpu
def test_update_swaps_inputs_and_output_between_replays():
  from tgrad.device import Buffer
  from tgrad.dtype import dtypes
  rng = np.random.default_rng(2)
  out, _ = pipeline(*random_inputs(rng))
  kernels = lowered_kernels(out)
  x_buffer, w_buffer = kernels[0][3][1], kernels[0][3][2]
  z_buffer = kernels[-1][3][0]
  graph = CUDAGraph([launch_of(k) for k in kernels])
  kept = []   # every replay's buffers stay alive, so the allocator cannot hand back the same pointers
  for replay in range(REPLAYS):
    x, w = random_inputs(rng)
    new = {id(x_buffer): Buffer("CUDA", x.size, dtypes.float32).copyin(x),
           id(w_buffer): Buffer("CUDA", w.size, dtypes.float32).copyin(w),
           id(z_buffer): Buffer("CUDA", ROWS * COLS, dtypes.float32).copyin(np.full(ROWS * COLS, np.nan, np.float32))}
    kept.append(new)
    before = graph.param_updates
    for index, kernel in enumerate(kernels):
      graph.update(index, launch_of(kernel, [new.get(id(b), b) for b in kernel[3]]).args)
    assert graph.param_updates - before == 2   # the first kernel reads x and w, the last writes z; the middle one
    graph.launch()
    result = new[id(z_buffer)].copyout().reshape(ROWS, COLS)
    np.testing.assert_allclose(result, reference(x, w), rtol=1e-5, atol=1e-6, err_msg=f"replay {replay}")
    for index, kernel in enumerate(kernels):   # the same arguments again: nothing is patched
      graph.update(index, launch_of(kernel, [new.get(id(b), b) for b in kernel[3]]).args)
    assert graph.param_updates - before == 2

ADD_SOURCE = """extern "C" __global__ void graph_test_add(int* out, const int* in, long long n, long long k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + k;
}"""
ADD_BLOCK = 128

def add_program():
  """A kernel with int arguments, compiled and loaded by the CUDA device like any tgrad kernel."""
  from tgrad.device import Device
  device = Device["CUDA"]
  return device.program("graph_test_add", device.compiler.compile_cached(ADD_SOURCE))

def int_buffer(data: np.ndarray):
  from tgrad.device import Buffer
  from tgrad.dtype import dtypes
  return Buffer("CUDA", data.size, dtypes.int32).copyin(data.astype(np.int32))

def add_launch(program, out, src, n: int, k: int) -> KernelLaunch:
  return KernelLaunch.for_program(program, [int(out.handle), int(src.handle)], (-(-n // ADD_BLOCK),), (ADD_BLOCK,),
                                  vals=(n, k))

@gpu
def test_500_node_chain_replays_in_order_and_patches_values():
  program, n = add_program(), 1001
  start = np.random.default_rng(3).integers(-1000, 1000, n)
  a, b = int_buffer(start), int_buffer(np.zeros(n))
  # node i adds i + 1, from a to b when i is even and back otherwise: every node reads what the one before wrote
  launches = [add_launch(program, *((b, a) if i % 2 == 0 else (a, b)), n, i + 1) for i in range(CHAIN_NODES)]
  graph = CUDAGraph(launches)
  assert len(graph) == CHAIN_NODES
  total = CHAIN_NODES * (CHAIN_NODES + 1) // 2
  graph.launch()
  np.testing.assert_array_equal(a.copyout(), start + total)
  graph.launch()
  graph.launch()
  np.testing.assert_array_equal(a.copyout(), start + 3 * total)
  for i, launch in enumerate(launches): graph.update(i, launch.args[:3] + [-2])   # every node now subtracts 2
  assert graph.param_updates == CHAIN_NODES
  graph.launch()
  np.testing.assert_array_equal(a.copyout(), start + 3 * total - 2 * CHAIN_NODES)

@gpu
def test_graph_is_ordered_with_eager_kernels():
  program, n = add_program(), (1 << 24) + 3   # big enough that an unordered read would see unfinished writes
  start = np.random.default_rng(4).integers(-1000, 1000, n)
  x, y, z, w = int_buffer(start), int_buffer(np.zeros(n)), int_buffer(np.zeros(n)), int_buffer(np.zeros(n))
  graph = CUDAGraph([add_launch(program, z, y, n, 10), add_launch(program, y, z, n, 100),
                     add_launch(program, z, y, n, 1000)])
  grid = (-(-n // ADD_BLOCK),)
  for step in range(3):
    program(y.handle, x.handle, global_size=grid, local_size=(ADD_BLOCK,), vals=(n, step))   # eager: y = x + step
    graph.launch()                                                                             # z = y + 1110
    program(w.handle, z.handle, global_size=grid, local_size=(ADD_BLOCK,), vals=(n, 5))      # eager: w = z + 5
    np.testing.assert_array_equal(w.copyout(), start + step + 1115, err_msg=f"step {step}")

@gpu
def test_update_variables_patches_values_and_grid_keeps_pointers():
  """A symbolic kernel's replay patches only its variable values and grid: n = 1000 then 130 (a smaller grid) then
  1000 again; the elements past the second n keep what the first launch wrote."""
  program, n = add_program(), 1000
  start = np.random.default_rng(5).integers(-1000, 1000, n)
  a, b = int_buffer(start), int_buffer(np.zeros(n))
  graph = CUDAGraph([add_launch(program, b, a, n, 1)])
  graph.launch()
  np.testing.assert_array_equal(b.copyout(), start + 1)
  graph.update_variables(0, [130, 7], (-(-130 // ADD_BLOCK),))
  assert graph.nodes[0].current[:2] == [int(b.handle), int(a.handle)]
  graph.launch()
  np.testing.assert_array_equal(b.copyout(), np.concatenate([start[:130] + 7, start[130:] + 1]))
  graph.update_variables(0, [n, 2], (-(-n // ADD_BLOCK),))
  graph.launch()
  np.testing.assert_array_equal(b.copyout(), start + 2)
  with pytest.raises(ValueError, match="argument 3 of kind 'q'"): graph.update_variables(0, [n, 2**63], (8,))
  with pytest.raises(ValueError, match="takes 4 args"): graph.update_variables(0, [1, 2, 3, 4, 5], (8,))

@gpu
def test_update_rejects_bad_arguments():
  program, n = add_program(), 64
  a, b = int_buffer(np.arange(n)), int_buffer(np.zeros(n))
  graph = CUDAGraph([add_launch(program, b, a, n, 1)])
  pointers = [int(b.handle), int(a.handle)]
  with pytest.raises(IndexError, match="kernel node 1 of a graph of 1"): graph.update(1, pointers + [n, 1])
  with pytest.raises(ValueError, match="takes 4 args"): graph.update(0, pointers + [n])
  with pytest.raises(ValueError, match="argument 3 of kind 'q'"): graph.update(0, pointers + [n, 2**63])
  with pytest.raises(ValueError, match="argument 1 of kind 'P'"): graph.update(0, [pointers[0], -8, n, 1])
  graph.launch()   # the rejected updates left the node as it was
  np.testing.assert_array_equal(b.copyout(), np.arange(n) + 1)

@gpu
def test_driver_errors_name_the_call():
  with pytest.raises(CUDAGraphError, match=r"cuGraphLaunch failed: CUDA_ERROR_INVALID_VALUE \(1\)"):
    check(1, "cuGraphLaunch")

SHARED_SOURCE = """extern "C" __device__ unsigned int graph_test_shared_dynamic_shared_bytes = 65536;
extern "C" __global__ void graph_test_shared(int* out, const int* in, long long n) {
  extern __shared__ int tile[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int slot = 16383 - (int)threadIdx.x * 127;   // up to the last int of 64 KiB: past the 48 KiB default limit
  tile[slot] = i < n ? in[i] : 0;
  __syncthreads();
  if (i < n) out[i] = 2 * tile[slot];
}"""

@gpu
def test_kernel_with_dynamic_shared_memory_over_48_kib():
  from tgrad.device import Device
  device, n = Device["CUDA"], 1000
  program = device.program("graph_test_shared", device.compiler.compile_cached(SHARED_SOURCE))
  assert program.shared_bytes == 65536
  data = np.random.default_rng(5).integers(-1000, 1000, n)
  src, out = int_buffer(data), int_buffer(np.zeros(n))
  graph = CUDAGraph([KernelLaunch.for_program(program, [int(out.handle), int(src.handle)], (-(-n // ADD_BLOCK),),
                                              (ADD_BLOCK,), vals=(n,))])
  graph.launch()
  np.testing.assert_array_equal(out.copyout(), 2 * data)
