"""Which layer of tgrad's TMA path works on this GPU: one line per case, each case in its own Python process (an
illegal instruction or a hang kills the CUDA context, and every later call in that process fails), with a timeout.

Cases, from the bottom up:
  params            the compiled kernels' parameter table (the cubin's KPARAM_INFO: offset and size of each
                    parameter) next to the offsets a packed buffer assumes; no GPU needed. A first tensor map at
                    offset 48, not 0, is why a packed parameter buffer can't carry a map (kernel_params.py).
  box_*             a minimal kernel: one thread TMA-loads a 64×64 float16 box (the 128-byte swizzle, or none) of a
                    100×96 matrix at (row 48, column 64) — partly outside, so zero fill shows too — into shared
                    memory, waits on its mbarrier, and the block writes the box back un-swizzled; compared with numpy.
                    Launched through:
     box_eager            tgrad's CUDAProgram (maps from the module's marker, arguments by reference)
     box_graph            tgrad's CUDAGraph (a kernel node with argument kind M)
     box_ctypes           a plain cuLaunchKernel with kernelParams built here with ctypes (module loaded by the
                          driver API, not pycuda): isolates tgrad's layers
     box_packed           the old eager path: pycuda's _launch_kernel with the maps packed at offset 0 (expected to
                          crash: it is the bug this layer had)
     box_packed_padded    a packed buffer laid out with the offsets the cubin gives (expected to pass: proves the
                          offsets are the whole story)
     box_noswizzle_eager  box_eager without the swizzle (separates the swizzle from the map passing)
  mm_*              the TMA matmul kernel (wgmma_tma.py) at 512×640×2048, float16, B N×K, through CUDAProgram:
                    one consumer (1x128x4) and two (2x256x4, 2x128x4), with setmaxnreg (split) and without (nosplit)
  tile_<i>          every TMA tile of WGMMA_TILES through OptOps.WGMMA (tgrad's matmul kernel, as the GPU test runs
                    it) at two shapes and both B layouts, float16, against numpy
  jit_graph, jit_loop  a TinyJit'd a·b under WGMMA_TMA=1 with new inputs each call (CUDA graph / plain launches)

Usage: python bench/tma_probe.py [--only SUBSTRING] [--timeout SECONDS]; --case NAME runs one case in this process.
"""
from __future__ import annotations
import argparse, ctypes, os, struct, subprocess, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

ROWS, COLUMNS, BOX, ROW0, COL0 = 100, 96, 64, 48, 64   # the box kernel's matrix and box (partly out of bounds)
MM_SHAPE = (512, 640, 2048)
TILE_SHAPES = [(512, 640, 2048), (200, 136, 200)]
POISON = 0xFFFF
RESULT = "RESULT"   # a case's last stdout line: RESULT ok|FAIL <detail>
EXPECTED_TO_FAIL = {"box_packed"}   # the old launch path, kept as the control that shows the bug
# cubin .nv.info attributes: a parameter's ordinal, offset and size; a kernel's register count; the sized format
KPARAM_INFO, REGCOUNT, NV_INFO_SVAL = 0x17, 0x2F, 0x04

# ---- the cubin's parameter table

def cubin_sections(cubin: bytes) -> dict[str, tuple]:
  """The ELF section headers of a cubin by name (Elf64_Shdr fields: name, type, flags, addr, offset, size, link, info,
  addralign, entsize)."""
  shoff, shentsize, shnum, shstrndx = struct.unpack_from("<Q", cubin, 0x28)[0], *struct.unpack_from("<HHH", cubin, 0x3A)
  sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
  names = sections[shstrndx]
  def name(section) -> str:
    start = names[4] + section[0]
    return cubin[start:cubin.index(b"\0", start)].decode()
  return {name(section): section for section in sections}

def info_attributes(cubin: bytes, section: str, attribute: int) -> list[bytes]:
  """The payloads of one sized attribute in a .nv.info section (entries: format, attribute, a 16-bit value or size)."""
  info = cubin_sections(cubin)[section]
  data, found, at = cubin[info[4]:info[4] + info[5]], [], 0
  while at + 4 <= len(data):
    form, kind, value = data[at], data[at + 1], struct.unpack_from("<H", data, at + 2)[0]
    at += 4
    if form == NV_INFO_SVAL:
      if kind == attribute: found.append(data[at:at + value])
      at += value
  return found

def registers(cubin: bytes) -> int:
  """Registers per thread the module's kernel is launched with (the REGCOUNT attribute: symbol, count)."""
  return max(struct.unpack_from("<II", payload)[1] for payload in info_attributes(cubin, ".nv.info", REGCOUNT))

def parameter_table(cubin: bytes, kernel: str) -> list[tuple[int, int, int]]:
  """(ordinal, offset, size) of each parameter of `kernel`, from the cubin's .nv.info.<kernel> section."""
  table = []
  for payload in info_attributes(cubin, f".nv.info.{kernel}", KPARAM_INFO):
    _, ordinal, offset, flags = struct.unpack_from("<IHHI", payload)
    table.append((ordinal, offset, flags >> 18))
  return sorted(table)

# ---- the box kernel

# the PTX of the box kernel's copy and wait (each one string literal, as the CPU emulator of test/cuda_on_cpu.py reads)
TMA_COPY = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
PARITY_WAIT = "{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\nselp.u32 %0, 1, 0, p;\\n}\\n"

def box_source(name: str, swizzle: bool) -> str:
  from tgrad.runtime.cuda.tensor_map import SWIZZLE_128B, SWIZZLE_NONE, TensorMapSpec, marker_source
  spec = TensorMapSpec(1, ROWS, COLUMNS, COLUMNS * 2, BOX, BOX, 2, SWIZZLE_128B if swizzle else SWIZZLE_NONE)
  unswizzle = "byte ^ (((byte >> 7) & 7) << 4)" if swizzle else "byte"
  return f"""struct __align__(64) TensorMap {{ unsigned long long opaque[16]; }};
{marker_source(name, [spec])}
extern "C" __global__ void __launch_bounds__(128, 1) {name}(const __grid_constant__ TensorMap map,
    unsigned short* __restrict__ out, const unsigned short* __restrict__ source) {{
  __shared__ __align__(1024) unsigned char raw[{BOX * BOX * 2 + 1024 + 8}];   // the box, then its mbarrier
  const unsigned int raw_shared = (unsigned int)__cvta_generic_to_shared(raw);
  const unsigned int base = (raw_shared + 1023) & ~1023u, bar = base + {BOX * BOX * 2};
  if (threadIdx.x == 0) {{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(1) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }}
  __syncthreads();
  if (threadIdx.x == 0) {{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"({BOX * BOX * 2}) : "memory");
    asm volatile("{TMA_COPY}" :: "r"(base), "l"(reinterpret_cast<unsigned long long>(&map)),
                 "r"({COL0}), "r"({ROW0}), "r"(bar) : "memory");
  }}
  unsigned int done = 0;
  while (!done) asm volatile("{PARITY_WAIT}" : "=r"(done) : "r"(bar), "r"(0) : "memory");
  const unsigned char* box = raw + (base - raw_shared);
  for (int i = threadIdx.x; i < {BOX * BOX}; i += 128) {{
    const unsigned int byte = i * 2;
    out[i] = *reinterpret_cast<const unsigned short*>(box + ({unswizzle}));
  }}
}}
"""

def box_inputs():
  rng = np.random.default_rng(7)
  matrix = rng.integers(1, 60000, (ROWS, COLUMNS), dtype=np.uint16)
  expected = np.zeros((BOX, BOX), np.uint16)
  part = matrix[ROW0:ROW0 + BOX, COL0:COL0 + BOX]
  expected[:part.shape[0], :part.shape[1]] = part
  return matrix, expected

def compare_box(out: np.ndarray, expected: np.ndarray) -> str:
  wrong = int((out.reshape(BOX, BOX) != expected).sum())
  if wrong: raise AssertionError(f"{wrong} of {BOX * BOX} box elements wrong")
  return "box matches numpy (zero fill included)"

def device_buffers(matrix: np.ndarray):
  from tgrad.device import Buffer
  from tgrad.dtype import dtypes
  out = Buffer("CUDA", BOX * BOX, dtypes.uint16).copyin(np.full(BOX * BOX, POISON, np.uint16))
  source = Buffer("CUDA", matrix.size, dtypes.uint16).copyin(matrix.reshape(-1))
  return out, source

def started_program(name: str, swizzle: bool = True):
  from tgrad.device import Device
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  from tgrad.runtime.cuda.runtime import CUDAProgram
  from tgrad.runtime.cuda.targets import WARPGROUP_MMA_ARCH
  Device["CUDA"]   # starts the driver and makes the context current
  binary = compile_cuda(box_source(name, swizzle), WARPGROUP_MMA_ARCH)
  return CUDAProgram(name, binary), binary

def case_box_eager(swizzle: bool = True) -> str:
  program, _ = started_program("tma_box", swizzle)
  matrix, expected = box_inputs()
  out, source = device_buffers(matrix)
  program(out.handle, source.handle, global_size=(1,), local_size=(128,), wait=True)
  return compare_box(out.copyout(), expected)

def case_box_graph() -> str:
  from tgrad.runtime.cuda.graph import CUDAGraph, KernelLaunch
  program, _ = started_program("tma_box")
  matrix, expected = box_inputs()
  out, source = device_buffers(matrix)
  graph = CUDAGraph([KernelLaunch.for_program(program, [int(out.handle), int(source.handle)], (1,), (128,))])
  graph.launch()
  return compare_box(out.copyout(), expected)

def case_box_ctypes() -> str:
  from tgrad.device import Device
  from tgrad.runtime.cuda.driver import check
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  from tgrad.runtime.cuda.targets import WARPGROUP_MMA_ARCH
  from tgrad.runtime.cuda.tensor_map import TensorMapSpec, encode
  Device["CUDA"]
  lib = ctypes.CDLL("libcuda.so.1")   # its own function objects: argument types set here only
  binary = compile_cuda(box_source("tma_box", True), WARPGROUP_MMA_ARCH)
  module, function = ctypes.c_void_p(), ctypes.c_void_p()
  check(lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(binary)), "cuModuleLoadData")
  check(lib.cuModuleGetFunction(ctypes.byref(function), module, b"tma_box"), "cuModuleGetFunction")
  matrix, expected = box_inputs()
  out, source = device_buffers(matrix)
  tensor_map = encode(TensorMapSpec(1, ROWS, COLUMNS, COLUMNS * 2, BOX, BOX), int(source.handle))
  storage = (ctypes.c_char * 192)()
  map_address = -(-ctypes.addressof(storage) // 64) * 64
  ctypes.memmove(map_address, tensor_map, 128)
  out_pointer, source_pointer = ctypes.c_uint64(int(out.handle)), ctypes.c_uint64(int(source.handle))
  params = (ctypes.c_void_p * 3)(map_address, ctypes.addressof(out_pointer), ctypes.addressof(source_pointer))
  lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
  check(lib.cuLaunchKernel(function, 1, 1, 1, 128, 1, 1, 0, None, params, None), "cuLaunchKernel")
  check(lib.cuCtxSynchronize(), "cuCtxSynchronize")
  return compare_box(out.copyout(), expected)

def case_box_packed(padded: bool) -> str:
  from tgrad.runtime.cuda.tensor_map import pack_parameters
  program, binary = started_program("tma_box")
  matrix, expected = box_inputs()
  out, source = device_buffers(matrix)
  pointers = [int(out.handle), int(source.handle)]
  maps = program.tensor_maps(pointers)
  if padded:   # every argument at the offset the cubin gives it
    table = parameter_table(binary, "tma_box")
    packed = bytearray(max(offset + size for _, offset, size in table))
    for (_, offset, size), value in zip(table, [*maps, *(p.to_bytes(8, "little") for p in pointers)]):
      packed[offset:offset + size] = value
    packed = bytes(packed)
  else: packed = pack_parameters(maps, pointers)
  program.function._launch_kernel((1, 1, 1), (128, 1, 1), packed, 0, None)
  import pycuda.driver as cuda
  cuda.Context.synchronize()
  return compare_box(out.copyout(), expected)

def case_params() -> str:
  from tgrad.dtype import dtypes
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  from tgrad.runtime.cuda.targets import WARPGROUP_MMA_ARCH
  from tgrad.runtime.cuda.wgmma import WgmmaConfig
  from tgrad.runtime.cuda.wgmma_tma import compile_tma_matmul, registers_at_launch
  box = parameter_table(compile_cuda(box_source("tma_box", True), WARPGROUP_MMA_ARCH), "tma_box")
  config = WgmmaConfig(2, 256, 4, tma=True)
  mm_cubin = compile_tma_matmul("tma_mm", *MM_SHAPE, dtypes.float16, config)
  mm = parameter_table(mm_cubin, "tma_mm")
  def show(table): return " ".join(f"#{o}@{offset}+{size}" for o, offset, size in table)
  packed_offsets = [0, 128, 256, 264, 272]
  note = "packed layout matches" if [offset for _, offset, _ in mm] == packed_offsets else \
    f"packed layout assumes offsets {packed_offsets}: a packed buffer misplaces the maps"
  launch, expected = registers(mm_cubin), registers_at_launch(config)
  fits = "=" if launch == expected else f"!= {expected} that setmaxnreg's counts assume: the .inc may wait forever;"
  return f"box kernel {show(box)}; matmul {show(mm)}; {note}; {config} launches with {launch} registers {fits}"

# ---- the matmul kernel

def bits(x: np.ndarray, dtype) -> np.ndarray:
  from tgrad.dtype import dtypes
  if dtype == dtypes.float16: return x.astype(np.float16).view(np.uint16)
  u = x.astype(np.float32).view(np.uint32)
  return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

def check_product(out_bits: np.ndarray, a_bits: np.ndarray, b_bits: np.ndarray, dtype, k: int) -> str:
  """out against numpy's a·b (b K×N bits), the GPU test's tolerance; a short summary."""
  from tgrad.dtype import dtypes
  from tgrad.runtime.cuda import wgmma
  out = wgmma.float_of_bits(out_bits, dtype)
  expected = wgmma.float_of_bits(a_bits, dtype).astype(np.float64) @ wgmma.float_of_bits(b_bits, dtype).astype(
    np.float64)
  if np.isnan(out).any(): raise AssertionError(f"{int(np.isnan(out).sum())} of {out.size} outputs never written")
  rtol = 2 ** -10 if dtype == dtypes.float16 else 2 ** -7
  np.testing.assert_allclose(out, expected, rtol=rtol, atol=2e-6 * k)
  return f"max |err| {np.abs(out - expected).max():.3g}"

def case_matmul(warpgroups: int, block_n: int, stages: int, split: bool) -> str:
  from tgrad.device import Buffer, Device
  from tgrad.dtype import dtypes
  from tgrad.runtime.cuda import wgmma
  from tgrad.runtime.cuda.runtime import CUDAProgram
  from tgrad.runtime.cuda.wgmma import WgmmaConfig
  from tgrad.runtime.cuda.wgmma_tma import compile_tma_matmul
  Device["CUDA"]
  (m, n, k), dtype = MM_SHAPE, dtypes.float16
  config = WgmmaConfig(warpgroups, block_n, stages, tma=True)
  rng = np.random.default_rng(3)
  a, b = bits(rng.standard_normal((m, k)), dtype), bits(rng.standard_normal((n, k)), dtype)
  program = CUDAProgram("tma_mm", compile_tma_matmul("tma_mm", m, n, k, dtype, config, register_split=split))
  buffers = [Buffer("CUDA", x.size, dtypes.uint16).copyin(np.ascontiguousarray(x).reshape(-1))
             for x in (np.full((m, n), POISON, np.uint16), a, b)]
  grid, block = wgmma.launch_dims(config, m, n)
  seconds = program(*[buf.handle for buf in buffers], global_size=grid, local_size=block, wait=True)
  summary = check_product(buffers[0].copyout().reshape(m, n), a, np.ascontiguousarray(b.T), dtype, k)
  return f"{config}: {summary}, {seconds * 1e6:.0f} µs (first launch)"

def case_tile(tile: int) -> str:
  from tgrad import Tensor
  from tgrad.codegen.compile import compile_kernel
  from tgrad.codegen.kernel import Kernel, Opt, OptOps
  from tgrad.device import Buffer, Device
  from tgrad.dtype import dtypes
  from tgrad.realize import run_schedule
  from tgrad.schedule import create_schedule
  dtype, rng, done = dtypes.float16, np.random.default_rng(tile), []
  for m, n, k in TILE_SHAPES:
    for n_major in (False, True):
      a_bits, b_bits = bits(rng.standard_normal((m, k)), dtype), bits(rng.standard_normal((k, n)), dtype)
      a = Tensor(a_bits, device="CUDA").bitcast(dtype).realize()
      b = Tensor(b_bits if n_major else np.ascontiguousarray(b_bits.T), device="CUDA").bitcast(dtype).realize()
      out = a @ (b if n_major else b.T)
      items = create_schedule([out.lazydata])
      run_schedule(items[:-1])
      kernel = Kernel(items[-1].ast, Device["CUDA"].renderer)
      kernel.apply_opt(Opt(OptOps.WGMMA, 0, tile))
      runner = compile_kernel("CUDA", kernel, "wgmma_probe")
      result = Buffer("CUDA", m * n, dtype).copyin(np.full(m * n, POISON, np.uint16))
      runner([result] + list(items[-1].inputs), wait=True)
      try: check_product(result.copyout().view(np.uint16).reshape(m, n), a_bits, b_bits, dtype, k)
      except AssertionError as e: raise AssertionError(f"{(m, n, k)} {'B K×N' if n_major else 'B N×K'}: {e}") from e
      done.append(f"{m}x{n}x{k}/{'KxN' if n_major else 'NxK'}")
  return "matches numpy: " + ", ".join(done)

def case_jit(graphs: int) -> str:
  from tgrad import Tensor, TinyJit
  from tgrad.dtype import dtypes
  from tgrad.helpers import Context
  m, n, k, dtype = 1024, 2048, 512, dtypes.float16
  rng = np.random.default_rng(11)
  with Context(WGMMA_TMA=1, CUDA_GRAPH=graphs):
    jitted = TinyJit(lambda a, b: (a @ b).realize())
    for step in range(4):
      a_bits, b_bits = bits(rng.standard_normal((m, k)), dtype), bits(rng.standard_normal((k, n)), dtype)
      a = Tensor(a_bits, device="CUDA").bitcast(dtype).realize()
      b = Tensor(b_bits, device="CUDA").bitcast(dtype).realize()
      try: check_product(jitted(a, b).bitcast(dtypes.uint16).numpy(), a_bits, b_bits, dtype, k)
      except AssertionError as e: raise AssertionError(f"call {step}: {e}") from e
  return "4 calls with new inputs match numpy"

def tma_tiles() -> list[int]:
  from tgrad.codegen.warpgroup_mma import WGMMA_TILES
  return [i for i, tile in enumerate(WGMMA_TILES) if tile[-1]]

def cases() -> dict:
  table = {"params": case_params, "box_ctypes": case_box_ctypes, "box_eager": case_box_eager,
           "box_graph": case_box_graph, "box_noswizzle_eager": lambda: case_box_eager(False),
           "box_packed_padded": lambda: case_box_packed(True), "box_packed": lambda: case_box_packed(False)}
  for warpgroups, block_n, stages in ((1, 128, 4), (2, 128, 4), (2, 256, 4)):
    for split in (True, False):
      if warpgroups == 1 and not split: continue   # one consumer never splits the registers
      name = f"mm_{warpgroups}x{block_n}x{stages}_{'split' if split else 'nosplit'}"
      table[name] = lambda w=warpgroups, bn=block_n, s=stages, sp=split: case_matmul(w, bn, s, sp)
  for tile in tma_tiles(): table[f"tile_{tile}"] = lambda t=tile: case_tile(t)
  table["jit_graph"], table["jit_loop"] = lambda: case_jit(1), lambda: case_jit(0)
  return table

def run_case(name: str) -> None:
  try: print(f"{RESULT} ok {cases()[name]()}", flush=True)
  except Exception as e:   # noqa: BLE001 — every failure is the case's result
    print(f"{RESULT} FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--case", help="run one case in this process")
  parser.add_argument("--only", default="", help="run the cases whose name contains this")
  parser.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
  args = parser.parse_args()
  if args.case: return run_case(args.case)
  print(f"python {sys.version.split()[0]}; {time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
  for name in cases():
    if args.only not in name: continue
    start = time.perf_counter()
    try:
      done = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True, text=True,
                            timeout=args.timeout)
      lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
      if lines: verdict = lines[-1][len(RESULT) + 1:]
      else:
        tail = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-3:]
        verdict = f"CRASH (exit {done.returncode}): {' | '.join(tail)}"
    except subprocess.TimeoutExpired:
      verdict = f"TIMEOUT after {args.timeout:.0f} s (a hang: a barrier never completes?)"
    if name in EXPECTED_TO_FAIL: verdict = f"(expected to fail) {verdict}"
    print(f"{name:24s} {time.perf_counter() - start:6.1f}s  {verdict}", flush=True)

if __name__ == "__main__": main()
