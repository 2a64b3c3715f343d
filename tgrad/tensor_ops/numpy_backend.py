"""The NUMPY backend: each composite computed by numpy on the host, for the "numpy" lowering (composite.py).

The one place numpy computes a tensor's value: `FUNCTIONS[name](*arrays, **params) -> array` takes the composite's
inputs as float64 arrays (tgrad/custom.py HostFunctionRunner converts, and rounds the result to the output dtype) and
its params as the composite was called. It is a measured path like any other, selected only when it wins.
"""
from __future__ import annotations
import math
from typing import Any, Callable, Optional
import numpy as np

GELU_CUBIC_COEFFICIENT = 0.044715       # as composite.py: the tanh approximation of GELU
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_erf = np.frompyfunc(math.erf, 1, 1)    # the C library's erf per element (numpy has none)

def _axes(axis: Any) -> Any: return tuple(axis) if isinstance(axis, list) else axis

def exp(x: np.ndarray) -> np.ndarray: return np.exp(x)
def log(x: np.ndarray) -> np.ndarray: return np.log(x)
def tanh(x: np.ndarray) -> np.ndarray: return np.tanh(x)
def sigmoid(x: np.ndarray) -> np.ndarray: return 0.5 * np.tanh(0.5 * x) + 0.5   # never overflows
def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
  if approximate == "none": return 0.5 * x * (1 + _erf(x / math.sqrt(2)).astype(np.float64))
  return 0.5 * x * (1 + np.tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC_COEFFICIENT * x ** 3)))

def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
  exponentials = np.exp(x - x.max(axis, keepdims=True))
  return exponentials / exponentials.sum(axis, keepdims=True)
def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
  shifted = x - x.max(axis, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis, keepdims=True))

def logsumexp(x: np.ndarray, axis: Any = None, keepdim: bool = False) -> np.ndarray:
  peak = np.max(x, _axes(axis), keepdims=True)
  peak = np.where(np.isinf(peak), 0.0, peak)
  out = np.log(np.sum(np.exp(x - peak), _axes(axis), keepdims=True)) + peak
  return out if keepdim else np.squeeze(out, _axes(axis))

def rms_norm(x: np.ndarray, axis: Any = -1, eps: float = 1e-6) -> np.ndarray:
  return x / np.sqrt(np.mean(x * x, _axes(axis), keepdims=True) + eps)
def layer_norm(x: np.ndarray, axis: Any = -1, eps: float = 1e-5) -> np.ndarray:
  centered = x - np.mean(x, _axes(axis), keepdims=True)
  return centered / np.sqrt(np.mean(centered * centered, _axes(axis), keepdims=True) + eps)

def matmul(x: np.ndarray, w: np.ndarray, acc_dtype: Optional[str] = None) -> np.ndarray: return np.matmul(x, w)

def scaled_dot_product_attention(query: np.ndarray, key: np.ndarray, value: np.ndarray,
                                 attn_mask: Optional[np.ndarray] = None, *, is_causal: bool, scale: float,
                                 enable_gqa: bool, dropout_p: float = 0.0, window: Optional[int] = None) -> np.ndarray:
  """softmax(q·kᵀ·scale + mask)·v, as composite.attention (a bool mask arrives as 0/1 values)."""
  if enable_gqa and min(query.ndim, key.ndim, value.ndim) >= 3 and key.shape[-3] != query.shape[-3]:
    repeats = query.shape[-3] // key.shape[-3]
    key, value = np.repeat(key, repeats, -3), np.repeat(value, repeats, -3)
  scores = np.matmul(query, np.swapaxes(key, -1, -2)) * scale
  if is_causal:
    rows, cols = scores.shape[-2:]
    distance = np.arange(rows)[:, None] - np.arange(cols)[None, :]
    attn_mask = (distance >= 0) & (distance < (window if window is not None else max(rows, 1)))
  if attn_mask is not None:
    scores = np.where(attn_mask, scores, -np.inf) if attn_mask.dtype == bool else scores + attn_mask
  return np.matmul(softmax(scores, -1), value)

FUNCTIONS: dict[str, Callable[..., np.ndarray]] = {
  "exp": exp, "log": log, "tanh": tanh, "sigmoid": sigmoid, "gelu": gelu, "softmax": softmax,
  "log_softmax": log_softmax, "logsumexp": logsumexp, "rms_norm": rms_norm, "layer_norm": layer_norm, "matmul": matmul,
  "scaled_dot_product_attention": scaled_dot_product_attention,
}
