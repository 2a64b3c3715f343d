"""How far a path's outputs are from their reference: max relative and absolute error, with a relative floor.

The relative error of each element is its error over the larger of its reference magnitude and a floor: √ε of the
output's dtype times the output's largest reference magnitude. Below that floor an element's error is set by the
rounding of the large values it was computed from (in float16 a logit near 0 carries the error of the products of
size ~max that made it), not by its own magnitude; √ε is 3.5e-4 of the largest value in float32, 3.1e-2 in float16,
8.8e-2 in bfloat16. Used by path measurements (path.py) and user-kernel verification (user_kernels.py).
"""
from __future__ import annotations
import math
from typing import Optional, Sequence
import numpy as np
from tgrad.dtype import DType, dtypes

def relative_floor(dtype: DType) -> float:
  """√ε of a float dtype (see the module doc); exact dtypes (ints, bools, float64) get float64's."""
  return math.sqrt(float(np.finfo(dtype.np if dtype.is_float and dtype.itemsize < 8 else np.float64).eps)) \
    if dtype != dtypes.bfloat16 else math.sqrt(2.0 ** -7)

def errors(outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray],
           floors: Optional[Sequence[float]] = None) -> tuple[float, float]:
  """(max relative, max absolute) error over all outputs; see the module doc for the relative floor. Equal values
  (the same infinity, NaN against NaN) are exact; NaN against a number, or a number against an infinity, is an
  infinite error."""
  max_rel = max_abs = 0.0
  floors = floors or [relative_floor(dtypes.float32)] * len(outputs)
  for out, ref, relative_to in zip(outputs, reference, floors):
    if out.size == 0: continue
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
      equal = (out == ref) | (np.isnan(out) & np.isnan(ref))
      diff = np.where(equal, 0.0, np.abs(out - ref))
      diff = np.where(np.isnan(diff), np.inf, diff)
      finite = np.abs(ref[np.isfinite(ref)])
      floor = max(relative_to * (float(finite.max()) if finite.size else 1.0), np.finfo(np.float64).tiny)
      scale = np.maximum(np.where(np.isfinite(ref), np.abs(ref), 1.0), floor)
      relative = np.where(np.isinf(diff), np.inf, diff / scale)
    max_abs = max(max_abs, float(diff.max()))
    max_rel = max(max_rel, float(relative.max()))
  return max_rel, max_abs
