"""The lowered schedule: ScheduleItems become ExecItems (a runner, its Buffers, its variable values) for `run`.

`lower_schedule(items) -> list[ExecItem]` picks each item's runner: a CompiledKernel for a kernel AST (Kernel → opts
from the BEAM cache/search or the heuristics → compile; made once per AST and settings per process), a BufferCopy
between devices, a HostCopy of host data, a custom kernel's runner (tgrad/custom.py: a host function of the NUMPY
backend, or a user kernel's compiled source), or a collective's over several devices (tgrad/multi/runners.py: the
kind's own collectives, NCCL on CUDA, else copies and one fold kernel). `run(exec_items)` launches them in order.
`realize(*lazybuffers)` is schedule (create_schedule, through the schedule cache) + lower_schedule + run; a cache hit
that was lowered before under the same settings skips the middle (its plan: launches on the hit's Buffers). A
Tensor-level realize first asks the registered pre-realize passes for a context to realize in (`pre_realize_passes`;
tgrad.paths registers path selection). While a TinyJit captures (`capturing()`), lowered items are recorded, not run:
the JIT plans their memory and replays them (tgrad/jit.py). DEBUG prints what ran (see docs/env.md).
"""
from __future__ import annotations
import contextlib, time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Mapping, Optional, Protocol, Sequence
import numpy as np
from tgrad.ops import UOp, Ops
from tgrad.backend import backend, device_kind
from tgrad.lazy import LazyBuffer, holders_of
from tgrad.schedule import ScheduleItem, create_schedule
from tgrad.scalars import param_bits, param_name
from tgrad.schedule_cache import (Template, bind, eager_key, eager_launches, item_values, look_up, remember_eager,
                                  schedule, schedule_found, stored)
from tgrad.device import Buffer, Device, allocators
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.compile import CompiledKernel, compile_kernel
from tgrad.codegen.cpu_gemm import pack_plan
from tgrad.custom import runner_for
from tgrad.kept_copies import KeptCopy, kept_buffer
from tgrad.multi.collectives import fold
from tgrad.multi.runners import CopyCollective, LibraryCollective, rank_devices
from tgrad.helpers import Context, current_settings, gc_paused, settings_key
from tgrad import profiler
from tgrad.traced_run import run_traced

__all__ = ["ExecItem", "BufferCopy", "HostCopy", "CompiledKernel", "compile_kernel", "choose_opts", "get_runner",
           "lower_schedule", "run", "run_schedule", "realize", "capturing", "copy_to_host", "JitError",
           "register_pre_realize_pass", "unregister_pre_realize_pass", "pre_realize_passes"]

class Runner(Protocol):
  """What an ExecItem runs: `runner(bufs, wait, var_vals)` (seconds when wait), with a name and cost for DEBUG."""
  name: str
  flops: int
  nbytes: int
  def __call__(self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]: ...

class BufferCopy:
  """Copies bufs[1] into bufs[0] (another device, or the same one): directly between two devices of one kind where
  the kind has a path (Allocator.peer_copy: memory to memory on CPU devices), else staged through host memory."""
  name, flops = "copy", 0
  def __init__(self, nbytes: int): self.nbytes = nbytes
  def __call__(self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]:
    start = time.perf_counter()
    bufs[0].copy_from(bufs[1])
    return time.perf_counter() - start if wait else None

class HostCopy:
  """Copies a host array (held here, as bytes) into bufs[0]."""
  name, flops = "copyin", 0
  def __init__(self, data: np.ndarray):
    self.data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    self.nbytes = self.data.nbytes
  def __call__(self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]:
    start = time.perf_counter()
    bufs[0].copyin(self.data)
    return time.perf_counter() - start if wait else None

@dataclass
class ExecItem:
  """One launch: a runner, the Buffers it reads and writes (outputs first, as in the ScheduleItem) and the values of
  its symbolic variables."""
  runner: Runner   # a CompiledKernel, BufferCopy, HostCopy, or a custom kernel's runner
  bufs: list[Buffer]
  var_vals: Mapping[str, int] = field(default_factory=dict)
  output_count: int = 1   # bufs[:output_count] are written, the rest only read
  def run(self, wait: bool = False) -> Optional[float]:
    seconds = self.runner(self.bufs, wait, self.var_vals)
    self.wrote()
    return seconds
  def wrote(self) -> None:
    """Note the writes of its outputs (Buffer.version), after a launch."""
    for buffer in self.bufs[:self.output_count]: buffer.wrote()

# ---- lowering

# (device, AST, BEAM, code-changing settings) → runner. Holding the AST keeps it interned, so the next identical
# AST is the same object and the lookup hashes an id instead of computing a content key.
_runner_cache: dict[tuple, CompiledKernel] = {}
_kernel_counter = 0

_settings_memo: tuple = (None, ())   # (the settings object, its _settings tuple): the last answer, kept

def _settings() -> tuple:
  """The settings a compiled kernel depends on: BEAM and the code-changing ones, and CPU_PACK, which decides which
  kernels an item runs as (`_kernels_of`; the runners and plans cached under one value are not used under the other).
  Remembered for the settings object in force (settings objects are frozen, and any Context change installs another),
  so an eager realize pays one identity compare."""
  global _settings_memo
  current = current_settings()
  if _settings_memo[0] is not current:
    _settings_memo = (current, (current.BEAM, current.CPU_PACK, settings_key(current)))
  return _settings_memo[1]

def choose_opts(kernel: Kernel) -> None:
  """Opts for a kernel: a searched winner if BEAM is on, else the hand-written heuristics (unless NOOPT)."""
  if Context.BEAM:
    from tgrad.codegen.search import beam_search_opts   # the search is only loaded when it is used
    for opt in beam_search_opts(kernel, Context.BEAM): kernel.apply_opt(opt)
  elif not Context.NOOPT:
    from tgrad.codegen.heuristics import hand_coded_optimizations
    hand_coded_optimizations(kernel)

def get_runner(device: str, ast: UOp, settings: Optional[tuple] = None) -> CompiledKernel:
  """The compiled kernel for `ast` on `device` under the current settings (`settings`: `_settings()` read by the
  caller), compiled on first use."""
  global _kernel_counter
  key = (device, ast, *(settings or _settings()))
  if (runner := _runner_cache.get(key)) is None:
    kernel = Kernel(ast, Device[device].renderer)
    start = profiler.now() if profiler.ENABLED else 0.0
    choose_opts(kernel)
    if profiler.ENABLED: profiler.span("BEAM search" if Context.BEAM else "opts", start, kernel=kernel.name)
    _kernel_counter += 1
    runner = _runner_cache[key] = compile_kernel(device, kernel, f"{kernel.name}_n{_kernel_counter}")
  return runner

# (device, AST) of the kernel items that run as themselves (no packing plan, `_kernels_of`): their runner is looked up
# in _runner_cache straight. A pure function of the AST and the device's renderer; forgotten past MAX_SINGLE_KERNELS.
_single_kernels: set[tuple[str, UOp]] = set()
MAX_SINGLE_KERNELS = 1 << 16

def lower_schedule(items: Sequence[ScheduleItem]) -> list[ExecItem]:
  """One ExecItem per item that does work (an EMPTY item only names a Buffer, which is allocated on first use)."""
  lowered: list[ExecItem] = []
  settings = _settings() if items else ()
  for item in items:
    ast = item.ast
    op = ast.op
    if op is Ops.SINK and (item.bufs[0].device, ast) in _single_kernels and \
       (runner := _runner_cache.get((item.bufs[0].device, ast, *settings))) is not None:   # a kernel run before
      lowered.append(ExecItem(runner, list(item.bufs), item.var_vals, item.output_count))
      continue
    if op is Ops.EMPTY: continue
    if op is Ops.CUSTOM:
      lowered.append(ExecItem(runner_for(item.ast.arg, item.bufs[0].device), list(item.bufs), item.var_vals,
                              item.output_count))
    elif op is Ops.COPY:
      runner = HostCopy(item.host_data) if item.host_data is not None else BufferCopy(item.bufs[0].nbytes)
      lowered.append(ExecItem(runner, list(item.bufs), output_count=item.output_count))
    elif op is Ops.COLLECTIVE:
      lowered.append(ExecItem(collective_runner(item), list(item.bufs), output_count=item.output_count))
    else:
      device = item.bufs[0].device
      kernels = _kernels_of(item, device)
      for kernel_ast, bufs, outputs, kept in kernels:
        runner = get_runner(device, kernel_ast, settings)
        lowered.append(ExecItem(KeptCopy(runner) if kept else runner, bufs, item.var_vals, outputs))
      if op is Ops.SINK and len(kernels) == 1 and kernels[0][0] is ast:
        if len(_single_kernels) >= MAX_SINGLE_KERNELS: _single_kernels.clear()
        _single_kernels.add((device, ast))
  return lowered

def collective_runner(item: ScheduleItem) -> LibraryCollective | CopyCollective:
  """The runner of a collective step: the devices' kind's own collectives (Backend.collectives, given the started
  devices; it answers None where its library is missing), else copies between devices and fold kernels."""
  spec, outputs, inputs = item.ast.arg, item.outputs, item.inputs
  devices = rank_devices(spec, outputs, inputs)
  if len({device_kind(d) for d in devices}) == 1 and (factory := backend(devices[0]).collectives) is not None and \
     (library := factory([Device[d] for d in devices])) is not None:
    return LibraryCollective(spec, devices, library, sum(b.nbytes for b in outputs))
  if spec.kind == "all_reduce":   # the fold on the first device, of its own input and copies of the others
    scratch = [Buffer(devices[0], b.size, b.dtype) for b in inputs[1:]]
    fold_order, kernel_ast = _fold_kernel(spec.op, outputs[0], [inputs[0], *scratch])
    return CopyCollective(spec, devices, [get_runner(devices[0], kernel_ast)], fold_order, [scratch])
  if spec.kind == "reduce_scatter":   # a fold on every device, of copies of its block of every input
    scratch = [[Buffer(device, output.size, output.dtype) for _ in inputs] for device, output in zip(devices, outputs)]
    fold_order, kernel_ast = _fold_kernel(spec.op, outputs[0], scratch[0])
    return CopyCollective(spec, devices, [get_runner(device, kernel_ast) for device in devices], fold_order, scratch)
  return CopyCollective(spec, devices)

def _fold_kernel(op: Ops, output: Buffer, values: Sequence[Buffer]) -> tuple[list[int], UOp]:
  """The kernel writing `output` with `values` folded by `op` in order (collectives.fold), and where each of its
  buffers is in [output, *values]."""
  roles = [output, *values]
  folded = fold(op, [LazyBuffer.from_buffer(b, (b.size,)) for b in values])
  [kernel] = create_schedule([LazyBuffer.from_buffer(output, (output.size,)).assign(folded)])
  return [next(i for i, role in enumerate(roles) if role is b) for b in kernel.bufs], kernel.ast

# The packed copies of matmul operands (codegen/cpu_gemm.py) are scratch: written by one kernel and read by the next
# one, so every pair of one size can share one Buffer. The last PACKED_BUFFERS_KEPT sizes are kept: a fresh 16 MB
# buffer costs its page faults on every call (2048² float32: a 7.6 ms copy where a reused buffer takes 2 ms).
PACKED_BUFFERS_KEPT = 4
_packed_buffers: dict[tuple[str, int, Any, int], Buffer] = {}

def _packed_buffer(device: str, size: int, dtype, slot: int) -> Buffer:
  """The kept scratch Buffer for `slot` (a plan's scratch buffers are live at once: each its own) of this size."""
  key = (device, size, dtype, slot)
  if (buffer := _packed_buffers.pop(key, None)) is None: buffer = Buffer(device, size, dtype)
  _packed_buffers[key] = buffer   # the newest last
  while len(_packed_buffers) > PACKED_BUFFERS_KEPT: del _packed_buffers[next(iter(_packed_buffers))]
  return buffer

def _kernels_of(item: ScheduleItem, device: str) -> list[tuple[UOp, list[Buffer], int, bool]]:
  """The kernels (AST, buffers, outputs, whether it is a kept copy) that run one kernel item: itself; on a CPU, a
  matmul whose reused operand pays for packing (codegen/cpu_gemm.py) runs as copies into scratch buffers (B's panels,
  a computed A), then the matmul reading them. A copy whose sources were copied before gets a Buffer of its own and
  runs only when they changed (kept_copies.py; a TinyJit keeps it in its replays only where every source is a
  weight, jit._kept_only_from_weights). CPU_PACK=0 runs every item as itself."""
  renderer = Device[device].renderer
  if not renderer.has_threads or not Context.CPU_PACK or (plan := pack_plan(item.ast, renderer)) is None:
    return [(item.ast, list(item.bufs), item.output_count, False)]
  scratch: list[Buffer] = []
  kept: list[bool] = []
  for j, (size, dtype) in enumerate(plan.scratch):
    copy_ast, refs = plan.steps[j]   # step j writes scratch j
    buffer = kept_buffer(device, copy_ast, [item.bufs[r] for r in refs[1:]], size, dtype)
    scratch.append(buffer if buffer is not None else _packed_buffer(device, size, dtype, j))
    kept.append(buffer is not None)
  def buffers(refs: tuple[int, ...]) -> list[Buffer]: return [item.bufs[r] if r >= 0 else scratch[-1 - r] for r in refs]
  *copies, (gemm_ast, gemm_refs) = plan.steps
  return [(ast, buffers(refs), 1, kept[-1 - refs[0]]) for ast, refs in copies] + \
    [(gemm_ast, buffers(gemm_refs), item.output_count, False)]

# ---- running

class _KernelTotals:
  """Process-wide kernel counts for DEBUG output (seconds are measured only at DEBUG >= 2). One instance, whose fields
  an eager launch bumps by a specialized instruction (a class attribute is read and written through the generic
  lookup, and writing one invalidates the class's attribute caches)."""
  def __init__(self) -> None:
    self.kernels = 0
    self.seconds = 0.0

_Totals = _KernelTotals()

def run(exec_items: Sequence[ExecItem], debug: Optional[int] = None) -> None:
  """Launch the items in order (at DEBUG >= 2 each is timed and printed; `debug`: DEBUG as the caller read it)."""
  if profiler.ENABLED: return run_traced(exec_items)
  if (current_settings().DEBUG if debug is None else debug) < 2:
    for item in exec_items:
      item.runner(item.bufs, False, item.var_vals)
      for buffer in item.bufs[:item.output_count]: buffer.wrote()   # ExecItem.wrote, inline
    _Totals.kernels += len(exec_items)
    return
  for item in exec_items:
    elapsed = item.run(wait=True) or 0.0
    _Totals.kernels += 1
    _Totals.seconds += elapsed
    runner, out = item.runner, item.bufs[0]
    flops, nbytes = runner.cost(item.var_vals) if isinstance(runner, CompiledKernel) else (runner.flops, runner.nbytes)
    gflops = flops / elapsed / 1e9 if elapsed > 0 else 0.0
    gbs = nbytes / elapsed / 1e9 if elapsed > 0 else 0.0
    opts = f"opts {len(runner.opts)}" if isinstance(runner, CompiledKernel) else ""
    print(f"*** {out.device:5s} {runner.name:40s} out {out.size:>12d} {str(out.dtype):9s} {elapsed*1e6:9.1f} us "
          f"{gflops:8.2f} GFLOP/s {gbs:8.2f} GB/s  {opts}")

def run_schedule(items: Sequence[ScheduleItem]) -> None:
  """Lower and run a schedule."""
  run(lower_schedule(items))

# ---- capturing (TinyJit)

class JitError(RuntimeError):
  """A TinyJit cannot capture or replay a function as called; the message says what to change."""

class Capture:
  """ExecItems recorded, in order, instead of run."""
  def __init__(self): self.items: list[ExecItem] = []

_capture: Optional[Capture] = None

@contextlib.contextmanager
def capturing() -> Iterator[Capture]:
  """Within the scope, `realize` lowers its schedule into the yielded Capture and launches nothing."""
  global _capture
  if _capture is not None: raise JitError("a TinyJit is already capturing: a jitted function can't capture another")
  _capture = Capture()
  try: yield _capture
  finally: _capture = None

def is_capturing() -> bool: return _capture is not None

def copy_to_host(buffer: Buffer) -> np.ndarray:
  """The buffer's values on the host (what Tensor.numpy reads); refused while a TinyJit captures."""
  if _capture is not None:
    raise JitError("reading a tensor's values (.numpy(), .item(), .tolist()) inside a TinyJit function: the value "
                   "would be read once, at capture, and replays would not read it again. Return the tensor from the "
                   "function and read it after the call")
  if profiler.ENABLED:
    with profiler.phase("synchronize + copy to host", bytes=buffer.nbytes): return buffer.copyout()
  return buffer.copyout()

@gc_paused()
def keep_old_values_of(buffers: Sequence[Buffer]) -> None:
  """Before a run that writes `buffers` in place without scheduling (a TinyJit replay): a realized value whose data
  is in one of them and that a pending value still reads gets a copy of its data first (docs/semantics.md; the
  scheduler does the same for ASSIGNs it schedules, schedule.keep_old_values)."""
  for buffer in buffers:
    for holder in holders_of(buffer):
      if not holder.pending_readers(): continue
      old = LazyBuffer.copy_of_buffer(buffer)
      realize(old)
      holder.move_readers_to(old)

# ---- pre-realize passes
# A pass sees the values a Tensor-level realize is about to compute and returns a context to realize them in, or None
# (the usual case: nothing to do). The layers above register theirs (tgrad.paths: path selection, which applies the
# selected lowerings to the graph and sets BEAM); this module imports nothing above it.
PreRealizePass = Callable[[Sequence[LazyBuffer]], Optional[ContextManager]]
pre_realize_passes: list[PreRealizePass] = []   # changed in place only: tensor.py's realize holds the list

def register_pre_realize_pass(realize_pass: PreRealizePass) -> None:
  if realize_pass not in pre_realize_passes: pre_realize_passes.append(realize_pass)

def unregister_pre_realize_pass(realize_pass: PreRealizePass) -> None:
  if realize_pass in pre_realize_passes: pre_realize_passes.remove(realize_pass)

# ---- realizing
# An eager op's realize is a schedule-cache hit of a graph realized before: the same kernels on new Buffers. The first
# time a cached schedule is lowered, it gets a plan (`_plan_of`, kept on its template): per kernel item, the compiled
# kernel's launcher and the template's Buffer indices. A later hit under the same settings takes its Buffers and
# commits from schedule_cache.bind and launches the plan: no ScheduleItem, ExecItem or runner lookup. Only where
# nothing records or watches launches (no TinyJit capture, profiler, graph observer or DEBUG), and only for schedules
# without writes (an ASSIGN may need old values kept first: schedule.keep_old_values) whose every item is a kernel
# that runs as itself (no packed matmul, kept copy, copy, custom kernel, collective) at fixed launch sizes.

# A plan: (settings, launches, whether any launch reads values from the graph, the runner cache it was made from);
# launches: None when the schedule can't be planned, else per kernel (launch, its buffer indices, its output indices,
# its variables, its template item where it reads variables or scalar parameters, else None). A plan holds its
# runners: one made from a runner cache that was since replaced (a test's fresh one) is not used; whoever clears the
# runner cache to free compiled kernels clears the schedule cache too (schedule_cache.clear), which holds the plans.
Plan = tuple[tuple, Optional[tuple], bool, dict]

def _plan_of(template: Template, items: Sequence[ScheduleItem], settings: tuple) -> Plan:
  """The plan of a template that was just lowered (from `items`, its ScheduleItems in this graph) under `settings`."""
  launches: list[tuple] = []
  for template_item, item in zip(template.items, items):
    ast = template_item.ast
    if ast.op is Ops.EMPTY: continue
    if ast.op is not Ops.SINK or template_item.host_node is not None: return settings, None, False, _runner_cache
    device = item.bufs[0].device
    if (device, ast) not in _single_kernels or (runner := _runner_cache.get((device, ast, *settings))) is None or \
       (launch := runner.launcher(len(template_item.buffers))) is None: return settings, None, False, _runner_cache
    reads = template_item if template_item.variables or template_item.scalars else None
    launches.append((launch, template_item.buffers, template_item.buffers[:template_item.outputs], runner.variables,
                     reads))
  return settings, tuple(launches), any(launch[4] is not None for launch in launches), _runner_cache

def _plan_usable(plan: Optional[Plan], settings: tuple) -> bool:
  """Whether a template's plan can launch now: it has launches, made under these settings from this runner cache."""
  return plan is not None and plan[1] is not None and plan[0] == settings and plan[3] is _runner_cache

def realize(*lbs: LazyBuffer) -> None:
  """Compute the given lazy values into device buffers (afterwards `lb.base.buffer` holds each)."""
  current = current_settings()
  if profiler.ENABLED or profiler.graph_observer is not None or _capture is not None or current.DEBUG:
    return _realize_watched(lbs)
  settings = _settings_memo[1] if _settings_memo[0] is current else _settings()
  eager = None
  # one value: its base is what a realize computes (a view of it, such as a reduce's result reshaped, needs no kernel)
  if len(lbs) == 1 and (root := lbs[0] if lbs[0]._base is None else lbs[0]._base).buffer is None:
    if (eager := eager_key(root, current.RIDERS)) is not None and \
       (entry := eager_launches.get(eager[0])) is not None and (entry[0] is settings or entry[0] == settings) and \
       entry[1] is _runner_cache:
      return _launch_eager(eager[1], eager[2], entry)
  if (found := look_up(lbs, current)) is None: return
  template = found[2]
  if template is None or not _plan_usable(plan := template.plan, settings):
    items = schedule_found(found)
    run(lower_schedule(items), 0)
    if found[3]: return   # a schedule with writes is never planned
    if template is None: template = stored(found[1])
    if template is not None and not _plan_usable(template.plan, settings):
      template.plan = _plan_of(template, items, settings)
    if eager is not None and template is not None: _remember_eager(eager[0], template, found)
    return
  # the planned hit (an eager op's, the first time under its eager key): loops written out (a comprehension is a call
  # of its own)
  if eager is not None: _remember_eager(eager[0], template, found)
  walk, launches = found[0], plan[1]
  values: list[tuple] = []
  if plan[2]:   # read before bind: its commits drop a root's arg (a lifted scalar's value)
    for _, _, _, variables, reads in launches:
      if reads is None: values.append(())
      else:
        var_vals = item_values(walk, reads)
        values.append(tuple(var_vals[name] for name in variables))
  _launch(launches, bind(walk, template), values)

def _launch(launches: tuple, bufs: list[Buffer], values: list[tuple]) -> None:
  """A plan's launches on the template's Buffer list `bufs`, with each launch's variable values (`values`, empty where
  none reads any), each output's write noted."""
  k = 0
  for launch, indices, outputs, _, _ in launches:
    handles = []   # a Buffer's handle is allocated on first use; an allocated one is read straight
    for i in indices: handles.append(handle if (handle := bufs[i]._handle) is not None else bufs[i].handle)
    launch(handles, values[k] if values else ())
    for i in outputs:   # Buffer.wrote, inline
      owner = bufs[i]
      while owner.base is not None: owner = owner.base
      owner.writes += 1
    k += 1
  _Totals.kernels += k

# An eager launch: what `_launch_eager` needs of a planned template of one kernel, flat (settings, the runner cache,
# the launch, its buffer indices, its output indices, the new Buffers' (device, size, dtype), the commits, and the node
# positions of the constants its scalar parameters carry, in the order of the kernel's variables), kept under the
# graph's eager key.
EagerLaunch = tuple[tuple, dict, Callable, tuple, tuple, tuple, tuple, tuple]

def _remember_eager(key: tuple, template: Template, found: Any) -> None:
  """Keep the eager launch of a template planned as one kernel under its eager key (schedule_cache.remember_eager
  says where one may be kept)."""
  plan = template.plan
  if plan is None or plan[1] is None or len(plan[1]) != 1: return
  launch, indices, outputs, variables, reads = plan[1][0]
  scalars = reads.scalars if reads is not None else ()
  carried = {param_name(k): p for k, p in enumerate(scalars)}   # scalar_values' names: parameter k, constant k
  if any(name not in carried for name in variables): return   # a variable no constant carries: not an eager launch
  remember_eager(key, (plan[0], plan[3], launch, indices, outputs,
                       tuple((device, size, dtype) for device, size, dtype, _ in template.new_buffers),
                       template.commits, tuple(carried[name] for name in variables)), template, found)

def _launch_eager(nodes: list[LazyBuffer], leaf_buffers: list[Buffer], entry: EagerLaunch) -> None:
  """The eager hit: one op over realized values and constants (schedule_cache.eager_key: `nodes` numbered as the
  template's positions, `leaf_buffers` its realized Buffers) planned as one kernel. What `bind` and the planned hit
  do, on the eager key's nodes: scalar values read, new Buffers made, the commits, the launch."""
  _, _, launch, indices, outputs, new_buffers, commits, scalars = entry
  values: list = []
  for p in scalars:   # a lifted scalar's value as its parameter's bits (scalar_values'), read before the commits
    lb = nodes[p]
    values.append(param_bits(lb.arg, lb.dtype))
  bufs = leaf_buffers
  for device, size, dtype in new_buffers:   # allocated at once (the device's allocator, once a Buffer of it was)
    bufs.append(Buffer(device, size, dtype, None, 0, None, allocators.get(device)))
  for p, i, keeps_arg in commits: nodes[p].commit(bufs[i], keeps_arg)
  for lb in nodes:   # schedule_cache._forget_regions, inline
    if lb.region is not None: lb.set_region(None)
  handles = []   # a Buffer's handle is allocated on first use; an allocated one is read straight
  for i in indices: handles.append(handle if (handle := bufs[i]._handle) is not None else bufs[i].handle)
  launch(handles, values)
  for i in outputs:   # Buffer.wrote, inline
    owner = bufs[i]
    while owner.base is not None: owner = owner.base
    owner.writes += 1
  _Totals.kernels += 1

def _realize_watched(lbs: Sequence[LazyBuffer]) -> None:
  """`realize` through ScheduleItems and ExecItems, for whatever records or watches them: a TinyJit capture, the
  profiler, a graph observer, DEBUG output."""
  tracing, start = profiler.ENABLED, profiler.realize_started() if profiler.ENABLED else 0.0
  observe = profiler.graph_observer(lbs) if profiler.graph_observer is not None else None
  items = schedule(list(lbs), keep_old=_capture is None)
  if tracing: start = profiler.span("schedule", start, items=len(items))
  exec_items = lower_schedule(items)
  if tracing: start = profiler.span("lower", start)
  if observe is not None:
    observe(items)
    if tracing: start = profiler.span("graph picture (GRAPH=1)", start)
  if _capture is not None:
    _capture.items.extend(exec_items)
    if tracing: profiler.realize_ended()
    return
  debug = current_settings().DEBUG
  run(exec_items, debug)
  if tracing: profiler.realize_ended(profiler.span("launch", start, launches=len(exec_items)))
  if items and debug >= 1:
    timed = f", {_Totals.seconds*1e3:.2f} ms in kernels" if debug >= 2 else ""
    print(f"realized {len(items)} schedule items; {_Totals.kernels} kernels run so far{timed}")
