"""Python renderer: linear UOps → the source of one Python function that runs the kernel element by element.

The function is `def name(buf0, ..., var_a, ..., core)`: buffers are the runtime's raw byte arrays (viewed once, at
the top, as the dtype each load or store uses), variables are the 64-bit launch values sorted by name (a float scalar
parameter's bits: `parameter` decodes them), `core` is the SPECIAL thread index. RANGE/ENDRANGE are `for` loops,
DEFINE_ACC/ASSIGN/REDUCE a local variable, a masked LOAD reads only when its mask holds, a gated STORE writes only
when its gate does. Every ALU op goes through `tgrad.ops.exec_alu`, the written semantics of each op, so this device
computes exactly what the Ops docstring says (slowly: it is the reference for the plug-in interface, not a backend
to run models on).
"""
from __future__ import annotations
import math
from tgrad.codegen.renderer import Renderer
from tgrad.dtype import DType
from tgrad.ops import ALU, Ops, UOp

INDENT = "  "

def literal(value, dtype: DType) -> str:
  """A constant as Python source: floats that repr can't spell (inf, nan) by name."""
  if dtype.is_bool: return repr(bool(value))
  if dtype.is_int: return repr(int(value))
  if math.isnan(value): return "NAN"
  if math.isinf(value): return "INF" if value > 0 else "-INF"
  return repr(float(value))

class PythonRenderer(Renderer):
  device = "PYTHON"
  def render(self, name: str, uops: list[UOp]) -> str: return _FunctionWriter(name, uops).write()

class _FunctionWriter:
  def __init__(self, name: str, uops: list[UOp]):
    self.name, self.uops = name, uops
    self.names: dict[UOp, str] = {}
    self.lines: list[str] = []
    self.depth = 1
    self.opened = False   # a loop was just opened: its body is still empty

  def write(self) -> str:
    buffers = sorted((u for u in self.uops if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
    variables = sorted({u for u in self.uops if u.op is Ops.DEFINE_VAR}, key=lambda u: u.arg[0])
    parameters = [f"buf{u.arg}" for u in buffers] + [f"var_{u.arg[0]}" for u in variables] + ["core"]
    for u in variables:
      self.names[u] = f"param_{u.arg[0]}"
      self.line(f"param_{u.arg[0]} = parameter(var_{u.arg[0]}, dtypes.{u.dtype.name})")
    for buffer, dtype in dict.fromkeys(self.memory_accesses()):
      self.line(f"{self.memory(buffer, dtype)} = typed(buf{buffer}, dtypes.{dtype.name})")
    for position, u in enumerate(self.uops): self.emit(position, u)
    self.line("return None")
    return f"def {self.name}({', '.join(parameters)}):\n" + "\n".join(self.lines) + "\n"

  def memory_accesses(self):
    """(buffer index, dtype) of every load and store, in program order."""
    for u in self.uops:
      if u.op is Ops.LOAD: yield u.src[0].arg, u.dtype
      elif u.op is Ops.STORE: yield u.src[0].arg, u.src[2].dtype

  @staticmethod
  def memory(buffer: int, dtype: DType) -> str: return f"mem{buffer}_{dtype.name}"

  def line(self, text: str) -> None:
    self.lines.append(INDENT * self.depth + text)
    self.opened = False

  def emit(self, position: int, u: UOp) -> None:
    if u.op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR): return   # parameters: named and viewed at the top
    name = self.names[u] = f"v{position}"
    operands = [self.names.get(s, "") for s in u.src]   # a buffer's place is empty: its memory is named by index
    if u.op is Ops.SPECIAL: self.names[u] = "core"
    elif u.op is Ops.CONST: self.names[u] = literal(u.arg, u.dtype)
    elif u.op is Ops.DEFINE_ACC:
      self.names[u] = f"acc{u.arg}"
      self.line(f"acc{u.arg} = {operands[0]}")
    elif u.op is Ops.ASSIGN: self.line(f"{operands[0]} = {operands[1]}")
    elif u.op is Ops.REDUCE: self.names[u] = f"acc{u.arg[1]}"
    elif u.op is Ops.RANGE:
      self.names[u] = f"ridx{u.arg}"
      self.line(f"for ridx{u.arg} in range({operands[0]}, {operands[1]}):")
      self.depth, self.opened = self.depth + 1, True
    elif u.op is Ops.ENDRANGE:
      if self.opened: self.line("pass")
      self.depth -= 1
    elif u.op is Ops.LOAD:
      read = f"load({self.memory(u.src[0].arg, u.dtype)}, {operands[1]}, dtypes.{u.dtype.name})"
      masked = len(u.src) > 2 and u.src[2].dtype.is_bool
      self.line(f"{name} = {read} if {operands[2]} else {literal(0, u.dtype)}" if masked else f"{name} = {read}")
    elif u.op is Ops.STORE:
      dtype = u.src[2].dtype
      write = f"store({self.memory(u.src[0].arg, dtype)}, {operands[1]}, {operands[2]}, dtypes.{dtype.name})"
      self.line(f"if {operands[3]}: {write}" if len(u.src) > 3 else write)
    elif u.op in (Ops.CAST, Ops.BITCAST):
      helper = "cast" if u.op is Ops.CAST else "bitcast"
      self.line(f"{name} = {helper}({operands[0]}, dtypes.{u.src[0].dtype.name}, dtypes.{u.dtype.name})")
    elif u.op in ALU: self.line(f"{name} = exec_alu(Ops.{u.op.name}, dtypes.{u.dtype.name}, ({', '.join(operands)},))")
    else: raise NotImplementedError(f"Python renderer: no rule for {u.op} (a GPU-only op: this target has no locals)")
