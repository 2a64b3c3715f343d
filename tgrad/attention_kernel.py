"""Scaled-dot-product attention as one flash-attention kernel: the CUSTOM op of the "flash" lowering of the composite
"scaled_dot_product_attention" (tensor_ops/composite.py) on devices offering it (CUDA: runtime/cuda/flash_attention.py).

`flash_attention(q, k, v, is_causal=, scale=, window=)` takes the LazyBuffers of q [B, Hq, L, D] and k, v
[B, Hkv, S, D] and returns the output's LazyBuffer [B, Hq, L, D], or None where the kernel does not apply
(`unsupported` says why: dtype, head dim, a layout it can't read, an explicit mask). Each input is read in place from
the buffer under its view: a single strided View without a mask over its base (a transpose, a head split, a slice of
a fused q/k/v projection) is passed as that base plus its element offset and strides, so no copy is made; any other
view is made contiguous first. Sizes over a symbolic length (a prompt's) stay symbolic: the kernel takes the
variables as int64 parameters and computes the lengths and strides from them (`c_expression`), so one compiled kernel
and one captured CUDA graph serve every length.

`FlashAttentionRunner` is the compiled kernel as a runner: like a CompiledKernel it has `program`, `variables` and
`launch_dims(var_vals)`, so a TinyJit's CUDA graph launches and patches it as one of its kernel nodes.
"""
from __future__ import annotations
import hashlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Optional, Sequence
from tgrad.backend import device_kind, devices_offering
from tgrad.custom import CustomKernel
from tgrad.device import Buffer, Device
from tgrad.dtype import dtypes
from tgrad.helpers import Context, prod
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops, UOp
from tgrad.regions import apply_lowering, lowerings_for
from tgrad.shape.sint import divides, evaluate, sint, sym_eq, unbind, variables_of, vmax_of

if TYPE_CHECKING: from tgrad.runtime.cuda.flash_attention import FlashConfig

FLASH_LOWERING = "flash"   # the name of the lowering, and of the device trait that offers it
FLASH_DEVICES = devices_offering(FLASH_LOWERING)
FLASH_DTYPES = {dtypes.float16: "float16", dtypes.bfloat16: "bfloat16"}
MAX_ROWS = 2 ** 31 - 1     # the kernel counts rows (positions × heads of a group) in 32-bit ints
VARIABLE_PREFIX = "var_"   # a variable's kernel parameter: its name behind this prefix (no clash with the kernel's own)
C_OPERATORS = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "/", Ops.MOD: "%"}

def kernel_source_module() -> ModuleType:
  """runtime/cuda/flash_attention.py, imported when a graph on a device offering the kernel asks for it (building a
  graph elsewhere loads no device's modules)."""
  import tgrad.runtime.cuda.flash_attention as module
  return module

def c_expression(x: sint) -> str:
  """A size as a C int64 expression of the variables' parameters (sizes are nonnegative: C's / and % are floor's)."""
  if not isinstance(x, UOp): return f"{int(x)}LL"
  x = unbind(x)[0]
  if x.op is Ops.CONST: return f"{int(x.arg)}LL"
  if x.op is Ops.DEFINE_VAR: return VARIABLE_PREFIX + x.arg[0]
  if x.op in C_OPERATORS: return f"({c_expression(x.src[0])} {C_OPERATORS[x.op]} {c_expression(x.src[1])})"
  if x.op is Ops.MAX:
    a, b = c_expression(x.src[0]), c_expression(x.src[1])
    return f"({a} > {b} ? {a} : {b})"
  if x.op is Ops.NEG: return f"(-{c_expression(x.src[0])})"
  raise ValueError(f"flash attention: no C form for {x.op} in the size {x.render()}")

@dataclass(frozen=True)
class Layout:
  """Where an input [B, H, N, D] sits in the buffer passed for it: the element offset of its first element and its
  strides over batch, head and position (the last dim is contiguous). Sizes unbound (bare variables)."""
  offset: sint
  strides: tuple[sint, sint, sint]

def _aligned(x: sint) -> bool: return divides(kernel_source_module().CHUNK_ELEMENTS, x)   # 16-byte rows (cp.async)

def strided_source(lb: LazyBuffer) -> Optional[tuple[LazyBuffer, Layout]]:
  """(the buffer to pass, how to read lb from it) for a view the kernel reads in place, else None."""
  views = lb.st.views
  if len(views) != 1 or views[0].mask is not None or lb.base.op is Ops.CONST: return None
  view = views[0]
  if view.strides[-1] != 1 and view.shape[-1] != 1: return None
  strides, offset = tuple(unbind(s)[0] for s in view.strides[:3]), unbind(view.offset)[0]
  if not all(_aligned(s) for s in (*strides, offset)): return None
  return lb.base, Layout(offset, strides)   # type: ignore[arg-type]

def contiguous_source(lb: LazyBuffer) -> tuple[LazyBuffer, Layout]:
  """lb made contiguous (a copy where it is a view), read row-major."""
  _, heads, length, dim = (unbind(s)[0] for s in lb.shape)
  return lb.contiguous(), Layout(0, (heads * length * dim, length * dim, dim))

def unsupported(query: LazyBuffer, key: LazyBuffer, value: LazyBuffer, has_mask: bool, window: Optional[int],
                is_causal: bool) -> Optional[str]:
  """Why the flash kernel can't compute this attention (None: it can). Every check is on shapes, dtypes, devices."""
  if not Context.FLASH_ATTENTION: return "FLASH_ATTENTION=0"
  if query.device not in FLASH_DEVICES: return f"device {query.device} has no flash attention kernel"
  if has_mask: return "an explicit attn_mask (the kernel knows causal and sliding-window masks only)"
  if window is not None and not is_causal: return "a window without is_causal"
  if len(query.shape) != 4 or len(key.shape) != 4 or len(value.shape) != 4:
    return "inputs not 4-D [batch, heads, length, head dim]"
  if not (query.dtype == key.dtype == value.dtype) or query.dtype not in FLASH_DTYPES:
    return f"dtypes {query.dtype}, {key.dtype}, {value.dtype}: the kernel takes float16 or bfloat16"
  if not (query.device == key.device == value.device): return "inputs on several devices"
  B, heads, _, dim = query.shape
  if not all(sym_eq(a, b) is True for a, b in ((key.shape[0], B), (value.shape[0], B), (key.shape[1], value.shape[1]),
                                                (key.shape[2], value.shape[2]))):
    return f"shapes {query.shape}, {key.shape}, {value.shape} (batch broadcasting is not taken)"
  supported = kernel_source_module().SUPPORTED_HEAD_DIMS
  if dim not in supported or key.shape[-1] != dim or value.shape[-1] != dim:
    return f"head dims {dim}, {key.shape[-1]}, {value.shape[-1]}: the kernel takes one of {supported}"
  if not all(isinstance(s, int) for s in (B, heads, key.shape[1])): return "a symbolic batch or head count"
  kv_heads = key.shape[1]
  if heads % kv_heads: return f"{heads} query heads are not a multiple of {kv_heads} kv heads"
  if vmax_of(query.shape[2]) * (heads // kv_heads) > MAX_ROWS: return "more rows than 32-bit indices hold"
  return None

@dataclass(frozen=True)
class FlashAttentionKernel(CustomKernel):
  """One flash-attention launch site: the kernel config, the inputs' layouts, the lengths (unbound sizes), the batch."""
  config: FlashConfig
  layouts: tuple[Layout, Layout, Layout]
  length: sint
  keys: sint
  batch: int
  name: str = "flash_attention"
  def sizes(self) -> dict[str, str]:
    sizes = {"L": c_expression(self.length), "S": c_expression(self.keys)}
    for label, layout in zip("qkv", self.layouts):
      sizes[f"{label}_offset"] = c_expression(layout.offset)
      sizes.update({f"{label}_{axis}": c_expression(s) for axis, s in zip(("batch", "head", "pos"), layout.strides)})
    return sizes
  def variables(self) -> tuple[str, ...]:
    sizes = (self.length, self.keys, *(s for layout in self.layouts for s in (layout.offset, *layout.strides)))
    return tuple(sorted({v.arg[0] for s in sizes for v in variables_of(s)}))
  def source(self, entry: str) -> str:
    parameters = tuple(VARIABLE_PREFIX + v for v in self.variables())
    return kernel_source_module().flash_attention_source(self.config, entry, self.sizes(), parameters)
  def entry(self) -> str:
    """The kernel's name: what it is specialized to, and a digest of its sizes."""
    c = self.config
    digest = hashlib.sha256(repr(self.sizes()).encode()).hexdigest()[:8]
    mask = "causal" if c.causal else "full"
    if c.window: mask += f"{c.window}"
    return f"flash_attention_{c.dtype}_d{c.head_dim}_g{c.group}_{mask}_{digest}"
  def runner(self, device: str) -> FlashAttentionRunner: return FlashAttentionRunner(self, device)
  def stable_repr(self) -> str: return f"FlashAttention({self.config!r},{self.sizes()!r},{self.batch})"

class FlashAttentionRunner:
  """The compiled kernel on (output, q, k, v) Buffers; its variables' values come with each launch."""
  def __init__(self, kernel: FlashAttentionKernel, device: str):
    if device_kind(device) not in FLASH_DEVICES: raise ValueError(f"flash attention does not run on {device}")
    self.kernel, self.entry = kernel, kernel.entry()
    self.name = self.entry
    self.variables = kernel.variables()
    self.program = Device[device].load_program(self.entry, kernel.source(self.entry))
    self.flops, self.nbytes = 0, 0
  def launch_dims(self, var_vals: Optional[dict[str, int]] = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    length = evaluate(self.kernel.length, var_vals or {})
    module = kernel_source_module()
    return module.grid(self.kernel.config, length, self.kernel.batch), (module.BLOCK_THREADS,)
  def __call__(self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]:
    var_vals = var_vals or {}
    global_size, local_size = self.launch_dims(var_vals)
    self.nbytes = sum(b.nbytes for b in bufs)
    return self.program(*[b.handle for b in bufs], global_size=global_size, local_size=local_size,
                        vals=tuple(var_vals[v] for v in self.variables), wait=wait)

def flash_attention(query: LazyBuffer, key: LazyBuffer, value: LazyBuffer, *, is_causal: bool, scale: float,
                    window: Optional[int] = None, has_mask: bool = False, **_: Any) -> Optional[LazyBuffer]:
  """The attention's output [B, Hq, L, D] as the flash kernel's CUSTOM op, or None where it does not apply."""
  if not flash_applies(query, key, value, is_causal=is_causal, window=window, has_mask=has_mask, **_): return None
  sources, layouts = [], []
  for lb in (query, key, value):
    source, layout = strided_source(lb) or contiguous_source(lb)
    sources.append(source)
    layouts.append(layout)
  B, heads, length, dim = query.shape
  kv_heads = key.shape[1]
  config = kernel_source_module().FlashConfig(FLASH_DTYPES[query.dtype], dim, heads // kv_heads, kv_heads,
                                              float(scale), is_causal, window)
  kernel = FlashAttentionKernel(config, tuple(layouts), unbind(length)[0], unbind(key.shape[2])[0], B)  # type: ignore
  out = LazyBuffer.custom(kernel, tuple(sources), query.shape, query.dtype)
  assert prod(out.shape) == prod(query.shape)
  return out

def flash_applies(query: LazyBuffer, key: LazyBuffer, value: LazyBuffer, *, is_causal: bool,
                  window: Optional[int] = None, has_mask: bool = False, enable_gqa: bool = True, **_: Any) -> bool:
  """Whether `flash_attention` gives the kernel for these inputs (a model that builds attention its own way asks
  this before calling scaled_dot_product_attention)."""
  if unsupported(query, key, value, has_mask, window, is_causal) is not None: return False
  return enable_gqa or key.shape[1] in (1, query.shape[1])

def use_flash_lowering(out: LazyBuffer, has_mask: bool) -> None:
  """Make the attention region rooted at out's base compute the flash kernel, where it applies (FLASH_ATTENTION)."""
  region = out.base.region
  if region is None or region.name != "scaled_dot_product_attention" or FLASH_LOWERING not in lowerings_for(region):
    return
  if flash_applies(*region.inputs[:3], has_mask=has_mask, **dict(region.params)):
    apply_lowering(region, FLASH_LOWERING)
