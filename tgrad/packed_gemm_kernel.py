"""A prompt times a packed GGUF weight as one warpgroup-MMA kernel (runtime/cuda/packed_wgmma.py): the CUSTOM op that
packed_linear's default lowering (nn/quant.py) builds for half x on a GPU with warpgroup MMA, instead of a half
temporary of the weight and the dense matmul.

`packed_gemm(x, packed, ggml_type_name, shape)` takes the LazyBuffers of x (..., K) (float16 or bfloat16, its rows a
prompt: a symbolic length stays symbolic) and of the weight's blocks (N, K / block, block bytes) and returns the
output's LazyBuffer (..., N) in x's dtype, or None where the kernel does not apply (`unsupported` says why). x is
read in place when its view is row-major from its base's start (a prompt sliced to its length), else made contiguous;
the CUSTOM node keeps that view as its source, so the prompt's length is the launch's variable.

`PackedGemmKernel` is the launch site; its runner is the attention kernels' (attention_kernel.FlashAttentionRunner:
a compiled source whose variables come with each launch), so a TinyJit's CUDA graph launches it like any kernel.
"""
from __future__ import annotations
import hashlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Optional
from tgrad.attention_kernel import VARIABLE_PREFIX, FlashAttentionRunner, c_expression
from tgrad.backend import devices_offering
from tgrad.custom import CustomKernel
from tgrad.device import Device
from tgrad.dtype import dtypes
from tgrad.helpers import Context, prod
from tgrad.lazy import LazyBuffer
from tgrad.ops import ELEMENTWISE, Ops
from tgrad.shape.sint import evaluate, sint, sym_eq, unbind, variables_of, vmax_of

PACKED_WGMMA = "packed_wgmma"   # the device trait: its renderer may write the kernel (an sm_90a GPU's does)
PACKED_WGMMA_DEVICES = devices_offering(PACKED_WGMMA)
PACKED_DTYPES = {dtypes.float16: "float16", dtypes.bfloat16: "bfloat16"}
TYPICAL_ROWS = 512   # the rows a symbolic length's tile is chosen for (warpgroup_mma.py's TYPICAL_ROWS)

def kernel_source_module() -> ModuleType:
  """runtime/cuda/packed_wgmma.py, imported when a graph on a device offering the kernel asks for it."""
  import tgrad.runtime.cuda.packed_wgmma as module
  return module

def has_warpgroup_mma(device: str) -> bool:
  """Whether the device's renderer writes warpgroup MMA (CUDA on sm_90a); x lives on the device, so it is started."""
  return bool(getattr(Device[device].renderer, "warpgroup_mma", False))

def unsupported(x: LazyBuffer, packed: LazyBuffer, ggml_type: str, shape: tuple[int, ...]) -> Optional[str]:
  """Why the packed warpgroup kernel can't compute x·Wᵀ (None: it can). Every check is on shapes, dtypes, devices."""
  if not Context.PACKED_GEMM: return "PACKED_GEMM=0"
  if x.device not in PACKED_WGMMA_DEVICES: return f"device {x.device} has no packed warpgroup matmul"
  if x.dtype not in PACKED_DTYPES: return f"x of dtype {x.dtype}: the kernel takes float16 or bfloat16"
  module = kernel_source_module()
  if ggml_type not in module.FORMATS: return f"ggml type {ggml_type}: the kernel reads {sorted(module.FORMATS)}"
  n, k = shape
  fmt = module.FORMATS[ggml_type]
  if k % module.BLOCK_K or k % fmt.block_values: return f"K={k} is not a multiple of {module.BLOCK_K}"
  if len(x.shape) < 1 or x.shape[-1] != k: return f"x of shape {x.shape} for a weight of shape {shape}"
  if not all(isinstance(s, int) for s in x.shape[:-2]): return f"x of shape {x.shape}: only its rows may be symbolic"
  if packed.device != x.device: return f"x on {x.device}, the weight on {packed.device}"
  if not (packed.st.contiguous and packed.size == packed.base.size):   # e.g. Q6_K's blocks padded to words on a GPU
    return "the weight's blocks are a view of a larger buffer (padded blocks): the kernel reads them end to end"
  if packed.base.buffer is None and packed.base.op in ELEMENTWISE:   # a planar weight's blocks (nn/quant.py)
    return "the weight's blocks are computed (planes side by side): the kernel reads a buffer of blocks"
  if not has_warpgroup_mma(x.device): return f"{x.device} has no warpgroup MMA (sm_90a)"
  return None

@dataclass(frozen=True)
class PackedGemmKernel(CustomKernel):
  """One launch site: the weight's type, the rows M (unbound: a symbolic prompt length), N, K, x's dtype, the tile."""
  ggml_type: str
  m: sint
  n: int
  k: int
  dtype: str
  config: Any   # runtime/cuda/packed_wgmma.py's PackedConfig
  name: str = "packed_gemm"
  def variables(self) -> tuple[str, ...]: return tuple(sorted({v.arg[0] for v in variables_of(self.m)}))
  def source(self, entry: str, dependent_launch: bool = False, cluster: int = 0) -> str:
    """The CUDA source (`dependent_launch`: the kernel has no PDL form; it keeps full graph dependencies; nor a
    cluster form: `cluster` is not used)."""
    module = kernel_source_module()
    rows = self.m if isinstance(self.m, int) else f"(int){c_expression(self.m)}"
    shape = module.MatmulShape(rows, self.n, self.k)
    return module.packed_matmul_source(entry, module.FORMATS[self.ggml_type], shape, getattr(dtypes, self.dtype),
                                       self.config, tuple(VARIABLE_PREFIX + v for v in self.variables()))
  def entry(self) -> str:
    c = self.config
    digest = hashlib.sha256(repr((c_expression(self.m), self.n, self.k, c)).encode()).hexdigest()[:8]
    return f"packed_gemm_{self.ggml_type}_{self.dtype}_{self.n}x{self.k}_{c.block_m}x{c.block_n}x{c.stages}_{digest}"
  def launch_dims(self, var_vals: dict[str, int], cluster: int = 0) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return kernel_source_module().grid(self.config, evaluate(self.m, var_vals), self.n), (self.config.threads,)
  def cluster_blocks(self) -> int: return 0   # no cluster form
  def runner(self, device: str) -> FlashAttentionRunner: return FlashAttentionRunner(self, device)  # type: ignore
  def stable_repr(self) -> str:
    return f"PackedGemm({self.ggml_type},{c_expression(self.m)},{self.n},{self.k},{self.dtype},{self.config!r})"

def _row_major(lb: LazyBuffer) -> bool:
  """Whether a view reads its base row-major from its start (a prompt sliced to its length: the kernel reads it in
  place)."""
  views = lb.st.views
  if len(views) != 1 or views[0].mask is not None or lb.base.op is Ops.CONST or views[0].offset != 0: return False
  expected: sint = 1
  for size, stride in reversed(list(zip(views[0].shape, views[0].strides))):
    if size != 1 and sym_eq(stride, expected) is not True: return False
    expected = expected * size if size != 1 else expected
  return True

def packed_gemm(x: LazyBuffer, packed: LazyBuffer, ggml_type: str, shape: tuple[int, ...]) -> Optional[LazyBuffer]:
  """x·Wᵀ of shape (*x.shape[:-1], N) in x's dtype as the packed warpgroup kernel's CUSTOM op, or None where it does
  not apply (`unsupported`)."""
  if unsupported(x, packed, ggml_type, shape) is not None: return None
  module = kernel_source_module()
  n, k = shape
  rows = prod(x.shape[:-1])
  source = x if _row_major(x) else x.contiguous()
  weight = packed   # its blocks end to end (unsupported), read in place
  m = unbind(rows)[0] if not isinstance(rows, int) else rows
  config = module.packed_config(module.FORMATS[ggml_type], min(vmax_of(m), TYPICAL_ROWS), n)
  kernel = PackedGemmKernel(ggml_type, m, n, k, PACKED_DTYPES[x.dtype], config)
  return LazyBuffer.custom(kernel, (source, weight), (*x.shape[:-1], n), x.dtype, views=True)
