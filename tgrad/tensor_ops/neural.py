"""Neural-network functions on tensors: linear, convolution (conv2d/conv_transpose2d, any number of spatial dims),
pooling (max/avg/adaptive, a window view with no copy), interpolate, dropout, layernorm/rmsnorm/batchnorm, scaled dot
product attention, and the losses (cross_entropy, nll_loss, binary cross entropy). The layers that hold parameters
are in tgrad/nn/.
"""
from __future__ import annotations
import functools, math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence
import numpy as np
from tgrad.dtype import dtypes
from tgrad.helpers import prod
from tgrad.bounds import IndexBounds, check_index_bounds
from tgrad.tensor_ops.args import Scalar
from tgrad.regions import composite
from tgrad.tensor_ops.composite import attention
from tgrad.attention_kernel import use_flash_lowering
if TYPE_CHECKING: from tgrad.tensor import Tensor   # at runtime: bound by tgrad/tensor.py (see __init__.py)

LOSS_REDUCTIONS = ("none", "mean", "sum")
BCE_LOG_FLOOR = -100.0    # torch's BCELoss clamps log(p) and log(1 − p) here, so p = 0 or 1 gives a finite loss
TORCH_IGNORE_INDEX = -100  # torch's default ignore_index for cross_entropy
INTERPOLATE_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear")

class NNMixin:
  """Tensor's neural-network functions and losses."""
  # ---- layers
  def linear(self, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """tinygrad's linear: x·weight (weight is (in, out)), plus bias."""
    out = self * weight if weight.ndim == 1 else self.dot(weight)
    return out + bias if bias is not None else out
  def sequential(self, layers: Sequence) -> Tensor:
    """Apply callables in order: `x.sequential([layer1, Tensor.relu, layer2])`."""
    return functools.reduce(lambda x, layer: layer(x), layers, self)

  # ---- sliding windows: convolution and pooling
  def _pool(self, kernel_size: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
    """Sliding windows over the last len(kernel_size) dims, as a view: (..., *in) → (..., *out, *kernel), where
    window o holds x[o·stride + k·dilation] at kernel position k. Nothing is copied; movement ops only.
    Windows that don't overlap (kernel <= stride, no dilation) are a reshape into (out, stride) blocks. Otherwise,
    per dim of size i: repeat x (expand), flatten, and re-cut into rows of length r ≡ dilation (mod i), so row k
    starts k·dilation further into x; keep every stride-th column of the first out·stride."""
    count = len(kernel_size)
    lead, spatial = self.shape[:-count], self.shape[-count:]
    out = tuple((i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(spatial, kernel_size, stride, dilation))
    keep_lead = tuple((0, n) for n in lead)
    def interleave(*groups) -> tuple: return lead + tuple(v for group in zip(*groups) for v in group)
    if all(k <= s and d == 1 for k, s, d in zip(kernel_size, stride, dilation)):
      fitted = self.pad(((0, 0),) * len(lead) + tuple((0, o * s - i) for i, o, s in zip(spatial, out, stride)))
      blocks = fitted.reshape(interleave(out, stride))
      windows = blocks.shrink(keep_lead + tuple(b for o, k in zip(out, kernel_size) for b in ((0, o), (0, k))))
      return windows.permute(tuple(range(len(lead))) + tuple(len(lead) + 2 * j for j in range(count)) +
                             tuple(len(lead) + 2 * j + 1 for j in range(count)))
    rows = tuple(d + i * max(1, math.ceil((o * s - d) / i)) for i, o, s, d in zip(spatial, out, stride, dilation))
    repeats = tuple(math.ceil(k * r / i) for k, r, i in zip(kernel_size, rows, spatial))
    x = self.reshape(interleave((1,) * count, spatial)).expand(interleave(repeats, spatial))
    x = x.reshape(lead + tuple(e * i for e, i in zip(repeats, spatial)))
    x = x.shrink(keep_lead + tuple((0, k * r) for k, r in zip(kernel_size, rows)))
    x = x.reshape(interleave(kernel_size, rows))
    x = x.shrink(keep_lead + tuple(b for k, o, s in zip(kernel_size, out, stride) for b in ((0, k), (0, o * s))))
    x = x.reshape(lead + tuple(v for k, o, s in zip(kernel_size, out, stride) for v in (k, o, s)))
    x = x.shrink(keep_lead + tuple(b for k, o in zip(kernel_size, out) for b in ((0, k), (0, o), (0, 1))))
    x = x.reshape(interleave(kernel_size, out))
    return x.permute(tuple(range(len(lead))) + tuple(len(lead) + 2 * j + 1 for j in range(count)) +
                     tuple(len(lead) + 2 * j for j in range(count)))

  def _conv_dims(self, weight: Tensor, bias: Optional[Tensor]) -> int:
    """The number of spatial dims of a convolution with this weight, after the checks conv2d and conv_transpose2d
    share: a weight of at least 3 dims, and one dtype for input, weight and bias (torch does not promote here)."""
    if weight.ndim < 3: raise RuntimeError(f"conv weight must have at least 3 dims, got shape {weight.shape}")
    if weight.dtype != self.dtype or (bias is not None and bias.dtype != self.dtype):
      raise RuntimeError(f"conv input, weight and bias must have one dtype, got {self.dtype}, {weight.dtype}"
                         f"{'' if bias is None else f' and {bias.dtype}'}")
    return weight.ndim - 2

  def conv2d(self, weight: Tensor, bias: Optional[Tensor] = None, groups: int = 1, stride=1, dilation=1,
             padding: Any = 0, acc_dtype: Any = None) -> Tensor:
    """Cross-correlation, as torch's conv2d, over the last weight.ndim − 2 dims (so it is conv1d/conv3d too).
    self (N, C_in, *spatial) or unbatched (C_in, *spatial); weight (C_out, C_in / groups, *kernel); bias (C_out,).
    padding: an int, one per dim, torch's flat (left, right, top, bottom) order, 'same' or 'valid'; a negative
    amount crops the input, as tinygrad (torch raises).
    Built as pad → window view (`_pool`) → broadcast multiply with the weight → sum over (C_in / groups, *kernel)."""
    count = self._conv_dims(weight, bias)
    if self.ndim == count + 1:
      return self.unsqueeze(0).conv2d(weight, bias, groups, stride, dilation, padding, acc_dtype).squeeze(0)
    if self.ndim != count + 2:
      raise RuntimeError(f"expected {count + 1}D (unbatched) or {count + 2}D (batched) input for weight of shape "
                         f"{weight.shape}, got input of shape {self.shape}")
    stride, dilation = _int_tuple(stride, count, "stride"), _int_tuple(dilation, count, "dilation")
    if any(s <= 0 for s in stride): raise RuntimeError(f"non-positive stride is not supported, got {stride}")
    if any(d <= 0 for d in dilation): raise RuntimeError(f"dilation should be greater than zero, got {dilation}")
    out_channels, group_channels, kernel = weight.shape[0], weight.shape[1], weight.shape[2:]
    if not isinstance(groups, int) or groups <= 0: raise RuntimeError(f"non-positive groups is not supported: {groups}")
    if out_channels % groups:
      raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got "
                         f"weight of size {list(weight.shape)} instead")
    if self.shape[1] != group_channels * groups:
      raise RuntimeError(f"Given groups={groups}, weight of size {list(weight.shape)}, expected input"
                         f"{list(self.shape)} to have {group_channels * groups} channels, but got {self.shape[1]} "
                         "channels instead")
    if bias is not None and bias.shape != (out_channels,):
      raise RuntimeError(f"Given weight of size {list(weight.shape)}, expected bias to be 1-dimensional with "
                         f"{out_channels} elements, but got bias of size {list(bias.shape)} instead")
    pads = _conv_padding(padding, kernel, dilation, stride, allow_negative=True)
    padded_size = tuple(i + b + a for i, (b, a) in zip(self.shape[2:], pads))
    if any(p < d * (k - 1) + 1 for p, k, d in zip(padded_size, kernel, dilation)):
      raise RuntimeError(f"Calculated padded input size per channel: ({' x '.join(map(str, padded_size))}). Kernel "
                         f"size: ({' x '.join(str(d * (k - 1) + 1) for k, d in zip(kernel, dilation))}). Kernel size "
                         "can't be greater than actual input size")
    batch = self.shape[0]
    x = self.pad(((0, 0), (0, 0)) + pads)._pool(kernel, stride, dilation)       # (N, C_in, *out, *kernel)
    out = x.shape[2:2 + count]
    x = x.reshape(batch, groups, 1, group_channels, *out, *kernel)
    x = x.permute(0, 1, 2, *range(4, 4 + count), 3, *range(4 + count, 4 + 2 * count))  # (N, G, 1, *out, C/G, *k)
    w = weight.reshape(1, groups, out_channels // groups, *(1,) * count, group_channels, *kernel)
    reduce_axes = tuple(range(-1 - count, 0))
    product = x * w
    result = product.sum(reduce_axes, acc_dtype=acc_dtype).cast(product.dtype).reshape(batch, out_channels, *out)
    return result if bias is None else result + bias.reshape(1, out_channels, *(1,) * count)

  def conv_transpose2d(self, weight: Tensor, bias: Optional[Tensor] = None, groups: int = 1, stride=1, dilation=1,
                       padding=0, output_padding=0) -> Tensor:
    """The gradient of conv2d with respect to its input, as torch's conv_transpose2d: weight (C_in, C_out / groups,
    *kernel). The input is spread out by the stride (zeros between), padded by dilation·(kernel − 1) − padding
    (plus output_padding after), and convolved with the flipped, group-transposed weight."""
    count = self._conv_dims(weight, bias)
    if self.ndim == count + 1:
      return self.unsqueeze(0).conv_transpose2d(weight, bias, groups, stride, dilation, padding,
                                                output_padding).squeeze(0)
    if self.ndim != count + 2:
      raise RuntimeError(f"expected {count + 1}D (unbatched) or {count + 2}D (batched) input for weight of shape "
                         f"{weight.shape}, got input of shape {self.shape}")
    stride, dilation = _int_tuple(stride, count, "stride"), _int_tuple(dilation, count, "dilation")
    padding, output_padding = _int_tuple(padding, count, "padding"), _int_tuple(output_padding, count, "output_padding")
    if any(s <= 0 for s in stride): raise RuntimeError(f"non-positive stride is not supported, got {stride}")
    if any(d <= 0 for d in dilation): raise RuntimeError(f"dilation should be greater than zero, got {dilation}")
    if any(p < 0 for p in padding + output_padding): raise RuntimeError("negative padding is not supported")
    if any(op >= max(s, d) for op, s, d in zip(output_padding, stride, dilation)):
      raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got output_padding "
                         f"{output_padding}, stride {stride}, dilation {dilation}")
    in_channels, group_out, kernel = weight.shape[0], weight.shape[1], weight.shape[2:]
    if not isinstance(groups, int) or groups <= 0 or in_channels % groups:
      raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got "
                         f"weight of size {list(weight.shape)} instead")
    if self.shape[1] != in_channels:
      raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected input"
                         f"{list(self.shape)} to have {in_channels} channels, but got {self.shape[1]} channels instead")
    if bias is not None and bias.shape != (group_out * groups,):
      raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected bias to be 1-dimensional "
                         f"with {group_out * groups} elements, but got bias of size {list(bias.shape)} instead")
    out_size = tuple((i - 1) * s - 2 * p + d * (k - 1) + op + 1 for i, s, p, d, k, op in
                     zip(self.shape[2:], stride, padding, dilation, kernel, output_padding))
    if any(o <= 0 for o in out_size):
      raise RuntimeError(f"conv_transpose2d of input {self.shape} with weight {weight.shape} gives output size "
                         f"{out_size}, which is too small")
    flipped = weight.reshape(groups, in_channels // groups, group_out, *kernel).transpose(1, 2)
    flipped = flipped.flip(tuple(range(3, 3 + count))).reshape(groups * group_out, in_channels // groups, *kernel)
    x = self
    if any(s > 1 for s in stride):   # (…, i) → (…, i, 1) → pad to (…, i, s) → (…, i·s) → first (i − 1)·s + 1
      batch_channels, spatial = x.shape[:2], x.shape[2:]
      x = x.reshape(*batch_channels, *[v for i in spatial for v in (i, 1)])
      x = x.pad(((0, 0),) * 2 + tuple(p for s in stride for p in ((0, 0), (0, s - 1))))
      x = x.reshape(*batch_channels, *[i * s for i, s in zip(spatial, stride)])
      x = x.shrink(((0, batch_channels[0]), (0, batch_channels[1])) +
                   tuple((0, (i - 1) * s + 1) for i, s in zip(spatial, stride)))
    edges = tuple((d * (k - 1) - p, d * (k - 1) - p + extra)
                  for d, k, p, extra in zip(dilation, kernel, padding, output_padding))
    x = x.pad(((0, 0), (0, 0)) + edges)
    return x.conv2d(flipped, bias, groups=groups, dilation=dilation)

  def _pool_geometry(self, kernel_size, stride, dilation, padding, ceil_mode: bool, name: str) -> _PoolGeometry:
    """Check the pooling arguments as torch does (RuntimeError) and work out the windows over the last dims."""
    count = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
    if self.ndim < count:
      raise RuntimeError(f"{name}: expected an input with at least {count} dims, got shape {self.shape}")
    kernel = _int_tuple(kernel_size, count, "kernel_size")
    no_stride = stride is None or (isinstance(stride, (tuple, list)) and not stride)
    stride = kernel if no_stride else _int_tuple(stride, count, "stride")
    dilation = _int_tuple(dilation, count, "dilation")
    if any(k <= 0 for k in kernel): raise RuntimeError(f"{name}: kernel size should be greater than zero, got {kernel}")
    if any(s <= 0 for s in stride): raise RuntimeError(f"{name}: stride should not be zero, got {stride}")
    if any(d <= 0 for d in dilation):
      raise RuntimeError(f"{name}: dilation should be greater than zero, got {dilation}")
    if isinstance(padding, (tuple, list)) and len(padding) == 2 * count:   # tinygrad's (left, right, top, bottom)
      pads = _conv_padding(padding, kernel, dilation, stride)
    else:   # torch's: one amount per dim on both sides, at most half the effective kernel
      symmetric = _int_tuple(padding, count, "padding")
      if any(p < 0 or p > (d * (k - 1) + 1) // 2 for p, k, d in zip(symmetric, kernel, dilation)):
        raise RuntimeError(f"{name}: pad should be at most half of effective kernel size, but got pad={symmetric}, "
                           f"kernel_size={kernel} and dilation={dilation}")
      pads = tuple((p, p) for p in symmetric)
    extra = []
    for i, k, s, d, (before, after) in zip(self.shape[-count:], kernel, stride, dilation, pads):
      span = i + before + after - d * (k - 1) - 1
      out = (-(-span // s) if ceil_mode else span // s) + 1
      if ceil_mode and (out - 1) * s >= i + before: out -= 1   # the last window must start inside the input or pad
      if out <= 0: raise RuntimeError(f"{name}: given input size {self.shape}, the output size {out} is too small")
      extra.append(max(0, (out - 1) * s + d * (k - 1) + 1 - (i + before + after)))
    return _PoolGeometry(kernel, stride, dilation, pads, tuple(extra))
  def _pool_windows(self, geometry: _PoolGeometry, pad_value: Scalar) -> Tensor:
    """(..., *out, *kernel): the input padded with pad_value (and ceil_mode's extra cells), cut into windows."""
    lead = ((0, 0),) * (self.ndim - len(geometry.kernel))
    padded = self.pad(lead + tuple((b, a + e) for (b, a), e in zip(geometry.padding, geometry.extra)), value=pad_value)
    return padded._pool(geometry.kernel, geometry.stride, geometry.dilation)

  def max_pool2d(self, kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode: bool = False,
                 return_indices: bool = False):
    """The max of each window over the last len(kernel_size) dims (2 for an int); stride defaults to the kernel.
    padding: an int or one per dim (torch's, both sides, at most half the kernel), or tinygrad's 2 per dim
    (left, right, top, bottom: last dim first) for asymmetric padding.
    Padding is −inf (the dtype's min for ints), so it never wins. return_indices also gives, as torch, where each
    max came from: its flat index into the pooled dims of the input (the first max of a window), in int32 as
    tinygrad (torch: int64); int64 where a plane has more than 2^31 elements."""
    geometry = self._pool_geometry(kernel_size, stride, dilation, padding, ceil_mode, "max_pool2d")
    pad_value = -math.inf if self.dtype.is_float else dtypes.min(self.dtype)
    windows = self._pool_windows(geometry, pad_value)
    values = windows.max(geometry.window_axes)
    if not return_indices: return values
    spatial = self.shape[-len(geometry.kernel):]
    index_dtype = dtypes.int32 if prod(spatial) <= dtypes.max(dtypes.int32) else dtypes.int64
    flat_positions = Tensor.arange(prod(spatial), dtype=index_dtype, device=self.device).reshape(spatial)
    position_windows = flat_positions._pool_windows(geometry, -1)                 # (*out, *kernel)
    window_size = prod(geometry.kernel)
    out_shape = windows.shape[:-len(geometry.kernel)]
    first_max = windows.reshape(*out_shape, window_size).argmax(-1)              # (..., *out)
    chosen = first_max.unsqueeze(-1) == Tensor.arange(window_size, device=self.device)
    positions = position_windows.reshape(*position_windows.shape[:-len(geometry.kernel)], window_size)
    return values, chosen.where(positions, 0).sum(-1, acc_dtype=index_dtype).cast(index_dtype)

  def max_unpool2d(self, indices: Tensor, kernel_size=(2, 2), stride=None, dilation=1, padding=0,
                   output_size=None) -> Tensor:
    """The inverse of max_pool2d(return_indices=True), as torch: each value goes to its flat index in the output's
    last len(kernel_size) dims, zeros elsewhere. The output size is (in − 1)·stride − 2·padding +
    dilation·(kernel − 1) + 1 per dim, or output_size (its last dims). A one-hot compare of indices with the output
    positions and a sum (O(input · output) per plane); differentiable in self."""
    count = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
    kernel = _int_tuple(kernel_size, count, "kernel_size")
    no_stride = stride is None or (isinstance(stride, (tuple, list)) and not stride)
    strides = kernel if no_stride else _int_tuple(stride, count, "stride")
    dilation, padding = _int_tuple(dilation, count, "dilation"), _int_tuple(padding, count, "padding")
    if not isinstance(indices, Tensor) or indices.shape != self.shape or not indices.dtype.is_int:
      raise ValueError(f"max_unpool2d: indices must be an int tensor of the input's shape {self.shape}, got "
                       f"{getattr(indices, 'shape', type(indices).__name__)}")
    if self.ndim < count: raise ValueError(f"max_unpool2d: input of shape {self.shape} has fewer than {count} dims")
    if output_size is None:
      out = tuple((i - 1) * s - 2 * p + d * (k - 1) + 1
                  for i, s, p, d, k in zip(self.shape[-count:], strides, padding, dilation, kernel))
    else: out = tuple(int(o) for o in tuple(output_size)[-count:])
    if len(out) != count or any(o <= 0 for o in out):
      raise ValueError(f"max_unpool2d: output_size {output_size} gives output {out} for input {self.shape}")
    lead, plane = self.shape[:-count], prod(out)
    message = f"max_unpool2d: index {{value}} is out of bounds for an output plane of {{size}} elements ({out})"
    check_index_bounds(indices.lazydata, IndexBounds(0, plane, message))
    flat_values, flat_indices = self.reshape(*lead, -1, 1), indices.reshape(*lead, -1, 1)
    placed = flat_indices == Tensor.arange(plane, dtype=indices.dtype, device=self.device)       # (..., in, plane)
    if self.numel() == 0: return Tensor.zeros(*lead, *out, dtype=self.dtype, device=self.device)
    # overlapping windows can pick one input twice: both copies hold its value, so the max is that value (their
    # gradient is split between them, where torch gives each the whole)
    lowest = -math.inf if self.dtype.is_float else dtypes.min(self.dtype)
    written = placed.where(flat_values, lowest).max(-2)
    return placed.any(-2).where(written, 0).cast(self.dtype).reshape(*lead, *out)

  def avg_pool2d(self, kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True) -> Tensor:
    """The mean of each window, as torch (padding as max_pool2d's, tinygrad's asymmetric form included): with
    count_include_pad the divisor counts the zero padding (but not
    ceil_mode's extra cells past it); without, only the input cells in the window. The divisors are the window
    sums of a constant tensor of ones padded the same way, so they are computed in the kernel."""
    geometry = self._pool_geometry(kernel_size, stride, dilation, padding, ceil_mode, "avg_pool2d")
    total = self._to_float()._pool_windows(geometry, 0.0).sum(geometry.window_axes)
    if not any(geometry.extra) and (count_include_pad or all(p == (0, 0) for p in geometry.padding)):
      return total / prod(geometry.kernel)
    counted = Tensor.ones(self.shape[-len(geometry.kernel):], dtype=total.dtype, device=self.device)
    counted = counted.pad(geometry.padding, value=1.0 if count_include_pad else 0.0)
    counted = counted.pad(tuple((0, e) for e in geometry.extra))._pool(geometry.kernel, geometry.stride,
                                                                       geometry.dilation)
    return total / counted.sum(geometry.window_axes)

  def _adaptive_pool(self, output_size, reduce: str) -> Tensor:
    count = len(output_size) if isinstance(output_size, (tuple, list)) else 2
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * count
    if self.ndim < count: raise RuntimeError(f"adaptive pool: expected at least {count} dims, got shape {self.shape}")
    x = self._to_float() if reduce == "mean" else self
    for k, target in enumerate(sizes):
      axis = self.ndim - count + k
      size = self.shape[axis]
      target = size if target is None else int(target)
      if target <= 0 or size == 0:
        raise RuntimeError(f"adaptive pool: output size {tuple(sizes)} must be positive for input shape {self.shape}")
      if size % target == 0:   # equal bins: a reshape and one reduce
        binned = x.reshape(*x.shape[:axis], target, size // target, *x.shape[axis + 1:])
        x = getattr(binned, reduce)(axis + 1)
        continue
      pieces = []   # torch's bins: [floor(j·size/target), ceil((j + 1)·size/target))
      for j in range(target):
        start, end = (j * size) // target, -(-((j + 1) * size) // target)
        piece = x.shrink(tuple((start, end) if a == axis else None for a in range(x.ndim)))
        pieces.append(getattr(piece, reduce)(axis, keepdim=True))
      x = pieces[0].cat(*pieces[1:], dim=axis)
    return x
  def adaptive_avg_pool2d(self, output_size) -> Tensor:
    """Mean over torch's adaptive bins of the last len(output_size) dims (an int means a square output)."""
    return self._adaptive_pool(output_size, "mean")
  def adaptive_max_pool2d(self, output_size) -> Tensor:
    """Max over torch's adaptive bins of the last len(output_size) dims (an int means a square output)."""
    return self._adaptive_pool(output_size, "max")

  def interpolate(self, size, mode: str = "linear", align_corners: bool = False) -> Tensor:
    """Resize the last len(size) dims, as torch's F.interpolate(x, size=...): mode 'nearest', 'nearest-exact',
    or 'linear' ('bilinear'/'trilinear' are the same here: linear along each dim); an int input (a uint8 image)
    gives its own dtype, rounded, as torch. Each axis is one multiply by a
    resampling matrix built from the shapes, so the gradient comes for free."""
    if mode not in INTERPOLATE_MODES:
      raise NotImplementedError(f"interpolate mode {mode!r}; known: {INTERPOLATE_MODES}")
    if align_corners and mode.startswith("nearest"):
      raise ValueError("align_corners option can only be set with the interpolating modes: linear | bilinear | "
                       "trilinear")
    size = tuple(size) if isinstance(size, (tuple, list)) else (size,)
    if len(size) > self.ndim or any(not isinstance(s, int) or s <= 0 for s in size):
      raise ValueError(f"interpolate size {size} does not fit an input of shape {self.shape}")
    if self.dtype == dtypes.uint8 and not mode.startswith("nearest"):
      return self._interpolate_uint8(size, align_corners)
    x = self._to_float()
    for k, out_size in enumerate(size):
      axis = self.ndim - len(size) + k
      if out_size == self.shape[axis]: continue   # every mode maps an axis onto itself unchanged
      matrix = Tensor(_interpolation_matrix(self.shape[axis], out_size, mode, align_corners), device=self.device)
      x = (x.transpose(axis, -1) @ matrix.cast(x.dtype)).transpose(axis, -1)
    if self.dtype.is_float: return x
    # other ints keep their dtype: linear modes round to the nearest value within the dtype's range
    return x.round().clip(dtypes.min(self.dtype), dtypes.max(self.dtype)).cast(self.dtype)
  def _interpolate_uint8(self, size: tuple[int, ...], align_corners: bool) -> Tensor:
    """Linear resizing of a uint8 image as torch's CPU kernel does it, bit for bit: one pass per axis, the last axis
    first, each a sum of products with integer weights (the float weights scaled by 2^precision and rounded, see
    _fixed_point_weights), rounded half up by a shift and clamped back to uint8 before the next pass."""
    x = self
    for k in reversed(range(len(size))):
      axis = self.ndim - len(size) + k
      if size[k] == x.shape[axis]: continue
      weights, precision = _fixed_point_weights(x.shape[axis], size[k], align_corners)
      matrix = Tensor(weights, device=self.device)
      acc = x.cast(dtypes.int32).transpose(axis, -1) @ matrix
      x = ((acc + (1 << (precision - 1))) >> precision).clip(0, 255).cast(dtypes.uint8).transpose(axis, -1)
    return x

  # ---- regularization and normalization
  def dropout(self, p: float = 0.5) -> Tensor:
    """While `Tensor.training`: zero each element with probability p and scale the rest by 1 / (1 − p)."""
    if not 0 <= p <= 1: raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not Tensor.training or p == 0: return self
    if p == 1: return self * 0
    keep = Tensor.rand(*self.shape, device=self.device) >= p
    return keep.where(self, 0) * (1 / (1 - p))
  def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """self / max(‖self‖_p, eps) along `dim`, as torch.nn.functional.normalize (p = 0 counts the nonzeros; a
    negative p is (Σ|x|^p)^(1/p), as torch)."""
    x = self._to_float()
    if p == 2: norm = x.square().sum(dim, keepdim=True).sqrt()
    elif p == 1: norm = x.abs().sum(dim, keepdim=True)
    elif p == math.inf: norm = x.abs().max(dim, keepdim=True)
    elif p == 0: norm = (x != 0).sum(dim, keepdim=True).cast(x.dtype)   # the count of nonzeros, as torch.norm
    else: norm = x.abs().pow(p).sum(dim, keepdim=True).pow(1 / p)
    return x / norm.maximum(eps)
  def layernorm(self, axis=-1, eps: float = 1e-5) -> Tensor:
    """(x − mean) / sqrt(var + eps) over `axis` (biased variance); no affine part (nn.LayerNorm adds it). The
    composite "layer_norm" (tensor_ops/composite.py)."""
    return composite("layer_norm", (self,), axis=axis, eps=eps)
  def rms_norm(self, axis=-1, eps: float = 1e-6) -> Tensor:
    """x / sqrt(mean(x²) + eps) over `axis` (an int or a tuple), in x's float dtype; no scale (nn.RMSNorm adds it).
    The composite "rms_norm" (tensor_ops/composite.py)."""
    return composite("rms_norm", (self,), axis=axis, eps=eps)
  def rmsnorm(self, axis=-1, eps: float = 1e-6) -> Tensor: return self.rms_norm(axis, eps)
  def batchnorm(self, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor, invstd: Tensor,
                axis=1) -> Tensor:
    """(x − mean)·invstd·weight + bias, where the statistics and parameters are indexed by `axis` (an int or a tuple;
    each has the shape of those dims) and broadcast over the rest. invstd is 1 / sqrt(var + eps)."""
    axes = self._reduce_axes(axis)
    shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
    kept = tuple(self.shape[i] for i in axes)
    for name, t in (("weight", weight), ("bias", bias), ("mean", mean), ("invstd", invstd)):
      if t is not None and t.shape != kept:
        raise RuntimeError(f"batchnorm: {name} of shape {t.shape} for input {self.shape} normalized over dims {axes}")
    x = (self - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None: x = x * weight.reshape(shape)
    return x if bias is None else x + bias.reshape(shape)

  # ---- attention
  def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                   dropout_p: float = 0.0, is_causal: bool = False,
                                   scale: Optional[float] = None, enable_gqa: bool = False,
                                   window: Optional[int] = None) -> Tensor:
    """softmax(q·kᵀ·scale + mask)·v for q (..., L, E), k (..., S, E), v (..., S, Ev); scale defaults to 1/√E.
    enable_gqa (grouped-query attention, as torch): k and v may have fewer heads (dim −3) than q, a divisor of its
    count; each of their heads serves that many consecutive query heads.
    A bool mask keeps True positions; a float mask is added. is_causal keeps key s <= query l; `window` (tgrad's, with
    is_causal: a sliding window) keeps only keys l - window < s <= l. Dropout on the attention weights applies only
    while `Tensor.training` (as tinygrad; torch's functional applies it always).
    On CUDA, float16/bfloat16 [B, H, L, D] inputs without an explicit mask (D 64, 128 or 256) run as one
    flash-attention kernel (the region's "flash" lowering; FLASH_ATTENTION=0 keeps the default graph)."""
    if is_causal and attn_mask is not None:
      raise RuntimeError("scaled_dot_product_attention: explicit attn_mask should not be set when is_causal=True")
    if min(self.ndim, key.ndim, value.ndim) < 2 or self.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
      raise RuntimeError(f"scaled_dot_product_attention: query {self.shape}, key {key.shape} and value {value.shape} "
                         "need (..., L, E), (..., S, E) and (..., S, Ev)")
    if enable_gqa and min(self.ndim, key.ndim, value.ndim) >= 3 and key.shape[-3] != self.shape[-3]:
      heads, kv_heads = self.shape[-3], key.shape[-3]
      if value.shape[-3] != kv_heads or heads % kv_heads:
        raise ValueError(f"scaled_dot_product_attention: enable_gqa needs key and value heads ({kv_heads}, "
                         f"{value.shape[-3]}) to be one count that divides the query heads ({heads})")
    if window is not None and (not is_causal or isinstance(window, bool) or not isinstance(window, int) or window < 1):
      raise ValueError(f"scaled_dot_product_attention: window {window!r} needs is_causal=True and an int >= 1")
    params = {"is_causal": is_causal, "scale": 1 / math.sqrt(self.shape[-1]) if scale is None else scale,
              "enable_gqa": enable_gqa}
    if window is not None: params["window"] = window
    inputs = (self, key, value) if attn_mask is None else (self, key, value, attn_mask)
    # with dropout in effect the composite is not a region: an alternative would draw other random numbers
    if Tensor.training and dropout_p: return attention(*inputs, dropout_p=dropout_p, **params)
    out = composite("scaled_dot_product_attention", inputs, **params)
    use_flash_lowering(out.lazydata, attn_mask is not None)
    return out

  # ---- losses
  def _class_hits(self, target: Tensor, axis: int, ignore_index: int) -> Tensor:
    """(target == class) as a bool tensor of self's shape (classes on `axis`), after checking the class indices
    (ignore_index allowed)."""
    classes = self.shape[axis]
    message = (f"class index {{value}} is out of bounds for {{size}} classes (input of shape {self.shape}, "
               f"ignore_index {ignore_index})")
    check_index_bounds(target.lazydata, IndexBounds(0, classes, message, ignore=ignore_index))
    positions = Tensor.arange(classes, device=self.device).reshape((classes,) + (1,) * (self.ndim - axis - 1))
    return target.unsqueeze(axis) == positions
  def _class_nll(self, target: Tensor, axis: int, ignore_index: int, label_smoothing: float, reduction: str) -> Tensor:
    """Cross entropy of logits `self` (classes on `axis`) against class indices: (1 − ε)·nll + ε·mean(−log p),
    skipping targets equal to ignore_index; 'mean' divides by the count of targets kept."""
    log_probs = self.log_softmax(axis)
    picked = self._class_hits(target, axis, ignore_index).where(log_probs, 0).sum(axis)
    loss = -picked if label_smoothing == 0 else -(1 - label_smoothing) * picked - label_smoothing * log_probs.mean(axis)
    kept = target != ignore_index
    loss = kept.where(loss, 0)
    return loss.sum() / kept.sum().cast(loss.dtype) if reduction == "mean" else _reduce_loss(loss, reduction)
  def nll_loss(self, Y: Tensor, weight: Optional[Tensor] = None, ignore_index: int = TORCH_IGNORE_INDEX,
               reduction: str = "mean") -> Tensor:
    """torch's nll_loss of log-probabilities (N, C, *d) or (C,) against int class indices Y (N, *d): −self at each
    target class, times weight[class] (one per class, default 1); targets equal to ignore_index are skipped and
    'mean' divides by the summed weights of the targets kept."""
    _check_reduction(reduction)
    if self.ndim == 0: raise RuntimeError("nll_loss needs log-probabilities with a class dim, got a 0-d tensor")
    axis = 1 if self.ndim >= 2 else 0
    if Y.shape != self.shape[:axis] + self.shape[axis + 1:] or not Y.dtype.is_int:
      raise RuntimeError(f"nll_loss: target of shape {Y.shape} and dtype {Y.dtype} for input {self.shape}: expected "
                         f"int class indices of shape {self.shape[:axis] + self.shape[axis + 1:]}")
    if weight is not None and weight.shape != (self.shape[axis],):
      raise RuntimeError(f"nll_loss: weight of shape {weight.shape} for {self.shape[axis]} classes")
    hits = self._class_hits(Y, axis, ignore_index)
    picked = hits.where(self, 0).sum(axis)
    class_weight = Tensor.ones(self.shape[axis], dtype=self.dtype, device=self.device) if weight is None else weight
    target_weight = hits.where(class_weight.reshape((-1,) + (1,) * (self.ndim - axis - 1)), 0).sum(axis)
    target_weight = (Y != ignore_index).where(target_weight, 0)
    loss = -picked * target_weight
    if reduction != "mean": return _reduce_loss(loss, reduction)
    total = target_weight.sum()
    nothing_kept = total == 0
    # every target ignored: NaN as torch (0/0), with zero gradients (the division never sees the zero)
    return nothing_kept.where(float("nan"), loss.sum() / nothing_kept.where(1, total))
  def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                    ignore_index: int = TORCH_IGNORE_INDEX) -> Tensor:
    """torch's cross_entropy of logits (N, C, *d) or (C,): Y holds class indices (N, *d) — ints, where ignore_index
    is skipped — or class probabilities of the logits' shape (floats)."""
    _check_reduction(reduction)
    if not 0 <= label_smoothing <= 1:
      raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if self.ndim == 0: raise RuntimeError("cross_entropy needs logits with a class dim, got a 0-d tensor")
    axis = 1 if self.ndim >= 2 else 0
    index_shape = self.shape[:axis] + self.shape[axis + 1:]
    if Y.shape == self.shape and Y.dtype.is_float:
      target = Y if label_smoothing == 0 else Y * (1 - label_smoothing) + label_smoothing / self.shape[axis]
      return _reduce_loss(-(self.log_softmax(axis) * target).sum(axis), reduction)
    if Y.ndim == len(index_shape) and self.ndim >= 2 and Y.ndim >= 1 and Y.shape[0] != self.shape[0]:
      raise ValueError(f"Expected input batch_size ({self.shape[0]}) to match target batch_size ({Y.shape[0]}).")
    if Y.shape != index_shape:
      raise RuntimeError(f"cross_entropy: target of shape {Y.shape} for logits {self.shape}: expected class indices "
                         f"of shape {index_shape} or probabilities of shape {self.shape}")
    if not Y.dtype.is_int: raise RuntimeError(f"expected class indices of an int dtype, got {Y.dtype}")
    return self._class_nll(Y, axis, ignore_index, label_smoothing, reduction)
  def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,
                                      reduction: str = "mean") -> Tensor:
    """tinygrad's name: cross entropy of logits (..., C) — classes on the last dim — against int class indices
    (...); targets equal to ignore_index are skipped."""
    _check_reduction(reduction)
    if self.ndim == 0 or Y.shape != self.shape[:-1]:
      raise RuntimeError(f"sparse_categorical_crossentropy: target of shape {Y.shape} for logits {self.shape}: expected"
                         f" shape {self.shape[:-1]}")
    if not Y.dtype.is_int: raise RuntimeError(f"expected class indices of an int dtype, got {Y.dtype}")
    return self._class_nll(Y, self.ndim - 1, ignore_index, label_smoothing, reduction)
  def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
    """−(y·log p + (1 − y)·log(1 − p)) for probabilities p = self; each log is clamped at −100, as torch."""
    _check_reduction(reduction)
    if Y.shape != self.shape: raise ValueError(f"Target size {Y.shape} must be the same as input size {self.shape}")
    log_p, log_not_p = self.log().maximum(BCE_LOG_FLOOR), (1 - self).log().maximum(BCE_LOG_FLOOR)
    Y = Y.cast(log_p.dtype)   # int or bool targets (tinygrad takes them) must not promote a float32 loss to float64
    return _reduce_loss(-(Y * log_p + (1 - Y) * log_not_p), reduction)
  def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean", pos_weight: Optional[Tensor] = None):
    """binary_crossentropy of sigmoid(self), computed stably from the logits: (1 − y)·x + w·log(1 + e^−x) with
    w = 1 + (pos_weight − 1)·y (log(1 + e^−x) = softplus(−x) never overflows)."""
    _check_reduction(reduction)
    if Y.shape != self.shape: raise ValueError(f"Target size {Y.shape} must be the same as input size {self.shape}")
    x = self._to_float()
    Y = Y.cast(x.dtype)   # int or bool targets: the loss keeps the logits' float dtype
    weight = 1 if pos_weight is None else 1 + (pos_weight.cast(x.dtype) - 1) * Y
    return _reduce_loss((1 - Y) * x + weight * (-x).softplus(), reduction)

def _int_tuple(value: Any, count: int, name: str) -> tuple[int, ...]:
  """An int or a sequence of `count` ints (torch's convention for kernel_size, stride, ...) as a tuple."""
  values = tuple(value) if isinstance(value, (tuple, list)) else (value,) * count
  if len(values) != count or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
    raise RuntimeError(f"expected {name} to be a single integer value or a list of {count} values, got {name}={value}")
  return tuple(int(v) for v in values)

@dataclass(frozen=True)
class _PoolGeometry:
  """Checked pooling arguments, one entry per pooled dim; `extra` is ceil_mode's padding after the end (windows
  that start inside the input but run past it, as torch allows); `padding` is (before, after) per dim."""
  kernel: tuple[int, ...]
  stride: tuple[int, ...]
  dilation: tuple[int, ...]
  padding: tuple[tuple[int, int], ...]
  extra: tuple[int, ...]
  @property
  def window_axes(self) -> tuple[int, ...]: return tuple(range(-len(self.kernel), 0))

def _conv_padding(padding: Any, kernel: tuple[int, ...], dilation: tuple[int, ...], stride: tuple[int, ...],
                  allow_negative: bool = False) -> tuple[tuple[int, int], ...]:
  """(before, after) per spatial dim from: an int, one int per dim, torch's flat (left, right, top, bottom) order
  (last dim first), 'valid', or 'same' (stride 1 only; an odd total puts the extra element after, as torch)."""
  count = len(kernel)
  if isinstance(padding, str):
    if padding == "valid": return ((0, 0),) * count
    if padding != "same": raise ValueError(f"invalid padding string {padding!r}, should be one of 'valid', 'same'")
    if any(s != 1 for s in stride): raise RuntimeError("padding='same' is not supported for strided convolutions")
    totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return tuple((t // 2, t - t // 2) for t in totals)
  if isinstance(padding, (tuple, list)) and len(padding) == 2 * count:
    flat = _int_tuple(padding, 2 * count, "padding")
    pairs = tuple((flat[2 * i], flat[2 * i + 1]) for i in range(count))[::-1]
  else: pairs = tuple((p, p) for p in _int_tuple(padding, count, "padding"))
  if not allow_negative and any(p < 0 for pair in pairs for p in pair):
    raise RuntimeError(f"negative padding is not supported: {padding}")
  return pairs

def _check_reduction(reduction: str) -> None:
  if reduction not in LOSS_REDUCTIONS: raise ValueError(f"{reduction} is not a valid value for reduction")

def _reduce_loss(loss: Tensor, reduction: str) -> Tensor:
  return loss if reduction == "none" else loss.sum() if reduction == "sum" else loss.mean()

# torch's uint8 resize keeps its weights in int16: the precision is the largest shift (below this cap) at which the
# largest weight, scaled, stays below 2^15 (aten/src/ATen/native/cpu/UpSampleKernel.cpp, _compute_int16_weights_aa)
FIXED_POINT_MAX_PRECISION = 22
INT16_LIMIT = 1 << 15

def _fixed_point_weights(in_size: int, out_size: int, align_corners: bool) -> tuple[np.ndarray, int]:
  """The (in_size, out_size) int32 weights of torch's uint8 linear resize along one axis, and their precision (the
  shift that undoes their scale). The float weights are computed in float64, as torch's: with align_corners the
  source position is dst·(in − 1)/(out − 1) and its two neighbours share 1 linearly; without, a triangle filter of
  support 1 centred at (dst + ½)·in/out, clipped to the input and normalized to sum 1."""
  weights = np.zeros((in_size, out_size), np.float64)
  if align_corners:
    scale = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    for dst in range(out_size):
      position = scale * dst
      low = min(int(position), in_size - 1)
      high = min(low + 1, in_size - 1)
      weights[low, dst] += 1 - (position - low)
      weights[high, dst] += position - low
  else:
    scale = in_size / out_size
    for dst in range(out_size):
      center = scale * (dst + 0.5)
      start, stop = max(int(center - 0.5), 0), min(int(center + 1.5), in_size)
      taps = np.maximum(1 - np.abs(np.arange(start, stop) - center + 0.5), 0)
      weights[start:stop, dst] = taps / taps.sum()
  largest = weights.max()
  precision = 0
  while precision < FIXED_POINT_MAX_PRECISION and int(0.5 + largest * (1 << (precision + 1))) < INT16_LIMIT:
    precision += 1
  return np.floor(weights * (1 << precision) + 0.5).astype(np.int32), precision

def _interpolation_matrix(in_size: int, out_size: int, mode: str, align_corners: bool) -> np.ndarray:
  """The (in_size, out_size) float32 matrix that resamples one axis, with torch's source positions computed in
  float32 as torch does: nearest floor(dst·in/out), nearest-exact floor((dst + ½)·in/out), linear at
  (dst + ½)·in/out − ½ clamped at 0 (or dst·(in − 1)/(out − 1) with align_corners)."""
  dst = np.arange(out_size, dtype=np.float32)
  matrix = np.zeros((in_size, out_size), dtype=np.float32)
  columns = np.arange(out_size)
  if mode.startswith("nearest"):
    scale = np.float32(in_size) / np.float32(out_size)
    offset = np.float32(0.5) if mode == "nearest-exact" else np.float32(0)
    source = np.minimum(np.floor((dst + offset) * scale).astype(np.int64), in_size - 1)
    if out_size == in_size: source = columns   # torch's exact shortcut
    matrix[source, columns] = 1
    return matrix
  if align_corners:
    scale = np.float32(in_size - 1) / np.float32(out_size - 1) if out_size > 1 else np.float32(0)
    position = dst * scale
  else:
    scale = np.float32(in_size) / np.float32(out_size)
    position = np.maximum(scale * (dst + np.float32(0.5)) - np.float32(0.5), np.float32(0))
  low = position.astype(np.int64)
  high = low + (low < in_size - 1)
  upper_weight = position - low.astype(np.float32)
  np.add.at(matrix, (low, columns), np.float32(1) - upper_weight)
  np.add.at(matrix, (high, columns), upper_weight)
  return matrix
