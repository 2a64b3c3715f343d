"""tgrad/custom.py: the NUMPY backend's runner on a site with a symbolic size (a prefill's prompt length)."""
import numpy as np
from tgrad.custom import HostFunction, concrete_shape
from tgrad.device import Buffer
from tgrad.dtype import dtypes
from tgrad.shape.sint import Variable

MAX_ROWS, COLUMNS = 8, 4

def double(x: np.ndarray) -> np.ndarray: return 2 * x

def test_concrete_shape_takes_the_launch_value_else_the_bound_one():
  rows = Variable("rows", 1, MAX_ROWS).bind(5)
  assert concrete_shape((1, rows, COLUMNS)) == (1, 5, COLUMNS)
  assert concrete_shape((1, rows, COLUMNS), {"rows": 3}) == (1, 3, COLUMNS)

def test_host_function_on_a_symbolic_site_fills_the_start_of_its_buffer():
  """The buffers are allocated at the maximum rows; the function sees (and writes) only the launch's rows."""
  rows = Variable("rows", 1, MAX_ROWS).bind(5)
  kernel = HostFunction("double", double, ((rows, COLUMNS),), (rows, COLUMNS))
  x = np.arange(MAX_ROWS * COLUMNS, dtype=np.float32)
  inp = Buffer("LLVM", x.size, dtypes.float32).copyin(x)
  out = Buffer("LLVM", x.size, dtypes.float32).copyin(np.full(x.size, -1, np.float32))
  kernel.runner("LLVM")([out, inp], var_vals={"rows": 3})
  got = out.copyout()
  np.testing.assert_array_equal(got[:3 * COLUMNS], 2 * x[:3 * COLUMNS])
  np.testing.assert_array_equal(got[3 * COLUMNS:], -1)   # past the launch's rows: untouched
