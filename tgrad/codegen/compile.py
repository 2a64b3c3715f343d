"""One kernel from opts to a loaded program: linearize, render, compile (binaries cached on disk), load.

Input: a Kernel whose opts are applied (by the heuristics, a searched winner, or a search candidate). Output: a
CompiledKernel, the runner that launches it on Buffers. This module sits below both the search (which compiles
candidates) and realize (which compiles the kernels a schedule needs); it decides nothing about opts.
"""
from __future__ import annotations
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence
from tgrad.codegen.kernel import Kernel, Opt
from tgrad.codegen.linearizer import linearize
from tgrad.device import Buffer, Device
from tgrad.helpers import Context
from tgrad import profiler
from tgrad.ops import Ops
from tgrad.shape.sint import evaluate, is_symbolic, sint, vmax_of

LAUNCH_DIMS_MEMO = 256   # launch dims of a symbolic kernel remembered per variable values (a decode loop's positions)
Dims = tuple[tuple[int, ...], tuple[int, ...]]

def remembered_dims(memo: dict[tuple, Dims], key: tuple, make: Callable[[], Dims]) -> Dims:
  """memo[key] (a runner's launch dims at variable values `key`), made by make() the first time; the memo is emptied
  when it holds LAUNCH_DIMS_MEMO entries."""
  if (dims := memo.get(key)) is None:
    if len(memo) >= LAUNCH_DIMS_MEMO: memo.clear()
    dims = memo[key] = make()
  return dims

@dataclass
class CompiledKernel:
  """A kernel ready to launch: its program, launch sizes, source and cost estimate. `runner(buffers)` launches it
  (`wait=True` returns seconds); `prepare(handles)` returns a no-argument launch with its arguments bound;
  `launcher(arguments)` returns a launch taking device handles and variable values (the eager fast path's)."""
  name: str
  program: Callable
  global_size: tuple[int, ...]
  local_size: tuple[int, ...]
  src: str
  opts: list[Opt]
  flops: sint    # per launch: an expression of the variables for a symbolic kernel (`cost` evaluates it)
  nbytes: sint
  device: str = ""
  variables: tuple[str, ...] = field(default=())   # DEFINE_VAR names, in the order the program takes their values
  def __post_init__(self):   # a launch size may be symbolic (an index UOp over the variables): evaluated per launch
    self.symbolic_dims = is_symbolic(self.global_size) or is_symbolic(self.local_size)
    self._dims_at: dict[tuple, tuple[tuple[int, ...], tuple[int, ...]]] = {}   # variable values → launch dims
    self._launcher: Optional[Callable[[Sequence[Any], Sequence[int]], Any]] = None
  def cost(self, var_vals: Optional[dict[str, int]] = None) -> tuple[int, int]:
    """(flops, bytes) of one launch at these variable values; at the variables' maximum without them."""
    def at(x: sint) -> int: return x if isinstance(x, int) else evaluate(x, var_vals) if var_vals else vmax_of(x)
    return at(self.flops), at(self.nbytes)
  def launch_dims(self, var_vals: Optional[dict[str, int]] = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global_size, local_size) for these variable values (remembered for the last LAUNCH_DIMS_MEMO values)."""
    if not self.symbolic_dims: return self.global_size, self.local_size
    key = tuple((var_vals or {}).get(name) for name in self.variables)
    return remembered_dims(self._dims_at, key, lambda: (tuple(evaluate(s, var_vals) for s in self.global_size),
                                                        tuple(evaluate(s, var_vals) for s in self.local_size)))
  def argument_values(self, var_vals: Optional[dict[str, int]]) -> tuple[int, ...]:
    """The kernel's arguments after its buffers: its variables' values, in `variables` order (every runner a graph
    launches has this method: attention_kernel.FlashAttentionRunner's may give a device table's address instead)."""
    if not self.variables: return ()
    if var_vals is None: raise ValueError(f"kernel {self.name} needs values of {list(self.variables)}")
    return tuple(int(var_vals[name]) for name in self.variables)
  def __call__(self, buffers: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]:
    vals = self.argument_values(var_vals)
    # a Buffer's handle is allocated on first use; an allocated one is read straight (the property is per launch)
    handles = []   # a loop, not a comprehension (a call of its own): this is every launch
    for b in buffers: handles.append(handle if (handle := b._handle) is not None else b.handle)
    if self.symbolic_dims:
      global_size, local_size = self.launch_dims(var_vals)
      return self.program(*handles, global_size=global_size, local_size=local_size, vals=vals, wait=wait)
    return self.program(*handles, global_size=self.global_size, local_size=self.local_size, vals=vals, wait=wait)
  def launcher(self, arguments: int) -> Optional[Callable[[Sequence[Any], Sequence[int]], Any]]:
    """`launch(handles, vals)`: this kernel on `arguments` device handles (allocated) and its variables' values (in
    `variables` order), with no Buffer, keyword or launch-size work per call: the program's own (`program.launcher`)
    where it has one. None for symbolic launch sizes (they are evaluated per launch: `__call__`)."""
    if self.symbolic_dims: return None
    if self._launcher is None:
      if (make := getattr(self.program, "launcher", None)) is not None:
        self._launcher = make(arguments, len(self.variables), self.global_size, self.local_size)
      else:
        program, global_size, local_size = self.program, self.global_size, self.local_size
        def launch(handles: Sequence[Any], vals: Sequence[int]) -> None:
          program(*handles, global_size=global_size, local_size=local_size, vals=tuple(vals))
        self._launcher = launch
    return self._launcher
  def prepare(self, handles: Sequence[Any], vals: Sequence[int] = ()) -> Callable[[], None]:
    """A launch of this kernel on these device handles that does no work in Python beyond the call itself."""
    global_size, local_size = self.launch_dims(dict(zip(self.variables, vals)))
    return self.program.prepare(handles, global_size, local_size, tuple(vals))

def render_source(kernel: Kernel, name: Optional[str] = None) -> tuple[str, list]:
  """The kernel's source for its renderer and the linear UOps it was rendered from (none for a warpgroup matmul,
  OptOps.WGMMA, or a float32 matmul template, OptOps.SGEMM: the renderer writes those kernels whole). `name` is the
  function's name (kernel.function_name)."""
  name = name or kernel.function_name
  if (matmul := kernel.warpgroup_matmul) is not None:
    return kernel.renderer.render_warpgroup_matmul(name, matmul), []
  if (simt := kernel.simt_matmul) is not None:
    return kernel.renderer.render_simt_matmul(name, simt), []
  uops = linearize(kernel)
  return kernel.renderer.render(name, uops), uops

def compile_kernel(device: str, kernel: Kernel, name: Optional[str] = None) -> CompiledKernel:
  """Linearize, render, compile (disk-cached) and load one kernel whose opts are already applied. The function is
  always called `kernel.function_name`, so the same kernel has the same source wherever it is compiled (BEAM's
  winner hits the binary cache); `name` only labels the runner in DEBUG output."""
  dev = Device[device]
  name = name or kernel.name
  tracing, begin = profiler.ENABLED, profiler.now()
  src, uops = render_source(kernel)
  if tracing: begin = profiler.span("linearize + render", begin, kernel=name)
  if Context.DEBUG >= 5: print(uops_text(uops))
  if Context.DEBUG >= 4: print(src)
  start = time.perf_counter()
  program = dev.load_program(kernel.function_name, src)
  compile_ms = (time.perf_counter() - start) * 1e3
  if tracing: profiler.span("compile", begin, kernel=name)
  if Context.DEBUG >= 3: print(f"{name}: opts {kernel.applied_opts}, compiled and loaded in {compile_ms:.1f} ms")
  global_size, local_size = kernel.launch_dims()
  flops, nbytes = kernel.estimate()
  variables = tuple(sorted({u.arg[0] for u in uops if u.op is Ops.DEFINE_VAR}))   # the renderers' argument order
  if kernel.warpgroup_matmul is not None: variables = kernel.warpgroup_matmul.variables   # its sizes' (sorted too)
  runner = CompiledKernel(name, program, global_size, local_size, src,
                          list(kernel.applied_opts), flops, nbytes, device, variables)
  if tracing: profiler.kernel_compiled(runner, uops_text(uops))
  return runner

def uops_text(uops: Sequence) -> str:
  """The linear UOps one per line (what DEBUG=5 prints and the viz page shows)."""
  return "\n".join(f"{i:4d} {u.op.name:14s} {str(u.dtype):18s} {u.arg!r}" for i, u in enumerate(uops))
