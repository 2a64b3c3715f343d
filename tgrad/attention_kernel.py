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

One query position (a decode step) takes the flash-decoding kernel (runtime/cuda/flash_decoding.py) instead:
`flash_decoding(q, k, v, update=, prologue=)` also has a KV-cache form (as flash_attn_with_kvcache): the new key and
value written into the caches at a slot by the same kernel (an ASSIGN it performs, LazyBuffer.written_by), and q's
and the new key's qk-norm and RoPE done on the rows it reads (`HeadPrologue`). Its CUSTOM node keeps the views it
reads as its sources (LazyBuffer.custom with views), so the key count and the slot are the launch's variables.
"""
from __future__ import annotations
import hashlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence
from tgrad.backend import device_kind, devices_offering
from tgrad.codegen.compile import remembered_dims
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
# flash decoding's q, k, v and caches (its element types), and its norm weights and rotary tables
DECODING_DTYPES = TABLE_DTYPES = {**FLASH_DTYPES, dtypes.float32: "float32"}
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

def layout_sizes(label: str, layout: Layout) -> dict[str, str]:
  """An input's C size expressions as the kernels name them: `label`_offset, then its batch, head and position
  strides."""
  return {f"{label}_offset": c_expression(layout.offset),
          **{f"{label}_{axis}": c_expression(s) for axis, s in zip(("batch", "head", "pos"), layout.strides)}}

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
    for label, layout in zip("qkv", self.layouts): sizes.update(layout_sizes(label, layout))
    return sizes
  def variables(self) -> tuple[str, ...]:
    sizes = (self.length, self.keys, *(s for layout in self.layouts for s in (layout.offset, *layout.strides)))
    return tuple(sorted({v.arg[0] for s in sizes for v in variables_of(s)}))
  def source(self, entry: str, dependent_launch: bool = False, cluster: int = 0,
             value_slots: Optional[tuple[int, ...]] = None) -> str:
    """The CUDA source (`dependent_launch`: the prefill kernel has no PDL form; it keeps full graph dependencies; nor
    a cluster form: `cluster` is not used; nor one reading its variables from device memory: `value_slots`
    neither)."""
    parameters = tuple(VARIABLE_PREFIX + v for v in self.variables())
    return kernel_source_module().flash_attention_source(self.config, entry, self.sizes(), parameters)
  def entry(self) -> str:
    """The kernel's name: what it is specialized to, and a digest of its sizes."""
    c = self.config
    digest = hashlib.sha256(repr(self.sizes()).encode()).hexdigest()[:8]
    mask = "causal" if c.causal else "full"
    if c.window: mask += f"{c.window}"
    return f"flash_attention_{c.dtype}_d{c.head_dim}_g{c.group}_{mask}_{digest}"
  def launch_dims(self, var_vals: dict[str, int], cluster: int = 0) -> tuple[tuple[int, ...], tuple[int, ...]]:
    module = kernel_source_module()
    return module.grid(self.config, evaluate(self.length, var_vals), self.batch), (module.BLOCK_THREADS,)
  def cluster_blocks(self) -> int: return 0   # no cluster form
  def runner(self, device: str) -> FlashAttentionRunner: return FlashAttentionRunner(self, device)
  def stable_repr(self) -> str: return f"FlashAttention({self.config!r},{self.sizes()!r},{self.batch})"

def fitting_cluster(cluster: int, places: Callable[[int], Optional[int]]) -> int:
  """The largest thread block cluster size from `cluster` down, halving, that the device can place: `places(size)` is
  how many clusters of that size it holds at once (None: it can't say, taken as fitting). 0 (no clusters: the
  splits meet in global scratch) where none does. A 16-block cluster needs 16 free SMs in one GPC, which a GPU with
  smaller GPCs, or a slice of one, may not have: its launch would fail."""
  while cluster > 1:
    if (count := places(cluster)) is None or count > 0: return cluster
    cluster //= 2
  return 0

def clusters_placeable(program: Any, cluster: int, kernel: Any) -> Optional[int]:
  """How many `cluster`-block clusters of a loaded attention program the device holds at once (None: unknown)."""
  fits = getattr(program, "clusters_that_fit", None)
  return None if fits is None else fits(cluster, kernel.config.block_threads)

class FlashAttentionRunner:
  """A compiled attention kernel (flash attention on (output, q, k, v) Buffers, flash decoding on its roles' Buffers);
  its variables' values come with each launch: as its last arguments, or (flash decoding, FLASH_DEVICE_VALUES) in
  the device's value table, which `stage` writes before the launch, the table's address its one argument after the
  buffers. A graph runner stages every such launch's `staged_values` before each replay and passes `argument_values`
  in the kernel's node, which then stays the same while the values change (until the launch's grid does)."""
  def __init__(self, kernel: FlashAttentionKernel | FlashDecodingKernel, device: str):
    if device_kind(device) not in FLASH_DEVICES: raise ValueError(f"flash attention does not run on {device}")
    self.kernel, self.entry = kernel, kernel.entry()
    self.name = self.entry
    self.variables = kernel.variables()
    # flash decoding waits for its predecessor itself under PDL (sm_90+): its graph edges can be programmatic
    renderer = Device[device].renderer
    dependent_launch = bool(getattr(renderer, "dependent_launch", False) and Context.PDL)
    # and runs in thread block clusters of the kernel's size where the device has them (0: none), halved until the
    # device can place one (fitting_cluster)
    self.cluster = kernel.cluster_blocks() if getattr(renderer, "thread_block_clusters", False) else 0
    self.value_table = device_values_module().value_table(device, Device[device].allocator) \
      if getattr(kernel, "reads_values_from_device", lambda: False)() else None
    value_slots = None if self.value_table is None else tuple(self.value_table.slot_of(v) for v in self.variables)
    def load(cluster: int) -> Any:
      return Device[device].load_program(self.entry, kernel.source(self.entry, dependent_launch, cluster, value_slots))
    loaded: dict[int, Any] = {}   # the programs compiled while sizes were tried
    def placeable(cluster: int) -> Optional[int]:
      loaded[cluster] = load(cluster)
      return clusters_placeable(loaded[cluster], cluster, kernel)
    self.cluster = fitting_cluster(self.cluster, placeable)
    self.program = loaded[self.cluster] if self.cluster in loaded else load(self.cluster)
    self.flops, self.nbytes = 0, 0
    # variable values → launch dims: a replayed decode step asks once per layer for the same position (a runner
    # serves every layer of its kind), and working them out (the key count, the splits) was most of the host's ~250 µs
    # a step of rebinding variables (an H200 machine's host, cProfile: 18 launch_dims calls a step)
    self._dims_at: dict[tuple, tuple[tuple[int, ...], tuple[int, ...]]] = {}
  def launch_dims(self, var_vals: Optional[dict[str, int]] = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global_size, local_size) at these variable values (remembered for the last LAUNCH_DIMS_MEMO values)."""
    values = var_vals or {}
    return remembered_dims(self._dims_at, tuple(values.get(name) for name in self.variables),
                           lambda: self.kernel.launch_dims(values, self.cluster))
  def argument_values(self, var_vals: dict[str, int]) -> list[int]:
    """The kernel's arguments after its buffers: the variables' values, or the address of the device's value table
    that holds them."""
    if self.value_table is not None: return [self.value_table.address]
    return [int(var_vals[v]) for v in self.variables]
  def staged_values(self, var_vals: dict[str, int]) -> list[tuple[Any, str, int]]:
    """(table, variable, value) of what a launch reads from device memory (none where it takes arguments)."""
    if self.value_table is None: return []
    return [(self.value_table, v, int(var_vals[v])) for v in self.variables]
  def stage(self, var_vals: dict[str, int]) -> None:
    """Before a launch that reads its variables from device memory: queue the writes of their values there."""
    if self.value_table is not None: device_values_module().stage_all(self.staged_values(var_vals))
  def __call__(self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]:
    var_vals = var_vals or {}
    global_size, local_size = self.launch_dims(var_vals)
    self.nbytes = sum(b.nbytes for b in bufs)
    self.stage(var_vals)
    return self.program(*[b.handle for b in bufs], global_size=global_size, local_size=local_size,
                        vals=tuple(self.argument_values(var_vals)), wait=wait)

def flash_attention(query: LazyBuffer, key: LazyBuffer, value: LazyBuffer, *, is_causal: bool, scale: float,
                    window: Optional[int] = None, has_mask: bool = False, **_: Any) -> Optional[LazyBuffer]:
  """The attention's output [B, Hq, L, D] as the flash kernel's CUSTOM op, or None where it does not apply. One query
  position (a decode step's) is the flash-decoding kernel's (keys split over blocks, not over 64-row tiles)."""
  if decoding_applies(query, key, value, is_causal=is_causal, window=window, has_mask=has_mask, **_):
    decoded = flash_decoding(query, key, value, scale=scale)
    if decoded is not None: return decoded[0]
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
  if decoding_applies(query, key, value, is_causal=is_causal, window=window, has_mask=has_mask,
                      enable_gqa=enable_gqa):
    return True
  if unsupported(query, key, value, has_mask, window, is_causal) is not None: return False
  return enable_gqa or key.shape[1] in (1, query.shape[1])

def use_flash_lowering(out: LazyBuffer, has_mask: bool) -> None:
  """Make the attention region rooted at out's base compute the flash kernel, where it applies (FLASH_ATTENTION)."""
  region = out.base.region
  if region is None or region.name != "scaled_dot_product_attention" or FLASH_LOWERING not in lowerings_for(region):
    return
  if flash_applies(*region.inputs[:3], has_mask=has_mask, **dict(region.params)):
    apply_lowering(region, FLASH_LOWERING)

# ---- flash decoding: one query position over a KV cache (runtime/cuda/flash_decoding.py)

def device_values_module() -> ModuleType:
  """runtime/cuda/device_values.py, imported when a flash-decoding runner is made (on a CUDA device)."""
  import tgrad.runtime.cuda.device_values as module
  return module

def decoding_source_module() -> ModuleType:
  """runtime/cuda/flash_decoding.py, imported when a graph on a device offering the kernel asks for it."""
  import tgrad.runtime.cuda.flash_decoding as module
  return module


@dataclass(frozen=True)
class CacheUpdate:
  """The step's new key and value [B, kv heads, 1, D] (views), which the kernel writes into the caches at `slot`
  (flash_attn_with_kvcache's in-place append): the keys and values it attends over hold them at that slot."""
  key: LazyBuffer
  value: LazyBuffer
  slot: sint

@dataclass(frozen=True)
class HeadPrologue:
  """Per-head transforms of q (and of the new key, with a CacheUpdate) done by the kernel on the rows it reads:
  an RMS norm over the head dim (qk-norm: x / sqrt(mean(x²) + eps) · (offset + weight), weights [D]), then RoPE
  (half-split, cos and sin_signed tables [D] of the query's position). Each part is optional."""
  q_weight: Optional[LazyBuffer] = None
  k_weight: Optional[LazyBuffer] = None
  eps: float = 1e-6
  offset: float = 0.0
  cos: Optional[LazyBuffer] = None
  sin_signed: Optional[LazyBuffer] = None
  @property
  def norm(self) -> bool: return self.q_weight is not None
  @property
  def rotary(self) -> bool: return self.cos is not None

@dataclass(frozen=True)
class FlashDecodingKernel(CustomKernel):
  """One flash-decoding launch site: the config, each pointer parameter's role (outputs first, as the step's
  buffers are ordered), the [B, H, N, D] inputs' layouts and the tables' offsets (unbound sizes), the key count, the
  slot of a cache update, the batch."""
  config: Any                                  # runtime/cuda/flash_decoding.py's DecodeConfig
  roles: tuple[str, ...]
  layouts: tuple[tuple[str, Layout], ...]
  table_offsets: tuple[tuple[str, sint], ...]
  keys: sint
  slot: sint
  batch: int
  name: str = "flash_decoding"
  def sizes(self) -> dict[str, str]:
    sizes = {"S": c_expression(self.keys), "SLOT": c_expression(self.slot)}
    for role, layout in self.layouts: sizes.update(layout_sizes(role, layout))
    sizes.update({f"{role}_offset": c_expression(offset) for role, offset in self.table_offsets})
    return sizes
  def variables(self) -> tuple[str, ...]:
    sizes = (self.keys, self.slot, *(s for _, layout in self.layouts for s in (layout.offset, *layout.strides)),
             *(offset for _, offset in self.table_offsets))
    return tuple(sorted({v.arg[0] for s in sizes for v in variables_of(s)}))
  def source(self, entry: str, dependent_launch: bool = False, cluster: int = 0,
             value_slots: Optional[tuple[int, ...]] = None) -> str:
    """The CUDA source: with `dependent_launch`, the PDL form; with `cluster` > 1, splits combined in clusters of that
    many blocks (launch it on launch_dims with the same `cluster`); with `value_slots`, each variable's value read
    from that slot of the device's value table (runtime/cuda/device_values.py), whose address is the last argument."""
    parameters = tuple(VARIABLE_PREFIX + v for v in self.variables())
    return decoding_source_module().flash_decoding_source(self.config, entry, self.sizes(), parameters, self.roles,
                                                          self.batch, dependent_launch, cluster, value_slots)
  def reads_values_from_device(self) -> bool:
    """Whether its runner passes the variables in device memory (FLASH_DEVICE_VALUES, where it has any)."""
    return bool(Context.FLASH_DEVICE_VALUES) and bool(self.variables())
  def entry(self) -> str:
    c = self.config
    digest = hashlib.sha256(repr((self.sizes(), self.roles, c)).encode()).hexdigest()[:8]
    return f"flash_decoding_{c.dtype}_d{c.head_dim}_g{c.group}_{digest}"
  def launch_dims(self, var_vals: dict[str, int], cluster: int = 0) -> tuple[tuple[int, ...], tuple[int, ...]]:
    module = decoding_source_module()
    return module.grid(self.config, evaluate(self.keys, var_vals), self.batch, cluster), (self.config.block_threads,)
  def cluster_blocks(self) -> int:
    """The blocks of a thread block cluster on a device that has them: FLASH_CLUSTER (0: the scratch path only)."""
    return Context.FLASH_CLUSTER
  def runner(self, device: str) -> FlashAttentionRunner: return FlashAttentionRunner(self, device)
  def stable_repr(self) -> str: return f"FlashDecoding({self.config!r},{self.roles},{self.sizes()!r},{self.batch})"

def _strided_layout(lb: LazyBuffer, alignment: int) -> Optional[Layout]:
  """How the kernel reads a [B, H, N, D] view in place from its base (offset and strides multiples of `alignment`
  elements), or None where one strided View can't say it."""
  views = lb.st.views
  if len(views) != 1 or views[0].mask is not None or lb.base.op is Ops.CONST: return None
  view = views[0]
  if view.strides[-1] != 1 and view.shape[-1] != 1: return None
  strides, offset = tuple(unbind(s)[0] for s in view.strides[:3]), unbind(view.offset)[0]
  if not all(divides(alignment, s) for s in (*strides, offset)): return None
  return Layout(offset, strides)   # type: ignore[arg-type]

def _table_offset(lb: LazyBuffer) -> Optional[sint]:
  """The element offset of a [D] view read in place (one contiguous run of its base), else None."""
  views = lb.st.views
  if len(views) != 1 or views[0].mask is not None or lb.base.op is Ops.CONST: return None
  if any(s != 1 for s, n in zip(views[0].strides, views[0].shape) if n != 1): return None
  return unbind(views[0].offset)[0]

def decoding_unsupported(query: LazyBuffer, key: LazyBuffer, value: LazyBuffer, window: Optional[int] = None,
                         softcap: Optional[float] = None, update: Optional[CacheUpdate] = None,
                         prologue: Optional[HeadPrologue] = None) -> Optional[str]:
  """Why the flash-decoding kernel can't compute this attention (None: it can): query [B, Hq, 1, D], key and value
  [B, Hkv, S, D] (S may be symbolic), the optional update and prologue. Every check is on shapes, dtypes, devices."""
  if not Context.FLASH_ATTENTION: return "FLASH_ATTENTION=0"
  if not Context.FLASH_DECODING: return "FLASH_DECODING=0"
  if query.device not in FLASH_DEVICES: return f"device {query.device} has no flash decoding kernel"
  if len(query.shape) != 4 or len(key.shape) != 4 or len(value.shape) != 4:
    return "inputs not 4-D [batch, heads, length, head dim]"
  B, heads, length, dim = query.shape
  if not (isinstance(length, int) and length == 1): return f"query length {length}: the kernel takes one position"
  lbs = [query, key, value] + ([update.key, update.value] if update else [])
  if len({lb.dtype for lb in lbs}) != 1 or query.dtype not in DECODING_DTYPES:
    return f"dtypes {[lb.dtype for lb in lbs]}: the kernel takes one of float16, bfloat16 or float32"
  if len({lb.device for lb in lbs}) != 1: return "inputs on several devices"
  if not all(isinstance(s, int) for s in (B, heads, key.shape[1], dim)): return "a symbolic batch, head count or dim"
  kv_heads = key.shape[1]
  expected = {"key": (B, kv_heads, key.shape[2], dim), "value": (B, kv_heads, key.shape[2], dim)}
  if update: expected.update({"new key": (B, kv_heads, 1, dim), "new value": (B, kv_heads, 1, dim)})
  for (label, shape), lb in zip(expected.items(), lbs[1:]):
    if len(lb.shape) != 4 or not all(sym_eq(a, b) is True for a, b in zip(lb.shape, shape)):
      return f"{label} of shape {lb.shape}, not {shape} (query {query.shape})"
  if heads % kv_heads: return f"{heads} query heads are not a multiple of {kv_heads} kv heads"
  if update and not (key.base.buffer is not None and value.base.buffer is not None):
    return "a cache update writes realized caches in place; these are unrealized"
  tables = [] if prologue is None else [t for t in (prologue.q_weight, prologue.k_weight, prologue.cos,
                                                    prologue.sin_signed) if t is not None]
  if prologue is not None and update is not None and prologue.norm and prologue.k_weight is None:
    return "a qk-norm prologue with a cache update needs the key's weight too"
  if prologue is not None and (prologue.cos is None) != (prologue.sin_signed is None): return "RoPE needs cos and sin"
  for table in tables:
    if table.shape != (dim,) or table.dtype not in TABLE_DTYPES or table.device != query.device:
      return f"a prologue table of shape {table.shape} {table.dtype}: the kernel takes [{dim}] float16, bfloat16 or " \
             "float32"
  norms = [t for t in (prologue.q_weight, prologue.k_weight) if t is not None] if prologue is not None else []
  rotary = [t for t in (prologue.cos, prologue.sin_signed) if t is not None] if prologue is not None else []
  if len({t.dtype for t in norms}) > 1 or len({t.dtype for t in rotary}) > 1:
    return "norm weights (or cos and sin) of several dtypes"
  try: _decode_config(query, key, window, softcap, update, prologue)
  except ValueError as error: return str(error)
  return None

def _decode_config(query: LazyBuffer, key: LazyBuffer, window: Optional[int], softcap: Optional[float],
                   update: Optional[CacheUpdate], prologue: Optional[HeadPrologue], scale: float = 1.0) -> Any:
  _, heads, _, dim = query.shape
  weight = prologue.q_weight if prologue is not None else None
  cos = prologue.cos if prologue is not None else None
  weight_dtype = TABLE_DTYPES[weight.dtype] if weight is not None else TABLE_DTYPES[cos.dtype] if cos is not None \
    else "float16"
  rotary_dtype = TABLE_DTYPES[cos.dtype] if cos is not None else ""
  norm, rotary = prologue is not None and prologue.norm, prologue is not None and prologue.rotary
  return decoding_source_module().DecodeConfig(
    DECODING_DTYPES[query.dtype], dim, heads // key.shape[1], key.shape[1], float(scale), window, softcap, norm,
    prologue.eps if norm else 1e-6, prologue.offset if norm else 0.0, rotary, update is not None, weight_dtype,
    rotary_dtype)

_scratches: dict[tuple[str, int], LazyBuffer] = {}

def _scratch(device: str, words: int) -> LazyBuffer:
  """The float32 scratch of the flash-decoding kernels on `device` (their partials and counters). Its counters must
  be zero at a kernel's launch, and every kernel leaves them at zero (its last block resets what it counted), so the
  kernels of every graph on the device share one scratch, one after another: the first graph that uses it zero-fills
  it with one kernel of its own, and the graphs built after that fill ran read the realized buffer, with no fill (a
  decode step's fill kernel was 1.4 µs of an H200's 0.37 ms step, replayed every step: TinyJit captures a model's
  second call, after the first filled it). The partials need no zeros: a kernel writes each before it reads it."""
  scratch = _scratches.get((device, words))
  # a scratch scheduled but never run (a TinyJit capture records its fill without running it; so does a schedule
  # that is only traced) may hold anything: a graph built then gets a scratch of its own
  if scratch is None or (scratch.base.buffer is not None and scratch.base.buffer.version == 0):
    scratch = _scratches[(device, words)] = LazyBuffer.const_of(0.0, dtypes.float32, device, (words,)).contiguous()
  return scratch

def flash_decoding(query: LazyBuffer, key: LazyBuffer, value: LazyBuffer, *, scale: float,
                   window: Optional[int] = None, softcap: Optional[float] = None,
                   update: Optional[CacheUpdate] = None, prologue: Optional[HeadPrologue] = None
                   ) -> Optional[tuple[LazyBuffer, tuple[LazyBuffer, ...]]]:
  """The attention of query [B, Hq, 1, D] over key and value [B, Hkv, S, D] (the last `window` keys only; S may be
  symbolic) as one flash-decoding CUSTOM op: (its output [B, Hq, 1, D], the caches after the update: for each base
  that key and value view, an ASSIGN the same kernel performs, a second output of its step). None where the kernel
  does not apply (`decoding_unsupported`). Inputs are read in place through their views (made contiguous where one
  strided View can't say them); the CUSTOM node keeps those views as its sources, so their symbolic sizes (the key
  count, the slot) are the launch's variables."""
  if decoding_unsupported(query, key, value, window, softcap, update, prologue) is not None: return None
  module = decoding_source_module()
  config = _decode_config(query, key, window, softcap, update, prologue, scale)
  cache_alignment = config.vector_elements if config.vector_loads else 1   # 16-byte loads of cache rows
  named = {"q": query, "k_cache": key, "v_cache": value}
  if update is not None: named.update({"k_new": update.key, "v_new": update.value})
  if prologue is not None:
    named.update({role: t for role, t in (("q_weight", prologue.q_weight), ("k_weight", prologue.k_weight),
                                          ("cos", prologue.cos), ("sin", prologue.sin_signed))
                  if t is not None and role in config.roles()})
  sources, layouts, offsets = [], [], []
  for role, lb in named.items():
    if role in module.TABLE_ROLES:
      if (offset := _table_offset(lb)) is None: lb, offset = lb.contiguous(), 0
      offsets.append((role, offset))
    else:
      if (layout := _strided_layout(lb, cache_alignment if role in ("k_cache", "v_cache") else 1)) is None:
        if update is not None and role in ("k_cache", "v_cache"): return None   # a copy can't be written in place
        lb, layout = contiguous_source(lb)
      layouts.append((role, layout))
    sources.append(lb)
  written: list[LazyBuffer] = []
  slot: sint = 0
  if update is not None:
    slot = unbind(update.slot)[0] if isinstance(update.slot, UOp) else update.slot
    # a source the kernel does not read, whose view names the slot: the launch's variables include the slot's
    flat = key.base.reshape((key.base.size,))
    sources.append(flat.shrink(((update.slot, update.slot + 1),)))
    written = list({id(lb.base): lb.base for lb in (key, value)}.values())
  B = query.shape[0]
  sources.append(_scratch(query.device, module.scratch_words(config, B)))
  roles = ("out", *(f"written{i}" for i in range(len(written))), *named, "slot_row" if update else None, "scratch")
  kernel = FlashDecodingKernel(config, tuple(r for r in roles if r is not None), tuple(layouts), tuple(offsets),
                               unbind(key.shape[2])[0], slot, B)
  out = LazyBuffer.custom(kernel, tuple(sources), query.shape, query.dtype, views=True)
  return out, tuple(base.written_by(out) for base in written)

def decoding_applies(query: LazyBuffer, key: LazyBuffer, value: LazyBuffer, is_causal: bool = False,
                     window: Optional[int] = None, has_mask: bool = False, enable_gqa: bool = True, **_: Any) -> bool:
  """Whether scaled_dot_product_attention's flash lowering gives the decoding kernel: one query position, no mask
  (a causal mask over one query keeps only the first key, as torch's top-left alignment does: not taken)."""
  if has_mask or is_causal or window is not None: return False
  if not enable_gqa and key.shape[1] not in (1, query.shape[1]): return False
  return decoding_unsupported(query, key, value) is None
