"""The TMA, warp-specialized variant of the wgmma matmul (runtime/cuda/wgmma_tma.py) and its tensor maps
(tensor_map.py) without a GPU: NVRTC compiles it for sm_90a; the producer/consumer sequence is in order; the boxes the
tensor maps describe fill exactly the swizzled tiles the wgmma descriptors read (a model of the TMA's 128-byte swizzle
against wgmma.py's copy formulas); the source, run on the CPU (test/cuda_on_cpu.py: TMA as a box copy, mbarriers as
counters with phases, one OS thread per CUDA thread), equals numpy's product in outputs poisoned with NaN; launches
and CUDA-graph nodes pass the 128-byte maps first, every argument by reference (kernelParams), and a new pointer makes a
new map. The GPU run is
test/test_wgmma_gpu.py."""
import re
import numpy as np
import pytest
from tgrad.dtype import dtypes
from tgrad.runtime.cuda import wgmma
from tgrad.runtime.cuda.graph import KernelLaunch, _KernelNode
from tgrad.runtime.cuda.tensor_map import (TENSOR_MAP_ALIGNMENT, TENSOR_MAP_BYTES, TensorMapCache, TensorMapSpec,
                                           pack_parameters, specs_of_marker)
from tgrad.runtime.cuda.wgmma import WgmmaConfig, k_major_offset, n_major_offset
from tgrad.runtime.cuda.wgmma_tma import (PRODUCER_REGISTERS, REGISTER_FILE, consumer_registers, registers_at_launch,
                                          tensor_map_specs, tma_matmul_source)

RNG = np.random.default_rng(41)
CONFIGS = [WgmmaConfig(1, 64, 2, tma=True), WgmmaConfig(2, 256, 4, tma=True), WgmmaConfig(2, 128, 3, True, True),
           WgmmaConfig(1, 128, 8, True, True), WgmmaConfig(1, 48, 3, tma=True)]

def bits(x: np.ndarray, dtype) -> np.ndarray:
  if dtype == dtypes.float16: return x.astype(np.float16).view(np.uint16)
  u = x.astype(np.float32).view(np.uint32)
  return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

def swizzled_box(spec: TensorMapSpec, target: int) -> dict[tuple[int, int], int]:
  """Where the TMA puts each element (box row, box column) of a box with the 128-byte swizzle, as the CUDA guide
  describes it: rows of box_columns elements stored densely from `target`, each byte address's bits 4-6 XOR bits 7-9."""
  return {(r, e): int(wgmma.swizzled_address(np.array(target + (r * spec.box_columns + e) * spec.element_bytes)))
          for r in range(spec.box_rows) for e in range(spec.box_columns)}

@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_boxes_fill_the_tiles_the_descriptors_read(config):
  """Each box lands every element where wgmma.py's copy formulas put it (A and K-major B: row r, K chunk c at
  k_major_offset; N-major B: K-row k, N chunk j at n_major_offset), and the boxes of a stage together are its bytes:
  what the producer's expect_tx announces."""
  a_spec, b_spec = tensor_map_specs(config, 4096, 4096, 4096, ("out", "a", "b"))
  placed = swizzled_box(a_spec, 0)
  for (row, element), at in placed.items():
    assert at == k_major_offset(row, element // 8) + 2 * (element % 8)
  if config.b_n_major:
    for atom in range(config.block_n // 64):
      for (k_row, element), at in swizzled_box(b_spec, config.b_offset + atom * config.n_atom_bytes).items():
        assert at == config.b_offset + n_major_offset(config, k_row, 8 * atom + element // 8) + 2 * (element % 8)
    b_bytes = b_spec.box_bytes * (config.block_n // 64)
  else:
    for (row, element), at in swizzled_box(b_spec, config.b_offset).items():
      assert at == config.b_offset + k_major_offset(row, element // 8) + 2 * (element % 8)
    b_bytes = b_spec.box_bytes
  assert a_spec.box_bytes + b_bytes == config.stage_bytes
  src = tma_matmul_source("k", 4096, 4096, 4096, config=config)
  assert f'"r"({config.stage_bytes})' in src

def test_tensor_maps_marker_round_trips():
  config = WgmmaConfig(2, 128, 4, True, True)
  src = tma_matmul_source("k", 1001, 776, 520, config=config, arguments=("a", "out", "b"))
  values = [int(v) for v in re.search(r"k_tensor_maps\[\] = \{(.*?)\};", src).group(1).split(", ")]
  a, b = specs_of_marker(values)
  assert (a.argument, a.rows, a.columns, a.row_stride, a.box_rows, a.box_columns) == (0, 1001, 520, 1040, 128, 64)
  assert (b.argument, b.rows, b.columns, b.row_stride, b.box_rows, b.box_columns) == (2, 520, 776, 1552, 64, 64)
  assert "k(const __grid_constant__ TensorMap a_map, const __grid_constant__ TensorMap b_map, const element* " \
         "__restrict__ a, element* __restrict__ out" in src

def test_emitted_sequence():
  """Barriers made before the split; the producer (last warpgroup, one thread) waits for an empty stage, announces its
  bytes, copies A's box and B's; the consumers wait for a full stage, run 4 wgmmas, commit, wait for the previous
  tile's and release its stage. setmaxnreg only with two consumer warpgroups, registers that add up."""
  config = WgmmaConfig(2, 256, 4, tma=True)
  src = tma_matmul_source("k", 4096, 4096, 4096, config=config)
  markers = ["mbarrier.init", "fence.mbarrier_init", "__syncthreads();", "if (warpgroup == 2)",
             "setmaxnreg.dec.sync.aligned.u32 40;", "wait(empty_barriers + 8 * stage, phase ^ 1)",
             "mbarrier.arrive.expect_tx", "load_box(stage_address, a_map_address, t * 64, block_row, full)",
             f"load_box(stage_address + {config.b_offset}, b_map_address, t * 64, block_col, full)",
             "setmaxnreg.inc.sync.aligned.u32 232;", "wait(full_barriers + 8 * stage, phase)",
             "wgmma.fence.sync.aligned;"] + ["wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16"] * 4 + \
            ["wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 1;",
             "mbarrier.arrive.shared::cta.b64 _, [%0];", "wgmma.wait_group.sync.aligned 0;", "to_element(acc[0])"]
  at = 0
  for marker in markers:
    found = src.find(marker, at)
    assert found >= 0, f"{marker!r} missing or out of order"
    at = found + len(marker)
  assert "cp.async.cg" not in src and "__launch_bounds__(384, 1)" in src
  assert f"k_dynamic_shared_bytes = {4 * 384 * 128 + 1024 + 64}" in src
  assert "setmaxnreg" not in tma_matmul_source("k", 512, 512, 512, config=WgmmaConfig(1, 128, 4, tma=True))
  assert registers_at_launch(config) == 168 and consumer_registers(config) == 232
  assert PRODUCER_REGISTERS * 128 + consumer_registers(config) * config.consumer_threads <= REGISTER_FILE

@pytest.mark.parametrize("shape,dtype,config", [((4096, 4096, 4096), dtypes.float16, CONFIGS[1]),
                                                ((1001, 777, 520), dtypes.bfloat16, WgmmaConfig(2, 128, 6, tma=True)),
                                                ((1001, 776, 520), dtypes.float16, CONFIGS[2]),
                                                ((70, 45, 88), dtypes.bfloat16, CONFIGS[0])], ids=str)
def test_nvrtc_compiles_for_sm_90a(shape, dtype, config):
  nvrtc = pytest.importorskip("tgrad.runtime.cuda.nvrtc")
  if not nvrtc.nvrtc_available(): pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
  assert len(nvrtc.compile_cuda(tma_matmul_source("k", *shape, dtype, config), "sm_90a")) > 1000

def test_bad_tiles_are_refused():
  with pytest.raises(ValueError, match="stages"): WgmmaConfig(stages=1, tma=True)
  with pytest.raises(ValueError, match="block_n"): WgmmaConfig(block_n=96, b_n_major=True, tma=True)
  with pytest.raises(ValueError, match="shared memory"): WgmmaConfig(2, 256, 5, tma=True)
  with pytest.raises(ValueError, match="TMA"): wgmma.wgmma_matmul_source("k", 64, 64, 64, config=CONFIGS[0])
  with pytest.raises(ValueError, match="not a TMA tile"): tma_matmul_source("k", 64, 64, 64, config=WgmmaConfig())
  assert wgmma.launch_dims(CONFIGS[1], 4096, 4096) == ((16, 32, 1), (384, 1, 1))   # + the producer warpgroup

# ---- the source on the CPU (each case compiles with g++ for ~10 s)

def run_emulated(src: str, config: WgmmaConfig, m: int, n: int, k: int, dtype):
  from cuda_on_cpu import cpu_available, run_on_cpu
  if not cpu_available(): pytest.skip("no g++")
  a, b = bits(RNG.standard_normal((m, k)), dtype), bits(RNG.standard_normal((n, k)), dtype)
  expected = wgmma.float_of_bits(a, dtype).astype(np.float64) @ wgmma.float_of_bits(b, dtype).astype(np.float64).T
  out = np.full(m * n, 0xFFFF, np.uint16)   # NaN in half and bfloat16
  run_on_cpu(src, "k", *wgmma.launch_dims(config, m, n), [out, a, np.ascontiguousarray(b.T) if config.b_n_major else b],
             [])
  return wgmma.float_of_bits(out.reshape(m, n), dtype), expected

CPU_CASES = [((70, 88, 520), dtypes.float16, WgmmaConfig(1, 64, 2, tma=True)),            # 9 K tiles on 2 stages
             ((130, 128, 200), dtypes.bfloat16, WgmmaConfig(2, 128, 3, True, True)),      # two consumers, B K×N
             ((64, 200, 136), dtypes.float16, WgmmaConfig(1, 64, 3, True, True))]

@pytest.mark.parametrize("shape,dtype,config", CPU_CASES, ids=str)
def test_source_runs_on_cpu_and_matches_numpy(shape, dtype, config):
  """Partial tiles on M, N and K, more K tiles than stages (every stage reused, the phases flip)."""
  got, expected = run_emulated(tma_matmul_source("k", *shape, dtype, config), config, *shape, dtype)
  assert not np.isnan(got).any(), f"{np.isnan(got).sum()} outputs never written"
  np.testing.assert_allclose(got, expected, rtol=2 ** -10 if dtype == dtypes.float16 else 2 ** -7, atol=1e-3)

def test_emulation_catches_a_wrong_box():
  """A producer that loads A's box of the next K tile (not this one) gives wrong products."""
  shape, dtype, config = CPU_CASES[0]
  src = tma_matmul_source("k", *shape, dtype, config).replace("a_map_address, t * 64", "a_map_address, (t + 1) * 64")
  got, expected = run_emulated(src, config, *shape, dtype)
  assert not np.allclose(got, expected, rtol=1e-2, atol=1e-1)

# ---- launches: maps first, cached per pointer tuple, graph nodes

def test_maps_are_made_per_pointer_tuple():
  made = []
  def fake_encode(spec, address):
    made.append((spec.argument, address))
    return address.to_bytes(8, "little") * 16
  cache = TensorMapCache(tensor_map_specs(CONFIGS[0], 64, 64, 64, ("out", "a", "b")), fake_encode)
  assert cache([0x1000, 0x2000, 0x3000]) == (bytes.fromhex("0020000000000000") * 16,
                                             bytes.fromhex("0030000000000000") * 16)
  cache([0x1000, 0x2000, 0x3000])
  assert made == [(1, 0x2000), (2, 0x3000)]   # the second launch reused them
  cache([0x1000, 0x2000, 0x4000])             # a rebound b: new maps
  assert made[-1] == (2, 0x4000) and len(made) == 4
  with pytest.raises(ValueError, match="buffers"): cache([0x1000])

def test_parameters_pack_maps_first_and_graph_nodes_point_at_aligned_maps():
  maps = [bytes(range(128)), bytes(range(128, 256))]
  packed = pack_parameters(maps, [0x10, 0x20, 0x30], [7])
  assert len(packed) == 2 * TENSOR_MAP_BYTES + 4 * 8 and packed[:256] == b"".join(maps)
  assert packed[256:264] == (0x10).to_bytes(8, "little") and packed[-8:] == (7).to_bytes(8, "little")
  class Program:   # what KernelLaunch.for_program reads of a CUDAProgram
    function, shared_bytes, waits_for_prior_grids = object(), 1024, False
    tensor_maps = staticmethod(lambda pointers: tuple(maps))
  launch = KernelLaunch.for_program(Program(), [0x10, 0x20, 0x30], (4, 2), (384,))
  assert launch.arg_kinds == "MMPPP" and launch.args[:2] == maps
  node = _KernelNode(launch, (1, 0, 0))
  import ctypes
  for i, expected in enumerate(maps):
    assert node.pointers[i] % TENSOR_MAP_ALIGNMENT == 0 and ctypes.string_at(node.pointers[i], 128) == expected
  assert ctypes.c_uint64.from_address(node.pointers[2]).value == 0x10
  node.values[1].value = maps[0]   # what CUDAGraph.update does for a re-encoded map
  assert ctypes.string_at(node.pointers[1], 128) == maps[0]
  with pytest.raises(ValueError, match="tensor map"): KernelLaunch(None, (1, 1, 1), (1, 1, 1), 0, [b"x"], "M")

def test_launches_pass_every_argument_by_reference(monkeypatch):
  """A TMA kernel's launch hands the driver one pointer per argument (kernelParams), never a packed buffer: the
  compiler puts the first tensor map 48 bytes into the parameter block on sm_90, not where a packed buffer has it."""
  import ctypes
  from tgrad.runtime.cuda import kernel_params
  maps = [bytes(range(128)), bytes(range(128, 256))]
  arguments = kernel_params.KernelArguments([*maps, 0x10, 0x20, 7], "MMPPq")
  calls = []
  class FakeDriver:
    def cuLaunchKernel(self, function, *rest):
      calls.append((function, rest))
      return 0
  monkeypatch.setattr(kernel_params, "driver", lambda: FakeDriver())
  kernel_params.launch_by_reference((0, 0xABC, 0x1), (4, 2, 1), (384, 1, 1), 1024, arguments)
  function, (gx, gy, gz, bx, by, bz, shared, stream, params, extra) = calls[0]
  assert function == 0xABC and (gx, gy, gz, bx, by, bz, shared) == (4, 2, 1, 384, 1, 1, 1024) and extra is None
  assert stream.value is None   # the legacy default stream (NULL), where eager kernels run
  pointers = [params[i] for i in range(5)]
  for i, expected in enumerate(maps):
    assert pointers[i] % TENSOR_MAP_ALIGNMENT == 0 and ctypes.string_at(pointers[i], 128) == expected
  assert [ctypes.c_uint64.from_address(p).value for p in pointers[2:4]] == [0x10, 0x20]
  assert ctypes.c_int64.from_address(pointers[4]).value == 7
  kernel_params.launch_by_reference((0x123, 0xABC, 0x1), (1, 1, 1), (128, 1, 1), 0, arguments)
  assert calls[1][0] == 0x123   # a CUfunction when the driver gave one
  with pytest.raises(ValueError, match="kinds"): kernel_params.KernelArguments([1, 2], "P")

def test_register_split_is_a_switch():
  config = WgmmaConfig(2, 256, 4, tma=True)
  assert "setmaxnreg" in tma_matmul_source("k", 512, 640, 2048, dtypes.float16, config)
  assert "setmaxnreg" not in tma_matmul_source("k", 512, 640, 2048, dtypes.float16, config, register_split=False)
  assert "setmaxnreg" not in tma_matmul_source("k", 512, 640, 2048, dtypes.float16, WgmmaConfig(1, 128, 4, tma=True),
                                               register_split=True)   # one consumer: nothing to split
