"""The Hopper warpgroup-MMA matmul (wgmma.py) with its tiles loaded by the tensor-memory accelerator (TMA) and its
warps specialized: C = A·Bᵀ (or A·B) in half/bfloat16 with float32 accumulators, sm_90a.

  - **Loads.** A and B come through tensor maps (tensor_map.py), passed by value as the kernel's first parameters
    (`const __grid_constant__`): `cp.async.bulk.tensor.2d` copies a whole box per instruction into the 128-byte-swizzled
    layout the wgmma descriptors of wgmma.py read (a K-major box of 64 K-elements × rows is exactly `k_major_offset`'s
    tile; an N-major B tile is BN/64 boxes of 64 N-elements × 64 K-rows, one per atom, 8 KiB apart), zeros where the
    box leaves the matrix, and the copy engine counts its bytes on the stage's mbarrier (complete_tx).
  - **Warp specialization.** The block is `warpgroups` consumer warpgroups (the wgmmas, 64 rows each) and one producer
    warpgroup, the last, whose first thread issues every copy. With two consumers the producer gives its registers
    back (`setmaxnreg.dec` to PRODUCER_REGISTERS) and the consumers take them (`setmaxnreg.inc`): the accumulators of
    a 128×256 tile need more than the 168 registers a thread of 384 gets at launch.
  - **Pipeline** of `stages` buffers, each with a full and an empty mbarrier (in shared memory after the buffers).
    Producer, tile t into stage s = t mod stages: wait until the consumers have emptied s (parity of the round before;
    the first round passes at once), `mbarrier.arrive.expect_tx` of the stage's bytes on full[s], the copies.
    Consumers: wait for full[s] (parity of this round), `wgmma.fence`, the 4 wgmmas, commit, `wgmma.wait_group 1`
    (tile t - 1's wgmmas are done), every consumer thread arrives on tile t - 1's empty barrier. After the loop,
    `wgmma.wait_group 0` and the epilogue of wgmma.py.

Every address formula is wgmma.py's or TensorMapSpec's; the CPU emulation of test/cuda_on_cpu.py runs this source
(TMA as a box copy with the swizzle, mbarriers as counters with phases).
"""
from __future__ import annotations
from typing import Optional, Union
from tgrad.dtype import DType, dtypes
from tgrad.ops import Ops
from tgrad.runtime.cuda.tensor_map import SWIZZLE_128B as TENSOR_MAP_SWIZZLE_128B, TensorMapSpec, marker_source
from tgrad.runtime.cuda.targets import DYNAMIC_SHARED_SUFFIX, WARPGROUP_MMA_ARCH
from tgrad.runtime.cuda.wgmma import (BLOCK_K, ELEMENT_BYTES, MBARRIER_BYTES, PARAMETERS, VARIABLE_SUFFIX,
                                      WARPGROUP_THREADS, WGMMA_TYPES, CExpr, MatmulShape, WgmmaConfig, _epilogue,
                                      block_prologue, check_shapes, consumer_loop_lines, parameter_list,
                                      stage_barrier_lines, wgmma_matmul_source)
from tgrad.runtime.cuda.wgmma_split import split_matmul_source

N_ATOM_COLUMNS = 64          # an N-major B atom: 64 N-elements (one 128-byte swizzled row) per K-row
REGISTER_FILE = 65536        # 32-bit registers of an SM; one block per SM (launch bounds (threads, 1))
REGISTER_GRANULE = 8         # per-thread register counts are allocated (and setmaxnreg takes them) in multiples of 8
PRODUCER_REGISTERS = 40      # the producer's threads keep loop counters and addresses only
MIN_SPECIALIZED_CONSUMERS = 2   # below this many consumer warpgroups every thread already gets its 255 registers
TMA_PARAMETER = "const __grid_constant__ TensorMap"
C_OPERATORS = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "/", Ops.MOD: "%"}   # of the non-negative sizes c_size writes

def registers_at_launch(config: WgmmaConfig) -> int:
  """Registers per thread the compiler gives a block of config.threads (one per SM), a multiple of 8."""
  return REGISTER_FILE // config.threads // REGISTER_GRANULE * REGISTER_GRANULE

def consumer_registers(config: WgmmaConfig) -> int:
  """Registers per consumer thread after the producer's setmaxnreg.dec: what the producer frees, shared out."""
  launch = registers_at_launch(config)
  freed = (launch - PRODUCER_REGISTERS) * WARPGROUP_THREADS
  return launch + freed // config.consumer_threads // REGISTER_GRANULE * REGISTER_GRANULE

def specializes_registers(config: WgmmaConfig) -> bool: return config.warpgroups >= MIN_SPECIALIZED_CONSUMERS

def tensor_map_specs(config: WgmmaConfig, m: int, n: int, k: int, arguments: tuple[str, ...]) -> tuple[TensorMapSpec,
                                                                                                        TensorMapSpec]:
  """(A's map, B's map): A M×K in boxes of BM rows × 64 K; B N×K in boxes of BN rows × 64 K, or K×N (N-major) in
  boxes of 64 K-rows × 64 N (one atom)."""
  a = TensorMapSpec(arguments.index("a"), m, k, k * ELEMENT_BYTES, config.block_m, BLOCK_K, ELEMENT_BYTES,
                    TENSOR_MAP_SWIZZLE_128B)
  if config.b_n_major:
    b = TensorMapSpec(arguments.index("b"), k, n, n * ELEMENT_BYTES, BLOCK_K, N_ATOM_COLUMNS, ELEMENT_BYTES,
                      TENSOR_MAP_SWIZZLE_128B)
  else:
    b = TensorMapSpec(arguments.index("b"), n, k, k * ELEMENT_BYTES, config.block_n, BLOCK_K, ELEMENT_BYTES,
                      TENSOR_MAP_SWIZZLE_128B)
  return a, b

def _copy_lines(c: WgmmaConfig) -> list[str]:
  """The producer's copies of K tile `t` into the stage at `stage_address` (coordinates: innermost first)."""
  lines = [f"        load_box(stage_address, a_map_address, t * {BLOCK_K}, block_row, full);"]
  if c.b_n_major:
    lines += [f"        load_box(stage_address + {c.b_offset + atom * c.n_atom_bytes}, b_map_address, "
              f"block_col + {atom * N_ATOM_COLUMNS}, t * {BLOCK_K}, full);"
              for atom in range(c.block_n // N_ATOM_COLUMNS)]
  else: lines.append(f"        load_box(stage_address + {c.b_offset}, b_map_address, t * {BLOCK_K}, block_col, full);")
  return lines

def tma_matmul_source(name: str, m: int, n: int, k: int, dtype: DType = dtypes.float16,
                      config: WgmmaConfig = WgmmaConfig(tma=True),
                      arguments: tuple[str, ...] = ("out", "a", "b"), register_split: Optional[bool] = None,
                      shape: Optional[MatmulShape] = None) -> str:
  """CUDA C of `name(a_map, b_map, out, a, b)` (the buffers in the order `arguments` names them; the maps are made
  from them by the runtime, as the module global {name}_tensor_maps says): out = a · bᵀ (a · b when b_n_major), see
  the module doc; `shape.out_dtype` float32 stores the sums unrounded. The maps are made per launch from the buffer
  pointers alone, so M is known and A row-major. Compile for sm_90a. `register_split` False leaves out the setmaxnreg
  pair (a diagnostic: the 128×256 tile then spills), None has it where specializes_registers says."""
  shape = shape or MatmulShape(m, n, k)
  if not isinstance(m, int) or not shape.plain_a or shape.variables:
    raise ValueError(f"wgmma matmul: the TMA kernel's tensor maps need a known M and a row-major A, not {shape}")
  check_shapes(m, n, k, dtype, config.b_n_major)
  if not config.tma: raise ValueError(f"wgmma matmul: tile {config} is not a TMA tile")
  if sorted(arguments) != sorted(PARAMETERS):
    raise ValueError(f"wgmma matmul: arguments {arguments} must order {list(PARAMETERS)}")
  c = config
  tiles = -(-k // BLOCK_K)
  type_name = WGMMA_TYPES[dtype]
  barriers = c.stages * c.stage_bytes
  split = specializes_registers(c) if register_split is None else register_split and specializes_registers(c)
  lines = [
    "typedef unsigned short element;",
    "struct __align__(64) TensorMap { unsigned long long opaque[16]; };   // a CUtensorMap, made on the host",
    f'extern "C" __device__ const unsigned int {name}{DYNAMIC_SHARED_SUFFIX} = {c.shared_bytes};',
    marker_source(name, tensor_map_specs(c, m, n, k, arguments)),
    f'extern "C" __global__ void __launch_bounds__({c.threads}, 1) {name}({TMA_PARAMETER} a_map, {TMA_PARAMETER} '
    f'b_map, {parameter_list(arguments, shape)}) {{',
    *block_prologue(c),
    *stage_barrier_lines(c.stages, barriers, 1, c.consumer_threads),
    f"  if (warpgroup == {c.warpgroups}) {{   // the producer",
  ]
  if split:
    lines.append(f'    asm volatile("setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGISTERS};" ::: "memory");')
  lines += [
    "    if (lane_thread == 0) {",
    "      const unsigned long long a_map_address = reinterpret_cast<unsigned long long>(&a_map);",
    "      const unsigned long long b_map_address = reinterpret_cast<unsigned long long>(&b_map);",
    "      auto load_box = [](unsigned int target, unsigned long long map, int inner, int outer, unsigned int bar) {",
    '        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, '
    '%3}], [%4];" :: "r"(target), "l"(map), "r"(inner), "r"(outer), "r"(bar) : "memory");',
    "      };",
    "      int stage = 0;",
    "      unsigned int phase = 0;",
    f"      for (int t = 0; t < {tiles}; ++t) {{",
    f"        wait(empty_barriers + {MBARRIER_BYTES} * stage, phase ^ 1);   // the consumers are done with it",
    f"        const unsigned int full = full_barriers + {MBARRIER_BYTES} * stage, stage_address = shared_base + "
    f"stage * {c.stage_bytes};",
    f'        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(full), "r"({c.stage_bytes})'
    ' : "memory");',
    *_copy_lines(c),
    f"        if (++stage == {c.stages}) {{ stage = 0; phase ^= 1; }}",
    "      }",
    "    }",
    "  } else {   // a consumer warpgroup",
  ]
  if split:
    lines.append(f'    asm volatile("setmaxnreg.inc.sync.aligned.u32 {consumer_registers(c)};" ::: "memory");')
  lines += consumer_loop_lines(c, type_name, tiles)
  lines += ["  " + line for line in _epilogue(c, n, m, shape.out_dtype or dtype, CExpr("lane_thread"),
                                              CExpr("warpgroup"))]
  lines += ["  }", "}"]
  return "\n".join(lines) + "\n"

def c_size(x) -> Union[int, str]:
  """A size of a WarpgroupMatmul (an int, or an index UOp of variables: DEFINE_VAR, CONST, ADD, MUL, IDIV, MOD of
  non-negative values) as an int or C text over the kernel's variable parameters (`{name}_arg`)."""
  if isinstance(x, int): return x
  def text(u) -> str:
    if u.op is Ops.CONST: return str(u.arg)
    if u.op is Ops.DEFINE_VAR: return f"{u.arg[0]}{VARIABLE_SUFFIX}"
    if u.op in C_OPERATORS: return f"({text(u.src[0])} {C_OPERATORS[u.op]} {text(u.src[1])})"
    raise ValueError(f"wgmma matmul: a size {x} with {u.op} has no C form here")
  return text(x)

def warpgroup_matmul_source(name: str, matmul) -> str:
  """The kernel of an OptOps.WGMMA or TF32X3 kernel (codegen/axes.py WarpgroupMatmul: shape, dtype, B layout, tile,
  loader, parameter order, A's layout, output dtype, variables): wgmma.py's cp.async kernel, this module's TMA kernel,
  or wgmma_split.py's 3xTF32 kernel."""
  config = WgmmaConfig(matmul.warpgroups, matmul.block_n, matmul.stages, matmul.b_n_major, matmul.tma,
                       matmul.split_tf32, matmul.a_registers)
  shape = MatmulShape(c_size(matmul.m), matmul.n, matmul.k, c_size(matmul.a_row_stride), matmul.a_segment,
                      c_size(matmul.a_segment_stride), matmul.out_dtype, matmul.variables)
  if config.split_tf32:   # 3xTF32 of plain float32 inputs
    return split_matmul_source(name, shape.m, matmul.n, matmul.k, config, matmul.arguments, shape=shape)
  write = tma_matmul_source if config.tma else wgmma_matmul_source
  return write(name, shape.m, matmul.n, matmul.k, matmul.dtype, config, matmul.arguments, shape=shape)

def compile_tma_matmul(name: str, m: int, n: int, k: int, dtype: DType = dtypes.float16,
                       config: WgmmaConfig = WgmmaConfig(tma=True), register_split: Optional[bool] = None) -> bytes:
  """The TMA kernel's cubin for sm_90a (NVRTC). runtime.CUDAProgram loads it, reads its tensor maps' specs and makes
  the maps from the (out, a, b) pointers of each launch; launch it on wgmma.launch_dims(config, m, n)."""
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  return compile_cuda(tma_matmul_source(name, m, n, k, dtype, config, register_split=register_split),
                      WARPGROUP_MMA_ARCH)
