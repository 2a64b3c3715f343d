"""The Hopper wgmma matmul kernel (runtime/cuda/wgmma.py) without a GPU: NVRTC compiles it for sm_90a, the emitted
sequence of fences, copies, descriptors, MMAs, commits and waits is in order, and a CPU emulation of what the kernel
does with shared memory (its copies, the descriptors' addressing and the accumulator fragment layout) reproduces
numpy's product. The GPU run is test/test_wgmma_gpu.py."""
import re
import numpy as np
import pytest
from tgrad.dtype import dtypes
from tgrad.runtime.cuda import wgmma
from tgrad.runtime.cuda.renderer import CUDARenderer, MMA_M16N8K16
from tgrad.runtime.cuda.wgmma import (WgmmaConfig, accumulator_position, copies, copy_k_major, copy_n_major,
                                      decode_descriptor, emulate_block, encode_descriptor, k_major_offset,
                                      n_major_offset, wgmma_matmul_source)

RNG = np.random.default_rng(29)
SMALL = WgmmaConfig(warpgroups=1, block_n=32, stages=3)
CONFIGS = [SMALL, WgmmaConfig(), WgmmaConfig(warpgroups=1, block_n=64, stages=3), WgmmaConfig(2, 128, 5),
           WgmmaConfig(warpgroups=1, block_n=48, stages=4), WgmmaConfig(b_n_major=True),
           WgmmaConfig(warpgroups=1, block_n=64, stages=3, b_n_major=True), WgmmaConfig(2, 128, 4, b_n_major=True)]

def bits(x: np.ndarray, dtype) -> np.ndarray:
  """float32 values rounded to half/bfloat16, as their uint16 patterns (bfloat16: round to nearest even)."""
  if dtype == dtypes.float16: return x.astype(np.float16).view(np.uint16)
  u = x.astype(np.float32).view(np.uint32)
  return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

def test_descriptor_fields():
  desc = encode_descriptor(0x4A0, 128, 1024)
  assert desc == (0x4A0 >> 4) | (128 >> 4) << 16 | (1024 >> 4) << 32
  assert decode_descriptor(desc) == (0x4A0, 128, 1024, 0)
  assert decode_descriptor(encode_descriptor(0x3FFF0, 16, 0x3FFF0, swizzle=1)) == (0x3FFF0, 16, 0x3FFF0, 1)
  for bad in ((8, 128, 1024), (1 << 18, 128, 1024), (0, 100, 1024)):
    with pytest.raises(ValueError, match="descriptor"): encode_descriptor(*bad)

@pytest.mark.parametrize("n", [8, 64, 128, 256])
def test_accumulator_layout_covers_the_tile_and_matches_m16n8_fragments(n):
  """Every (row, column) of the 64×N tile is held by exactly one (thread, register); warp w's registers 4j..4j+3 are
  the m16n8k16 C fragment (renderer.MMA_M16N8K16) of rows 16w.., columns 8j.. (the PTX ISA draws them so)."""
  seen = set()
  for thread in range(wgmma.WARPGROUP_THREADS):
    warp, lane = divmod(thread, 32)
    for register in range(n // 2):
      row, column = accumulator_position(thread, register)
      seen.add((row, column))
      tile, element = divmod(register, 4)
      fragment_row, fragment_column = MMA_M16N8K16["c"].position(element, lane // 4, lane % 4)
      assert (row, column) == (16 * warp + fragment_row, 8 * tile + fragment_column)
  assert seen == {(r, c) for r in range(64) for c in range(n)}

@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_copies_cover_each_tile_once_and_each_shared_phase_without_conflicts(config):
  """Every thread's copies together cover each operand tile's chunks once, each onto its own 16 bytes of the tile;
  the 8 threads of a shared-memory phase write 8 different 16-byte bank groups (no bank conflicts); 8 consecutive
  threads read 128 contiguous bytes of global memory (one row of A, or of B along K or N)."""
  threads = np.arange(config.threads)
  for operand_b, rows in ((False, config.block_m), (True, config.block_n)):
    n_major = operand_b and config.b_n_major
    seen, offsets = set(), []
    for i in range(copies(config, operand_b)):
      if n_major:
        k_row, n_chunk = copy_n_major(config, threads, i)
        seen |= set(zip(k_row.tolist(), n_chunk.tolist()))
        offset = n_major_offset(config, k_row, n_chunk)
        for group in range(0, config.threads, 8):   # same K-row, 8 consecutive chunks of N
          assert len(set(k_row[group:group + 8])) == 1 and np.all(np.diff(n_chunk[group:group + 8]) == 1)
      else:
        row, chunk = copy_k_major(config, threads, i)
        seen |= set(zip(row.tolist(), chunk.tolist()))
        offset = k_major_offset(row, chunk)
        for group in range(0, config.threads, 8):   # one row, its 8 chunks
          assert len(set(row[group:group + 8])) == 1 and sorted(chunk[group:group + 8]) == list(range(8))
      offsets += offset.tolist()
      for phase in range(0, config.threads, 8):
        assert len({(o // 16) % 8 for o in offset[phase:phase + 8]}) == 8, "bank conflict within a phase"
    expected = {(k, c) for k in range(wgmma.BLOCK_K) for c in range(rows // 8)} if n_major else \
      {(r, c) for r in range(rows) for c in range(8)}
    assert seen == expected
    assert sorted(offsets) == list(range(0, rows * wgmma.SWIZZLE_BYTES, 16))

def test_swizzle_of_the_copies_is_the_hardware_one():
  """The copies' chunk ⊕ (row mod 8) equals the PTX swizzle on addresses (bits 4-6 ⊕ bits 7-9) of the unswizzled
  offset, for every row and chunk of a tile that starts on a 1024-byte boundary."""
  for row in range(64):
    for chunk in range(8):
      assert k_major_offset(row, chunk) == wgmma.swizzled_address(np.array(row * 128 + chunk * 16))
      config = WgmmaConfig(b_n_major=True)
      assert n_major_offset(config, row, chunk + 8) == 8192 + wgmma.swizzled_address(np.array(row * 128 + chunk * 16))

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("config,shape", [(SMALL, (70, 45, 88)), (SMALL, (64, 32, 64)), (CONFIGS[1], (130, 270, 200)),
                                          (CONFIGS[2], (5, 70, 24)), (CONFIGS[3], (128, 256, 64)),
                                          (CONFIGS[4], (64, 30, 136)), (CONFIGS[5], (200, 264, 72)),
                                          (CONFIGS[6], (70, 96, 88)), (CONFIGS[7], (130, 136, 192))], ids=str)
def test_emulated_blocks_match_numpy(config, shape, dtype):
  """Every block of the grid, emulated as the kernel moves data (copies to poisoned shared memory, descriptor reads
  through the hardware swizzle, fragment placement), equals the float32 product of the rounded inputs (sums in
  another order: 1e-5)."""
  m, n, k = shape
  a, b = bits(RNG.standard_normal((m, k)), dtype), bits(RNG.standard_normal((n, k)), dtype)
  expected = wgmma.float_of_bits(a, dtype) @ wgmma.float_of_bits(b, dtype).T
  if config.b_n_major: b = np.ascontiguousarray(b.T)   # K×N
  (grid_x, grid_y, _), _ = wgmma.launch_dims(config, m, n)
  out = np.full((m, n), np.nan, np.float32)
  for by in range(grid_y):
    for bx in range(grid_x):
      r, c = by * config.block_m, bx * config.block_n
      block = emulate_block(config, a, b, dtype, r, c)
      out[r:r + block.shape[0], c:c + block.shape[1]] = block
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4 * np.sqrt(k))

def _small_product(config: WgmmaConfig):
  a, b = bits(RNG.standard_normal((64, 64)), dtypes.float16), bits(RNG.standard_normal((config.block_n, 64)),
                                                                     dtypes.float16)
  expected = wgmma.float_of_bits(a, dtypes.float16) @ wgmma.float_of_bits(b, dtypes.float16).T
  return a, (np.ascontiguousarray(b.T) if config.b_n_major else b), expected

@pytest.mark.parametrize("config", [SMALL, WgmmaConfig(1, 128, 3, b_n_major=True)], ids=str)
def test_emulation_catches_wrong_descriptor_offsets(monkeypatch, config):
  """The emulation can fail: descriptors with the leading and stride offsets swapped read the wrong elements."""
  a, b, expected = _small_product(config)
  np.testing.assert_allclose(emulate_block(config, a, b, dtypes.float16), expected, rtol=1e-5, atol=1e-4)
  good = encode_descriptor
  monkeypatch.setattr(wgmma, "encode_descriptor", lambda start, leading, stride, swizzle=0: good(start, stride,
                                                                                                  leading, swizzle))
  assert not np.allclose(emulate_block(config, a, b, dtypes.float16), expected, rtol=1e-3, atol=1e-2)

def test_emulation_catches_a_missing_swizzle(monkeypatch):
  """Copies written without the swizzle (chunk ⊕ 0) are read wrongly through a swizzled descriptor."""
  a, b, expected = _small_product(SMALL)
  monkeypatch.setattr(wgmma, "k_major_offset", lambda row, chunk: row * 128 + chunk * 16)
  assert not np.allclose(emulate_block(SMALL, a, b, dtypes.float16), expected, rtol=1e-3, atol=1e-2)

def test_emulation_catches_a_missing_transpose(monkeypatch):
  """An N-major B read as if it were K-major (imm-trans-b 0) gives wrong results in the emulation."""
  config = WgmmaConfig(warpgroups=1, block_n=64, stages=3, b_n_major=True)
  a, b, expected = _small_product(config)
  read = wgmma.read_operand
  monkeypatch.setattr(wgmma, "read_operand", lambda *args, transposed=False: read(*args, transposed=False))
  assert not np.allclose(emulate_block(config, a, b, dtypes.float16), expected, rtol=1e-3, atol=1e-2)

def c_eval(expr: str, **names) -> int: return eval(expr.replace("/", "//"), {}, names)

@pytest.mark.parametrize("config", [WgmmaConfig(), WgmmaConfig(2, 128, 4, b_n_major=True)], ids=str)
@pytest.mark.parametrize("n", [4096, 776])
def test_source_formulas_are_the_emulated_ones(n, config):
  """The C the kernel computes its shared targets and output positions with evaluates (C integer division on
  non-negative ints is Python's //) to what the emulation used (an odd N stores one element at a time, an even N two
  adjacent columns at once)."""
  src = wgmma_matmul_source("k", 4096, n, 4096, config=config)
  targets = re.findall(r"copy_chunk\(stage_address (?:\+ (\d+) )?\+ (.*?), ([ab])_source", src)
  assert len(targets) == copies(config, False) + copies(config, True)
  for thread in (0, 5, 37, 130, config.threads - 1):
    a_targets = [c_eval(t[1], tid=thread) for t in targets if t[2] == "a"]
    b_targets = [c_eval(t[1], tid=thread) - config.b_offset + int(t[0]) for t in targets if t[2] == "b"]
    assert a_targets == [k_major_offset(*copy_k_major(config, thread, i)) for i in range(copies(config, False))]
    b_expected = [n_major_offset(config, *copy_n_major(config, thread, i)) if config.b_n_major else
                  k_major_offset(*copy_k_major(config, thread, i)) for i in range(copies(config, True))]
    assert b_targets == b_expected
  stores = re.findall(r"const int row = block_row \+ (.*), column = block_col \+ (.*);\n.*?acc\[(\d+)\]", src)
  assert len(stores) == config.accumulators // (2 if n % 2 == 0 else 1)
  for thread in (0, 37, 128 + 77, 255):
    group, lane_thread = divmod(thread, 128)
    for row_expr, column_expr, register in stores:
      row, column = accumulator_position(lane_thread, int(register))
      names = dict(warpgroup=group, lane_thread=lane_thread)
      assert (c_eval(row_expr, **names), c_eval(column_expr, **names)) == (64 * group + row, column)

def test_emitted_sequence():
  """Per K tile: wait for the copies, proxy fence, barrier, next copies, wgmma.fence, 4 wgmmas on 128-byte-swizzled
  descriptors, commit, wait_group 1; after the loop wait_group 0, then the stores."""
  config = WgmmaConfig()
  src = wgmma_matmul_source("k", 4096, 4096, 4096, config=config)
  loop = src[src.index("for (int t = 0;"):]
  markers = ["cp.async.wait_group 1;", "fence.proxy.async.shared::cta;", "__syncthreads();", "copy_tile(t + 2",
             "cp.async.commit_group;", "wgmma.fence.sync.aligned;"] + \
            ["wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16"] * 4 + \
            ["wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 1;",
             "wgmma.wait_group.sync.aligned 0;", "to_element(acc[0])"]
  at = 0
  for marker in markers:
    found = loop.find(marker, at)
    assert found >= 0, f"{marker!r} missing or out of order"
    at = found + len(marker)
  assert src.count("wgmma.mma_async") == 4
  assert f"a_bits = {encode_descriptor(0, 16, 1024, 1)}ull, b_bits = {encode_descriptor(0, 16, 1024, 1)}ull" in src
  n_major = wgmma_matmul_source("k", 4096, 4096, 4096, config=WgmmaConfig(b_n_major=True))
  assert f"b_bits = {encode_descriptor(0, 8192, 1024, 1)}ull" in n_major and ", p, 1, 1, 0, 1;" in n_major
  assert "cp.async.cg.shared.global" in src and f"k_dynamic_shared_bytes = {4 * 384 * 128 + 1024}" in src
  assert "m64n64k16.f32.bf16.bf16" in wgmma_matmul_source("k", 64, 64, 64, dtypes.bfloat16, WgmmaConfig(1, 64, 3))
  # bounds checks only where a size is not a multiple of the tile
  assert "< 4096" not in src and "< 1001" in wgmma_matmul_source("k", 1001, 4096, 4096, config=config)

@pytest.mark.parametrize("shape,dtype,config", [((4096, 4096, 4096), dtypes.float16, WgmmaConfig()),
                                                ((1001, 777, 520), dtypes.bfloat16, WgmmaConfig()),
                                                ((70, 45, 88), dtypes.float16, SMALL),
                                                ((512, 2048, 640), dtypes.float16, WgmmaConfig(2, 128, 5)),
                                                ((4096, 4096, 4096), dtypes.bfloat16, WgmmaConfig(b_n_major=True)),
                                                ((1001, 776, 520), dtypes.float16, WgmmaConfig(1, 64, 3, True))],
                         ids=str)
def test_nvrtc_compiles_for_sm_90a(shape, dtype, config):
  nvrtc = pytest.importorskip("tgrad.runtime.cuda.nvrtc")
  if not nvrtc.nvrtc_available(): pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
  cubin = nvrtc.compile_cuda(wgmma_matmul_source("wgmma_matmul", *shape, dtype, config), "sm_90a")
  assert len(cubin) > 1000

def test_renderer_flags_wgmma_only_on_sm_90a():
  assert CUDARenderer("sm_90a").warpgroup_mma and not CUDARenderer("sm_90").warpgroup_mma
  assert not CUDARenderer("sm_80").warpgroup_mma and not CUDARenderer("sm_100a").warpgroup_mma
  assert wgmma.wgmma_arch("sm_90") == "sm_90a" and wgmma.wgmma_arch("sm_80") is None
  assert wgmma.wgmma_arch("sm_100") is None

def test_bad_input_is_refused_before_any_kernel():
  with pytest.raises(ValueError, match="K a multiple of 8"): wgmma_matmul_source("k", 64, 64, 60)
  with pytest.raises(ValueError, match="dtype"): wgmma_matmul_source("k", 64, 64, 64, dtypes.int32)
  with pytest.raises(ValueError, match="sizes"): wgmma_matmul_source("k", 0, 64, 64)
  with pytest.raises(ValueError, match="N a multiple of 8"):
    wgmma_matmul_source("k", 64, 60, 64, config=WgmmaConfig(b_n_major=True))
  with pytest.raises(ValueError, match="stages"): WgmmaConfig(stages=2)
  with pytest.raises(ValueError, match="block_n"): WgmmaConfig(block_n=264)
  with pytest.raises(ValueError, match="block_n"): WgmmaConfig(block_n=96, b_n_major=True)
  with pytest.raises(ValueError, match="shared memory"): WgmmaConfig(warpgroups=2, block_n=256, stages=5)
