"""tgrad: a small tinygrad-style lazy tensor framework.

`Tensor` is the whole user API; `dtypes` names the element types; `Device` finds backends; `Context` scopes the
settings that environment variables set; `TinyJit` captures a function's kernels and replays them; `Variable` names
a symbolic size (docs/symbolic.md). Importing tgrad registers path selection (tgrad.paths) as a pre-realize pass.
"""
from tgrad.tensor import Tensor
from tgrad.dtype import DType, dtypes
from tgrad.device import Device
from tgrad.helpers import Context
from tgrad.jit import TinyJit
from tgrad.shape.sint import Variable
import tgrad.paths  # noqa: F401  (registers path selection with tgrad/realize.py)

__all__ = ["Tensor", "DType", "dtypes", "Device", "Context", "TinyJit", "Variable"]
