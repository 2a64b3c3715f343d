"""Sorting along one dim: sort (stable, values and indices), argsort and topk.

A comparison-count sort: each element's place is the number of elements that must come before it (those smaller,
plus the equal ones at lower positions, so it is stable), found with one (n × n) compare and a sum; the output is
a one-hot (n × n) compare of places with positions and a sum. O(n²) work and memory per sorted row, in a fixed
handful of kernels: meant for the short rows tests and top-k sampling use, not for sorting millions of elements.
NaNs sort as the largest values (last ascending, first descending), as torch.
"""
from __future__ import annotations
from typing import TYPE_CHECKING
from tgrad.dtype import dtypes
from tgrad.tensor_ops.args import _resolve_axis
if TYPE_CHECKING: from tgrad.tensor import Tensor   # at runtime: bound by tgrad/tensor.py (see __init__.py)

class SortingMixin:
  """Tensor's sort, argsort and topk."""
  def sort(self, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    """(values, indices) sorted along `dim`, stable (equal values keep their order), as torch.sort. The indices are
    int32 (int64 past 2^31 elements); the values are differentiable (the gradient goes back to where each came
    from). Costs O(n²) per row for a dim of size n (see the module docstring)."""
    if self.ndim == 0: return self, Tensor.zeros((), dtype=dtypes.int32, device=self.device)
    dim = _resolve_axis(dim, self.ndim, self.shape)
    x = self.transpose(dim, -1)
    size = x.shape[-1]
    index_dtype = dtypes.int32 if size <= dtypes.max(dtypes.int32) else dtypes.int64
    key = x.detach()
    key = (key.cast(dtypes.uint8) if key.dtype.is_bool else key)
    mine, other = key.unsqueeze(-1), key.unsqueeze(-2)            # (..., i, 1) against (..., 1, j)
    before = _ordered_before(other, mine, descending)             # element j must come before element i
    positions = Tensor.arange(size, dtype=index_dtype, device=self.device)
    earlier = positions.reshape(1, size) < positions.reshape(size, 1)       # j < i
    ties_before = _equal(other, mine) & earlier
    place = (before | ties_before).sum(-1, acc_dtype=index_dtype).cast(index_dtype)   # (..., i): where i goes
    lands = place.unsqueeze(-2) == positions.reshape(size, 1)    # (..., r, i): element i lands at position r
    values_dtype = dtypes.int32 if x.dtype.is_bool else x.dtype
    values = lands.where(x.unsqueeze(-2), 0).sum(-1, acc_dtype=values_dtype).cast(x.dtype)
    indices = lands.where(positions.reshape(1, size), 0).sum(-1, acc_dtype=index_dtype).cast(index_dtype)
    return values.transpose(dim, -1), indices.transpose(dim, -1)
  def argsort(self, dim: int = -1, descending: bool = False) -> Tensor:
    """The indices that sort along `dim` (stable), as torch.argsort(stable=True)."""
    return self.sort(dim, descending)[1]
  def topk(self, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
    """(values, indices) of the k largest (or smallest) along `dim`, largest first (smallest first), as torch.topk;
    equal values keep their order. `sorted_` is tinygrad's name for torch's `sorted`: the output is always sorted."""
    size = self.shape[_resolve_axis(dim, self.ndim, self.shape)] if self.ndim else 1
    if not isinstance(k, int) or not 0 <= k <= size:
      raise ValueError(f"topk: k {k} must be in [0, {size}] for dim {dim} of shape {self.shape}")
    values, indices = self.sort(dim, descending=largest)
    if self.ndim == 0: return values, indices
    axis = _resolve_axis(dim, self.ndim, self.shape)
    keep = tuple((0, k) if i == axis else None for i in range(self.ndim))
    return values.shrink(keep), indices.shrink(keep)

def _equal(a: Tensor, b: Tensor) -> Tensor:
  """a == b, with NaN equal to NaN (so NaNs keep their order among themselves)."""
  same = a == b
  return same | (a.isnan() & b.isnan()) if a.dtype.is_float else same

def _ordered_before(a: Tensor, b: Tensor, descending: bool) -> Tensor:
  """a strictly before b in the sort order, NaN counting as the largest value."""
  if descending: a, b = b, a
  less = a < b
  return less | (a.isnan().logical_not() & b.isnan()) if a.dtype.is_float else less
