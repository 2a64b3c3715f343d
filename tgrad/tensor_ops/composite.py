"""The composite ops' lowerings as Tensor-level decompositions, registered with tgrad/regions.py (docs/architecture.md).

Each composite (exp, log, tanh, sigmoid, gelu, softmax, log_softmax, logsumexp, rms_norm, layer_norm, attention,
matmul) has a "default" lowering — tgrad's decomposition, which a Tensor method builds through `regions.composite`
with autograd — and alternatives that `regions.apply_lowering` can put in its region's place:

    x = Tensor.randn(4, 8); y = x.tanh()              # default: 2·sigmoid(2x) − 1, one kernel, region "tanh"
    [region] = regions_above(y.lazydata)
    lowerings_for(region)                               # ["default", "native", "via_exp"] on LLVM (+ "fast" on CUDA)
    apply_lowering(region, "native")                    # y's base is now a TANH op: tanhf / CUDA's tanhf

Lowerings of exp and log are an arg of the EXP2/LOG2 op (None: the renderer's default: polynomials on LLVM, exp2f on
CUDA; "poly", "libm", "fast"), carried into the kernel; codegen/transcendental.py and the renderers honour it.
Regions nest: an alternative (or a default) that calls another composite records that one's region too, and
`regions.regions_above` finds it under the current lowerings.

Every float composite also has two device alternatives (`_with_device_alternatives`): "on_LLVM" (the default on the
CPU device, with copies there and back; for regions elsewhere) and "numpy" (tensor_ops/numpy_backend.py as a CUSTOM op
on the host). `Lowering.part` says where such a lowering's work runs; neither is ever the float64 reference.

matmul's "tf32" lowering states its numbers in the graph, whatever runs it: both inputs rounded to TF32
(`round_to_tf32`), then the default's float32 sum of products. The codegen recognizes TF32-rounded loads and puts
such a reduce on TF32 tensor cores (codegen/tensor_cores.py); the same graph gives the same numbers (up to the order
of the sum) on FMA, so it is checked on the CPU. It is offered on CUDA only (on the CPU it is the default made
slower and less exact), for float32 inputs; the default float32 matmul never runs on a TF32 core.

softmax, log_softmax and logsumexp have an "online" lowering: log Σ exp by the LOGADDEXP reduce, one pass over x whose
running max and rescaled sum live in two float32 accumulators of the kernel (codegen/reduces.py), its result log Σ exp
in float64, then exp(x − lse) or x − lse with x − lse in float64 (rounded once); REDUCE_AXIS still holds one value,
log Σ exp, so a GROUP or a split reduce combines results with the same reduce.
"""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, Any, Callable, Optional
from tgrad.attention_kernel import DECODING_DTYPES, FLASH_DEVICES, FLASH_LOWERING, flash_attention
from tgrad.custom import NUMPY, HostFunction
from tgrad.backend import HOST_DEVICE, DevicesOtherThan, devices_offering
from tgrad.dtype import TF32_KEEP_MASK, TF32_ROUNDING_BIAS, dtypes, promote_types, to_dtype
from tgrad.lazy import LazyBuffer
from tgrad.regions import DEFAULT, LOWERINGS, Lowering, register
from tgrad.tensor_ops.args import broadcast_shape
from tgrad.tensor_ops.numpy_backend import FUNCTIONS as NUMPY_FUNCTIONS
import tgrad.function as F
if TYPE_CHECKING: from tgrad.tensor import Tensor   # at runtime: bound by tgrad/tensor.py (see __init__.py)

LOG2_E = 1 / math.log(2)
LN2 = math.log(2)
GELU_CUBIC_COEFFICIENT = 0.044715       # the tanh approximation of GELU (Hendrycks & Gimpel)
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
SQRT_HALF = math.sqrt(0.5)
FAST_DEVICES, TF32_DEVICES = devices_offering("fast"), devices_offering("tf32")   # their renderers have them
FLOAT32_AND_NARROWER = frozenset({dtypes.float32, dtypes.float16, dtypes.bfloat16})   # what fast instructions take

# ---------------------------------------------------------------------------------------------------------------
# the builds: each takes the composite's input Tensors and its params

# exp and log scale by their fixed constants as literals (const_like), not as Python scalars: a weak scalar becomes a
# kernel parameter (tgrad/scalars.py), whose value every eager call would convert and pass, and that kernels can't fold
def _exp(x: Tensor, lowering: Optional[str] = None) -> Tensor:
  if lowering is None: return x._float_math(lambda v: F.Exp2.apply(v * v.const_like(LOG2_E)))
  return x._float_math(lambda v: F.Exp2.apply(v * v.const_like(LOG2_E), lowering=lowering))

def _log(x: Tensor, lowering: Optional[str] = None) -> Tensor:
  if lowering is None: return x._float_math(lambda v: (lambda y: y * y.const_like(LN2))(F.Log2.apply(v)))
  return x._float_math(lambda v: (lambda y: y * y.const_like(LN2))(F.Log2.apply(v, lowering=lowering)))

def _tanh_via_sigmoid(x: Tensor) -> Tensor: return x._float_math(lambda v: 2.0 * F.Sigmoid.apply(2.0 * v) - 1.0)
def _tanh_via_exp(x: Tensor) -> Tensor:
  """sign(x)·(1 − e^(−2|x|)) / (1 + e^(−2|x|)): the exponential lies in (0, 1], so nothing overflows."""
  def fn(v: Tensor) -> Tensor:
    decay = (v.abs() * -2.0).exp()
    magnitude = (1.0 - decay) / (1.0 + decay)
    return (v < 0).where(-magnitude, magnitude)
  return x._float_math(fn)
def _tanh_op(x: Tensor, lowering: Optional[str] = None) -> Tensor:
  return x._float_math(lambda v: F.Tanh.apply(v, lowering=lowering))

def _sigmoid(x: Tensor) -> Tensor: return x._float_math(F.Sigmoid.apply)
def _sigmoid_via_tanh(x: Tensor) -> Tensor: return x._float_math(lambda v: 0.5 * (v * 0.5).tanh() + 0.5)

def _gelu_erf(x: Tensor, approximate: str = "none") -> Tensor:
  return x._float_math(lambda v: 0.5 * v * (1 + (v * SQRT_HALF).erf()))
def _gelu_tanh(x: Tensor, approximate: str = "tanh") -> Tensor:
  def tanh_form(v: Tensor) -> Tensor:
    return 0.5 * v * (1 + (SQRT_2_OVER_PI * (v + GELU_CUBIC_COEFFICIENT * v * v * v)).tanh())
  return x._float_math(tanh_form)
def _gelu(x: Tensor, approximate: str) -> Tensor:
  return _gelu_erf(x) if approximate == "none" else _gelu_tanh(x)

# softmax and friends compute float16/bfloat16 in float32 (_float_math): their sum of exponentials reaches the axis
# length, and over 65504 elements a float16 sum is inf (softmax would be all zeros)
def _softmax(x: Tensor, axis: int) -> Tensor:
  def stable(v: Tensor) -> Tensor:
    exponentials = (v - v.max(axis, keepdim=True).detach()).exp()
    return exponentials * exponentials.sum(axis, keepdim=True).reciprocal()
  return x._float_math(stable)
def _softmax_three_kernels(x: Tensor, axis: int) -> Tensor:
  """The row max, the sum of exponentials and the division as three kernels (each of the first two realized)."""
  def stable(v: Tensor) -> Tensor:
    shifted = v - v.max(axis, keepdim=True).detach().contiguous()
    return shifted.exp() / shifted.exp().sum(axis, keepdim=True).contiguous()
  return x._float_math(stable)
def _log_softmax(x: Tensor, axis: int) -> Tensor:
  def stable(v: Tensor) -> Tensor:
    shifted = v - v.max(axis, keepdim=True).detach()
    return shifted - shifted.exp().sum(axis, keepdim=True).log()
  return x._float_math(stable)
def _log_softmax_three_kernels(x: Tensor, axis: int) -> Tensor:
  def stable(v: Tensor) -> Tensor:
    shifted = v - v.max(axis, keepdim=True).detach().contiguous()
    return shifted - shifted.exp().sum(axis, keepdim=True).contiguous().log()
  return x._float_math(stable)

# The online lowerings' log Σ exp is a float64 value (its state, the running max and rescaled sum, stays in the input's
# dtype: float32, also for half inputs): rounded to float32 it would put half an ulp of itself into x − lse (5e-4
# relative on rows around 1e4); x − lse in float64, rounded once, is as exact as the default's x − max
ONLINE_RESULT_DTYPE = dtypes.float64

def _log_sum_exp(v: Tensor, axis: Any) -> Tensor:
  """log Σ exp over `axis` (kept as size 1) in one pass, in ONLINE_RESULT_DTYPE: the LOGADDEXP reduce (the online
  softmax's state). Over axes of size 1 it is the value itself: no reduce, so the consumer is no reduce kernel."""
  axes = tuple(a for a in v._reduce_axes(axis) if v.shape[a] != 1)
  if not axes: return v.cast(ONLINE_RESULT_DTYPE)
  return F.LogSumExp.apply(v, axes=axes, dtype=ONLINE_RESULT_DTYPE)
def _online_shifted(v: Tensor, axis: int) -> Tensor:
  """x − log Σ exp x, computed in float64 and rounded to x's dtype once; NaN on a row holding +inf (or only −inf), as
  torch's and the default's (x − max is inf − inf there). lse + (lse − lse) is per row: a row kernel computes it once,
  before its store pass."""
  lse = _log_sum_exp(v, axis)
  return (v.cast(lse.dtype) - (lse + (lse - lse))).cast(v.dtype)
def _softmax_online(x: Tensor, axis: int) -> Tensor:
  """exp(x − log Σ exp x): one pass over the row for log Σ exp (running max and rescaled sum), one for the output."""
  return x._float_math(lambda v: _online_shifted(v, axis).exp())
def _log_softmax_online(x: Tensor, axis: int) -> Tensor:
  return x._float_math(lambda v: _online_shifted(v, axis))

def _logsumexp(x: Tensor, axis: Any, keepdim: bool) -> Tensor:
  """log Σ exp(x − max) + max, the max (detached) 0 where it is ±inf: an all −inf (or +inf) row gives −inf (+inf)."""
  def stable(v: Tensor) -> Tensor:
    peak = v.max(axis, keepdim=True).detach()
    peak = peak.isinf().where(0, peak)
    return (v - peak).exp().sum(axis, keepdim=True).log() + peak
  out = x._float_math(stable)
  return out if keepdim else out.reshape(x._reduced_shape(x._reduce_axes(axis), keepdim=False))
def _logsumexp_online(x: Tensor, axis: Any, keepdim: bool) -> Tensor:
  out = x._float_math(lambda v: _log_sum_exp(v, axis).cast(v.dtype))
  return out if keepdim else out.reshape(x._reduced_shape(x._reduce_axes(axis), keepdim=False))

def _rms_norm(x: Tensor, axis: Any, eps: float) -> Tensor:
  v = x._to_float()
  return v * (v.square().mean(axis, keepdim=True) + eps).rsqrt()
def _rms_norm_recip_sqrt(x: Tensor, axis: Any, eps: float) -> Tensor:
  v = x._to_float()
  return v / (v.square().mean(axis, keepdim=True) + eps).sqrt()
def _layer_norm(x: Tensor, axis: Any, eps: float) -> Tensor:
  v = x._to_float()
  centered = v - v.mean(axis, keepdim=True)
  return centered * (centered.square().mean(axis, keepdim=True) + eps).rsqrt()
def _layer_norm_recip_sqrt(x: Tensor, axis: Any, eps: float) -> Tensor:
  v = x._to_float()
  centered = v - v.mean(axis, keepdim=True)
  return centered / (centered.square().mean(axis, keepdim=True) + eps).sqrt()

def attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None, *, is_causal: bool,
              scale: float, enable_gqa: bool, dropout_p: float = 0.0, unfused: bool = False,
              window: Optional[int] = None) -> Tensor:
  """softmax(q·kᵀ·scale + mask)·v, the arguments already checked (Tensor.scaled_dot_product_attention); `unfused`
  realizes the scores before the softmax; `window` (with is_causal) keeps only the keys l - window < s <= l."""
  if enable_gqa and min(query.ndim, key.ndim, value.ndim) >= 3 and key.shape[-3] != query.shape[-3]:
    repeats = query.shape[-3] // key.shape[-3]
    key, value = key.repeat_interleave(repeats, -3), value.repeat_interleave(repeats, -3)
  scores = (query @ key.transpose(-2, -1)) * scale
  if is_causal and window is None:
    attn_mask = Tensor.ones(scores.shape[-2:], dtype=dtypes.bool, device=query.device).tril()
  elif is_causal:
    rows, cols = scores.shape[-2:]
    distance = Tensor.arange(rows, device=query.device).reshape(rows, 1) - \
      Tensor.arange(cols, device=query.device).reshape(1, cols)
    attn_mask = (distance >= 0) & (distance < window)
  if attn_mask is not None:
    scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype.is_bool else scores + attn_mask
  if unfused: scores = scores.contiguous()
  return scores.softmax(-1).dropout(dropout_p) @ value
def _attention_unfused(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                       **params) -> Tensor:
  return attention(query, key, value, attn_mask, unfused=True, **params)

def _attention_flash(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                     **params) -> Tensor:
  """One flash-attention kernel (tgrad/attention_kernel.py) where it applies, else the default."""
  out = flash_attention(query.lazydata, key.lazydata, value.lazydata, has_mask=attn_mask is not None, **params)
  if out is None: return attention(query, key, value, attn_mask, **params)
  return Tensor(out, requires_grad=False)

def _matmul(x: Tensor, w: Tensor, acc_dtype: Optional[str] = None) -> Tensor:
  """numpy's matmul as a broadcast multiply and a sum over k (Tensor.dot checks the shapes first); `acc_dtype` (a
  dtype name) is the sum's accumulator, None for sum's own choice (float32 for float16/bfloat16)."""
  x2, y2 = x.reshape(1, -1) if x.ndim == 1 else x, w.reshape(-1, 1) if w.ndim == 1 else w
  batch = broadcast_shape(x2.shape[:-2], y2.shape[:-2])
  dtype = promote_types(x2.dtype, y2.dtype)
  n, k, m = x2.shape[-2], x2.shape[-1], y2.shape[-1]
  x2 = x2.cast(dtype)._broadcast_to(batch + (n, k)).reshape(batch + (n, 1, k))
  y2 = y2.cast(dtype)._broadcast_to(batch + (k, m)).transpose(-1, -2).reshape(batch + (1, m, k))
  out = (x2 * y2).sum(-1, acc_dtype=None if acc_dtype is None else to_dtype(acc_dtype)).cast(dtype)
  if x.ndim == 1: out = out.squeeze(-2)
  if w.ndim == 1: out = out.squeeze(-1)
  return out
def _matmul_acc(acc_dtype: str) -> Callable[..., Tensor]:
  return lambda x, w, **_: _matmul(x, w, acc_dtype)   # the composite's own acc_dtype param is overridden

def round_to_tf32(x: Tensor) -> Tensor:
  """float32 x rounded to TF32 (10 mantissa bits; to nearest, ties away from zero, as PTX cvt.rna.tf32.f32; NaN
  kept; see dtype.TF32_*), still as float32: from its bits, where(x != x, x, bits(bits(x) + bias & mask)). Not
  differentiable. codegen/tensor_cores.tf32_rounded_load recognizes exactly this graph over a load."""
  if x.dtype != dtypes.float32: raise TypeError(f"round_to_tf32 takes float32, not {x.dtype}")
  bits = x.bitcast(dtypes.uint32)
  # literal constants (const_like, not Python scalars, which kernels take as parameters): the pattern matches values
  rounded = ((bits + bits.const_like(TF32_ROUNDING_BIAS)) & bits.const_like(TF32_KEEP_MASK)).bitcast(dtypes.float32)
  return (x != x).where(x, rounded)

def _matmul_tf32(x: Tensor, w: Tensor, **_) -> Tensor:
  """Σ_k x'·w' in float32 with x', w' = x, w rounded to TF32. A product of two TF32 values is exact in float32 (11
  by 11 significant bits; unless it overflows or underflows), so this is what a TF32 tensor core computes, up to the
  order of the sum: on CUDA sm_80+ the GPU heuristics (and BEAM) put the reduce on mma m16n8k8 .tf32
  (codegen/tensor_cores.py); elsewhere the same numbers come from FMA."""
  return _matmul(round_to_tf32(x.cast(dtypes.float32)), round_to_tf32(w.cast(dtypes.float32)))   # (a float32 result)

# ---------------------------------------------------------------------------------------------------------------
# the registry

def _registry(*lowerings: Lowering) -> dict[str, Lowering]:
  assert lowerings[0].name == DEFAULT, "the default lowering comes first"
  return {lowering.name: lowering for lowering in lowerings}

def _transcendental(name: str, build: Callable[..., Tensor], what: str) -> dict[str, Lowering]:
  return _registry(
    Lowering(DEFAULT, f"{what}: the renderer's choice (polynomials on LLVM, the math library on CUDA)",
             lambda x: build(x), 2),
    Lowering("poly", f"{what}: tgrad's range reduction + polynomial on every device (vectorizes on CPUs)",
             lambda x: build(x, "poly"), 1),
    Lowering("libm", f"{what}: the device's math library (LLVM intrinsic, CUDA {name}2f)", lambda x: build(x, "libm"),
             3),
    Lowering("fast", f"{what}: the hardware approximation (PTX {'ex2' if name == 'exp' else 'lg2'}.approx.f32)",
             lambda x: build(x, "fast"), 0, FAST_DEVICES, FLOAT32_AND_NARROWER))

# Device alternatives, added to every composite: "on_LLVM" runs the default lowering on the CPU device (inputs copied
# there, the result copied back: the copies are launches of the path, so a measurement includes them), for regions
# on any other device; "numpy" runs the NUMPY backend (tensor_ops/numpy_backend.py) as a CUSTOM op on any device.
# Neither is ever the float64 reference (exactness below every kernel lowering).
ON_LLVM, NUMPY_LOWERING, LLVM = "on_LLVM", "numpy", HOST_DEVICE
NOT_LLVM = DevicesOtherThan(LLVM)
DEVICE_ALTERNATIVE_EXACTNESS = -1

def _on_llvm(name: str) -> Callable[..., Tensor]:
  def build(*inputs: Tensor, **params) -> Tensor:
    home = inputs[0].device
    return LOWERINGS[name][DEFAULT].build(*[x.to(LLVM) for x in inputs], **params).to(home)
  return build

def _numpy(name: str) -> Callable[..., Tensor]:
  def build(*inputs: Tensor, **params) -> Tensor:
    shaped = LOWERINGS[name][DEFAULT].build(*inputs, **params)   # for its shape and dtype only: nothing runs
    kernel = HostFunction(name, NUMPY_FUNCTIONS[name], tuple(x.shape for x in inputs), shaped.shape,
                          tuple(sorted(params.items())))
    return Tensor(LazyBuffer.custom(kernel, tuple(x.lazydata for x in inputs), shaped.shape, shaped.dtype),
                  requires_grad=False)
  return build

def _with_device_alternatives(name: str, registry: dict[str, Lowering]) -> dict[str, Lowering]:
  return {**registry,
          ON_LLVM: Lowering(ON_LLVM, "the default lowering on the LLVM device: inputs copied there, the result back",
                            _on_llvm(name), DEVICE_ALTERNATIVE_EXACTNESS, NOT_LLVM, part=LLVM),
          NUMPY_LOWERING: Lowering(NUMPY_LOWERING, "numpy on the host in float64 (the NUMPY backend): inputs copied "
                                   "out, the result rounded and copied in", _numpy(name),
                                   DEVICE_ALTERNATIVE_EXACTNESS, part=NUMPY)}

_DECOMPOSITIONS: dict[str, dict[str, Lowering]] = {
  "exp": _transcendental("exp", _exp, "exp2(x·log2 e)"),
  "log": _transcendental("log", _log, "log2(x)·ln 2"),
  "tanh": _registry(
    Lowering(DEFAULT, "2·sigmoid(2x) − 1", _tanh_via_sigmoid, 1),
    Lowering("via_exp", "sign(x)·(1 − e^(−2|x|)) / (1 + e^(−2|x|))", _tanh_via_exp, 2),
    Lowering("native", "the TANH op: the C library's tanhf on LLVM, CUDA tanhf", _tanh_op, 3),
    Lowering("fast", "the TANH op as PTX tanh.approx.f32 (sm_75+; tanhf below)",
             lambda x: _tanh_op(x, "fast"), 0, FAST_DEVICES, FLOAT32_AND_NARROWER)),
  "sigmoid": _registry(
    Lowering(DEFAULT, "1 / (1 + e^−x) (the Sigmoid Function)", _sigmoid, 2),
    Lowering("via_tanh", "0.5·tanh(x/2) + 0.5", _sigmoid_via_tanh, 1)),
  "gelu": _registry(
    Lowering(DEFAULT, "as `approximate` says: the tanh approximation ('tanh'), or the erf form ('none')", _gelu, 1),
    Lowering("erf", "x·Φ(x) exactly: 0.5·x·(1 + erf(x/√2))", _gelu_erf, 2),
    Lowering("tanh", "the tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))", _gelu_tanh, 0)),
  "softmax": _registry(
    Lowering(DEFAULT, "exp(x − max) / Σ exp(x − max), one row kernel where the rows fit", _softmax, 1),
    Lowering("three_kernels", "max, Σ exp and the division as three kernels", _softmax_three_kernels, 0),
    Lowering("online", "exp(x − log Σ exp x), log Σ exp in one pass (running max and rescaled sum), one row kernel "
             "where the rows fit", _softmax_online, 0)),
  "log_softmax": _registry(
    Lowering(DEFAULT, "(x − max) − log Σ exp(x − max), one row kernel where the rows fit", _log_softmax, 1),
    Lowering("three_kernels", "max, Σ exp and the subtraction as three kernels", _log_softmax_three_kernels, 0),
    Lowering("online", "x − log Σ exp x, log Σ exp in one pass (running max and rescaled sum), one row kernel where "
             "the rows fit", _log_softmax_online, 0)),
  "logsumexp": _registry(
    Lowering(DEFAULT, "log Σ exp(x − max) + max: the max, then the sum, one row kernel where the rows fit", _logsumexp,
             1),
    Lowering("online", "log Σ exp in one pass (running max and rescaled sum: the LOGADDEXP reduce)", _logsumexp_online,
             0)),
  "rms_norm": _registry(
    Lowering(DEFAULT, "x · rsqrt(mean(x²) + eps): one reciprocal square root per row", _rms_norm, 1),
    Lowering("recip_sqrt", "x / sqrt(mean(x²) + eps): a division per element", _rms_norm_recip_sqrt, 2)),
  "layer_norm": _registry(
    Lowering(DEFAULT, "(x − mean) · rsqrt(var + eps): one reciprocal square root per row", _layer_norm, 1),
    Lowering("recip_sqrt", "(x − mean) / sqrt(var + eps): a division per element", _layer_norm_recip_sqrt, 2)),
  "scaled_dot_product_attention": _registry(
    Lowering(DEFAULT, "softmax(q·kᵀ·scale + mask)·v, the scores fused into the softmax's kernel", attention, 1),
    Lowering("unfused_softmax", "the scores realized before the softmax", _attention_unfused, 0),
    Lowering(FLASH_LOWERING, "one flash-attention kernel: scores, online softmax and the weighted sum of values in "
             "registers, the score matrix never stored (CUDA, float16/bfloat16; causal and sliding-window masks; one "
             "query position: the flash-decoding kernel, float32 too)", _attention_flash, 0, FLASH_DEVICES,
             frozenset(DECODING_DTYPES))),
  "matmul": _registry(
    Lowering(DEFAULT, "Σ_k x·w in sum's accumulator (float32 for float16/bfloat16, else the dtype)", _matmul, 1),
    Lowering("acc_float32", "Σ_k x·w accumulated in float32", _matmul_acc("float32"), 2, None,
             frozenset({dtypes.float16, dtypes.bfloat16})),
    Lowering("acc_float16", "Σ_k x·w accumulated in float16", _matmul_acc("float16"), 0, None,
             frozenset({dtypes.float16})),
    Lowering("tf32", "Σ_k x·w with x, w rounded to TF32 (10-bit mantissa), on TF32 tensor cores (CUDA sm_80+; "
             "the same products on FMA below)", _matmul_tf32, 0, TF32_DEVICES, frozenset({dtypes.float32}))),
}

# Composites whose alternatives compute a different function from the one asked for (gelu's erf form and its tanh
# approximation differ by up to ~1e-3): their float64 reference is the function the region asks for, its default.
REFERENCE_IS_AS_ASKED = frozenset({"gelu"})

def _register_decompositions() -> None:
  for name, lowerings in _DECOMPOSITIONS.items():
    reference = DEFAULT if name in REFERENCE_IS_AS_ASKED else None
    register(name, _with_device_alternatives(name, lowerings), reference=reference)

_register_decompositions()
