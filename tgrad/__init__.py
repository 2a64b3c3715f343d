"""tgrad: a small tinygrad-style lazy tensor framework.

`Tensor` is the whole user API; `dtypes` names the element types; `Device` finds backends; `Context` scopes the
settings that environment variables set; `TinyJit` captures a function's kernels and replays them; `Variable` names
a symbolic size (docs/symbolic.md); `profile("trace.json")` records a trace of a block (docs/viz.md). Importing
tgrad registers path selection (tgrad.paths) as a pre-realize pass.
"""
import tgrad.runtime  # noqa: F401  (registers every device package's Backend, loading no device)
from tgrad.tensor import Tensor
from tgrad.dtype import DType, dtypes
from tgrad.device import Device
from tgrad.helpers import Context
from tgrad.jit import TinyJit
from tgrad.shape.sint import Variable
import tgrad.paths  # noqa: F401  (registers path selection with tgrad/realize.py)
from tgrad.profiler import profile
from tgrad.viz.folder import apply_environment as _apply_viz_environment

_apply_viz_environment()   # PROFILE=trace.json, GRAPH=1, VIZ=1

__all__ = ["Tensor", "DType", "dtypes", "Device", "Context", "TinyJit", "Variable", "profile"]
