"""Layers: plain classes whose Tensor attributes (`weight`, `bias`, `running_mean`, ...) are the model state.

`tgrad.nn.state.get_parameters(model)` and `get_state_dict(model)` find those attributes by walking the object, so a
model is any object holding layers; names match PyTorch's modules, so state dicts load across. Each layer is
initialized as PyTorch initializes it and `layer(x)` runs its forward pass, built from Tensor methods.
"""
from __future__ import annotations
import math
from typing import Optional, Union
from tgrad.dtype import dtypes
from tgrad.helpers import prod
from tgrad.bounds import IndexBounds, check_index_bounds
from tgrad.tensor import Tensor

# PyTorch initializes Linear/Conv weights with kaiming_uniform(a=√5): a bound of 1/√fan_in, like the bias
TORCH_KAIMING_A = math.sqrt(5)
Size = Union[int, tuple[int, ...]]

def _uniform_bias(size: int, fan_in: int) -> Tensor:
  bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
  return Tensor.uniform(size, low=-bound, high=bound)

def _pair(value: Size) -> tuple[int, ...]: return tuple(value) if isinstance(value, (tuple, list)) else (value, value)

class Linear:
  """y = x·Wᵀ + b with weight (out_features, in_features), as torch.nn.Linear."""
  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    self.weight = Tensor.kaiming_uniform(out_features, in_features, a=TORCH_KAIMING_A)
    self.bias = _uniform_bias(out_features, in_features) if bias else None
  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim == 0 or x.shape[-1] != self.weight.shape[1]:
      raise RuntimeError(f"Linear: input of shape {x.shape} for weight {self.weight.shape} (needs "
                         f"{self.weight.shape[1]} features in the last dim)")
    return x.linear(self.weight.transpose(), self.bias)

class Conv2d:
  """torch.nn.Conv2d: weight (out_channels, in_channels / groups, *kernel_size); padding may be 'same'/'valid'."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: Size, stride: Size = 1,
               padding: Union[Size, str] = 0, dilation: Size = 1, groups: int = 1, bias: bool = True):
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups "
                       f"({groups})")
    self.kernel_size, self.stride, self.padding, self.dilation, self.groups = \
      _pair(kernel_size), stride, padding, dilation, groups
    self.weight = Tensor.kaiming_uniform(out_channels, in_channels // groups, *self.kernel_size, a=TORCH_KAIMING_A)
    self.bias = _uniform_bias(out_channels, prod(self.weight.shape[1:])) if bias else None
  def __call__(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)

class ConvTranspose2d:
  """torch.nn.ConvTranspose2d: weight (in_channels, out_channels / groups, *kernel_size)."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: Size, stride: Size = 1, padding: Size = 0,
               output_padding: Size = 0, groups: int = 1, bias: bool = True, dilation: Size = 1):
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups "
                       f"({groups})")
    self.kernel_size, self.stride, self.padding, self.output_padding, self.dilation, self.groups = \
      _pair(kernel_size), stride, padding, output_padding, dilation, groups
    self.weight = Tensor.kaiming_uniform(in_channels, out_channels // groups, *self.kernel_size, a=TORCH_KAIMING_A)
    self.bias = _uniform_bias(out_channels, prod(self.weight.shape[1:])) if bias else None
  def __call__(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding,
                              self.output_padding)

class BatchNorm:
  """Batch normalization over dim 1 (channels) of (N, C, ...) input, as torch's BatchNorm1d/2d/3d.
  Training (`Tensor.training`): normalize with the batch's mean and biased variance, and update running_mean and
  running_var (unbiased) in place: r ← (1 − momentum)·r + momentum·batch (momentum None: a cumulative average).
  Eval: normalize with the running statistics (or the batch's, without track_running_stats). The running-stat
  updates are lazy assigns: an optimizer given these tensors (get_parameters includes them) realizes them."""
  def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True,
               momentum: Optional[float] = 0.1):
    self.num_features, self.eps, self.momentum, self.track_running_stats = sz, eps, momentum, track_running_stats
    self.weight: Optional[Tensor] = Tensor.ones(sz) if affine else None
    self.bias: Optional[Tensor] = Tensor.zeros(sz) if affine else None
    if track_running_stats:
      self.running_mean = Tensor.zeros(sz, requires_grad=False)
      self.running_var = Tensor.ones(sz, requires_grad=False)
      self.num_batches_tracked = Tensor.zeros((), dtype=dtypes.int64, requires_grad=False)
  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 2: raise ValueError(f"BatchNorm expects input of shape (N, C, ...), got {x.shape}")
    if x.shape[1] != self.num_features:
      raise RuntimeError(f"BatchNorm of {self.num_features} channels got input of shape {x.shape} ({x.shape[1]} "
                         "channels)")
    reduce_axes = tuple(i for i in range(x.ndim) if i != 1)
    use_batch_stats = Tensor.training or not self.track_running_stats
    if not use_batch_stats:
      return x.batchnorm(self.weight, self.bias, self.running_mean, (self.running_var + self.eps).rsqrt())
    count = x.numel() // x.shape[1]
    if Tensor.training and count <= 1:
      raise ValueError(f"Expected more than 1 value per channel when training, got input size {x.shape}")
    batch_mean = x.mean(reduce_axes)
    batch_var = (x - batch_mean.reshape(1, -1, *(1,) * (x.ndim - 2))).square().mean(reduce_axes)
    if Tensor.training and self.track_running_stats: self._update_running_stats(batch_mean, batch_var, count)
    return x.batchnorm(self.weight, self.bias, batch_mean, (batch_var + self.eps).rsqrt())

  def _update_running_stats(self, batch_mean: Tensor, batch_var: Tensor, count: int) -> None:
    with Tensor.no_grad():
      self.num_batches_tracked.assign(self.num_batches_tracked + 1)
      factor = self.momentum if self.momentum is not None else 1 / self.num_batches_tracked.float()
      unbiased_var = batch_var.detach() * (count / (count - 1))
      self.running_mean.assign(self.running_mean * (1 - factor) + batch_mean.detach() * factor)
      self.running_var.assign(self.running_var * (1 - factor) + unbiased_var * factor)

BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm

class LayerNorm:
  """Normalize over the last len(normalized_shape) dims, then scale and shift (elementwise_affine), as torch."""
  def __init__(self, normalized_shape: Size, eps: float = 1e-5, elementwise_affine: bool = True):
    self.normalized_shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else \
      (normalized_shape,)
    self.axis, self.eps = tuple(range(-len(self.normalized_shape), 0)), eps
    self.weight: Optional[Tensor] = Tensor.ones(*self.normalized_shape) if elementwise_affine else None
    self.bias: Optional[Tensor] = Tensor.zeros(*self.normalized_shape) if elementwise_affine else None
  def __call__(self, x: Tensor) -> Tensor:
    if x.shape[x.ndim - len(self.normalized_shape):] != self.normalized_shape:
      raise RuntimeError(f"Given normalized_shape={list(self.normalized_shape)}, expected input with shape "
                         f"[*, {', '.join(map(str, self.normalized_shape))}], but got input of size {list(x.shape)}")
    out = x.layernorm(self.axis, self.eps)
    return out if self.weight is None else out * self.weight + self.bias

class RMSNorm:
  """x / sqrt(mean(x²) + eps) over the last len(dim) dims, times a learned scale (ones at init), as torch.nn.RMSNorm
  (whose eps defaults to the dtype's machine epsilon; here to tinygrad's 1e-6)."""
  def __init__(self, dim: Size, eps: float = 1e-6, elementwise_affine: bool = True):
    self.normalized_shape = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    self.axis, self.eps = tuple(range(-len(self.normalized_shape), 0)), eps
    self.weight: Optional[Tensor] = Tensor.ones(*self.normalized_shape) if elementwise_affine else None
  def __call__(self, x: Tensor) -> Tensor:
    if x.shape[x.ndim - len(self.normalized_shape):] != self.normalized_shape:
      raise RuntimeError(f"RMSNorm over {self.normalized_shape} got input of shape {x.shape}")
    out = x.rms_norm(self.axis, self.eps)
    return out if self.weight is None else out * self.weight

class GroupNorm:
  """Split the channels (dim 1) into num_groups groups; normalize each sample's group; per-channel affine."""
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    if num_channels % num_groups:
      raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
    self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
    self.weight: Optional[Tensor] = Tensor.ones(num_channels) if affine else None
    self.bias: Optional[Tensor] = Tensor.zeros(num_channels) if affine else None
  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 2 or x.shape[1] != self.num_channels:
      raise RuntimeError(f"GroupNorm of {self.num_channels} channels got input of shape {x.shape}")
    grouped = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
    if self.weight is None: return grouped
    channel_shape = (1, self.num_channels) + (1,) * (x.ndim - 2)
    return grouped * self.weight.reshape(channel_shape) + self.bias.reshape(channel_shape)

class Embedding:
  """A lookup table: int indices (...) → rows of weight (..., embed_size); weight ~ N(0, 1), as torch."""
  def __init__(self, vocab_size: int, embed_size: int):
    self.vocab_size, self.embed_size = vocab_size, embed_size
    self.weight = Tensor.randn(vocab_size, embed_size)
  def __call__(self, idx: Tensor) -> Tensor:
    if not idx.dtype.is_int:
      raise RuntimeError(f"Embedding: expected indices of an int dtype, got {idx.dtype} (shape {idx.shape})")
    message = "Embedding: index {value} is out of range for a vocabulary of size {size}"
    check_index_bounds(idx.lazydata, IndexBounds(0, self.vocab_size, message))   # no negative indices, as torch
    return self.weight._take(0, idx)   # reads one row per index (a data-dependent load), never the table

__all__ = ["Linear", "Conv2d", "ConvTranspose2d", "BatchNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm",
           "RMSNorm", "GroupNorm", "Embedding"]
