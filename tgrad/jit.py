"""TinyJit: run a function once, capture its kernels on the second call, and replay them as a CompiledGraph after that.

A call's work is what `realize` launches: the ExecItems of its schedules. On the second call TinyJit runs the
function with realize recording instead of launching (nothing runs during the capture), turns the recorded items into
a CompiledGraph, plans its memory, checks that it fits, and runs it for that call. Later calls check their arguments
against the capture and run only the graph: the Python function is not called again.

A CompiledGraph is a flat list of instructions (a runner, its argument slots, launch dims, variable values). A slot
is one buffer of the program, of one kind:
  input       a Tensor argument's buffer, swapped in every call;
  weight      persistent and never written by the program (bound once): parameters, host data copied at capture;
  state       persistent and written by the program: assigned buffers (KV caches, optimizer moments, updated
              weights), the returned tensors' buffers, and anything else still referenced after the capture call;
  activation  transient: made and dead within one call. JIT_PLAN=1 (the default) packs them into one arena per
              device (memory_planner.py), each a view at its offset; JIT_PLAN=0 gives each its own allocation.
Each device's run of instructions goes to the graph runner its backend names (tgrad/backend.py; PlainGraphRunner, a
loop over launches prepared once, for every device without its own), so a device can replay its part its own way.
A program over several devices (`device_runs`) gives each device one run of its kernels between two instructions that
cross devices on the host (a copy between devices); a collective whose runner is `per_device` (NCCL: each GPU's part
recorded into that GPU's CUDA graph) joins the run of every device it spans when their graph runners embed
collectives, so a data-parallel step replays as one graph launch per GPU.
Symbolic shapes: a capture made with a variable bound to one value replays for any value in its range. The values
of a call come from its Tensor arguments' shapes and views and from bound Variables passed as arguments; the
instructions whose kernels take a changed variable get the new values (and launch sizes) before the run.
"""
from __future__ import annotations
import functools, gc, inspect, weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Protocol, Sequence
import numpy as np
from tgrad.tensor import Tensor
from tgrad.dtype import DType, dtypes
from tgrad.backend import backend
from tgrad.device import Buffer, Device, OutOfMemoryError, newest_buffer_serial
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.realize import CompiledKernel, ExecItem, HostCopy, JitError, capturing, is_capturing, keep_old_values_of, run
from tgrad.kept_copies import KeptCopy
from tgrad.memory_planner import ArenaPlan, Lifetime, liveness, plan_arena, symbolic_peak
from tgrad.side_kernels import Step, place_side_kernels
from tgrad.shape.sint import to_sympy
from tgrad.helpers import Context
from tgrad import profiler
from tgrad.traced_run import run_traced
from tgrad.ops import Ops, UOp, symbolic_in_use
from tgrad.lazy import LazyBuffer
from tgrad.multi import MultiLazyBuffer

__all__ = ["TinyJit", "CompiledGraph", "Instruction", "Slot", "PlainGraphRunner", "JitError",
           "OutOfMemoryError", "graph_from_capture"]

INPUT, WEIGHT, STATE, ACTIVATION = "input", "weight", "state", "activation"
SLOT_KINDS = (WEIGHT, STATE, ACTIVATION, INPUT)
SHOWN_VALUE_CHARS = 60   # a non-Tensor argument in an error message is cut to this many characters

# ---------------------------------------------------------------------------------------------------------------
# the compiled graph

@dataclass
class Slot:
  """One buffer of a program. `buffer` is bound at construction (weights, state, activations) or per call (inputs);
  `offset` is the byte offset of a planned activation in its device's arena."""
  kind: str
  device: str
  size: int
  dtype: DType
  name: str = ""                      # the argument's name, for an input
  buffer: Optional[Buffer] = None
  offset: Optional[int] = None
  symbolic_size: Any = None           # the size in the symbolic variables (`size` is its maximum), if it has one
  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  def symbolic_nbytes(self) -> Any:
    """Bytes as a sympy expression in the symbolic variables (a constant for a buffer of fixed size)."""
    return to_sympy(self.symbolic_size if self.symbolic_size is not None else self.size) * self.dtype.itemsize

@dataclass(frozen=True)
class Instruction:
  """One launch: a runner, its argument slots (outputs first), and its symbolic variables' values."""
  runner: Any
  args: tuple[int, ...]
  device: str
  output_count: int = 1
  var_vals: dict[str, int] = field(default_factory=dict)
  devices: tuple[str, ...] = ()   # every device its buffers are on (several for a copy between devices, a collective)
  starts_with_previous: bool = False   # a side kernel placed right after its anchor, to start with it (side_kernels.py)
  @property
  def name(self) -> str: return self.runner.name
  @property
  def launch_dims(self) -> str:
    if not isinstance(self.runner, CompiledKernel): return "host"
    return f"global {self.runner.global_size} local {self.runner.local_size}"

class GraphRunner(Protocol):
  """Runs one device's consecutive instructions. Made once per graph with every slot bound but the inputs; before a
  run, `bind` gets the input slots whose Buffers changed since the last run (every input slot before the first)."""
  def __init__(self, device: str, instructions: Sequence[Instruction], slots: Sequence[Slot]): ...
  def bind(self, changed_slots: Sequence[int]) -> None: ...
  def rebind_variables(self, instructions: Sequence[Instruction]) -> None: ...   # their var_vals changed
  def prepare(self) -> None: ...   # make everything a run needs (graphs built, launches bound): __call__ only launches
  def __call__(self) -> None: ...

class PlainGraphRunner:
  """The instructions in order, as no-argument launches prepared once (pointers, launch dims and values bound), so a
  replay is a loop of calls with no lookups or allocation. A launch that reads a rebound input is prepared again."""
  def __init__(self, device: str, instructions: Sequence[Instruction], slots: Sequence[Slot]):
    self.device, self.instructions, self.slots = device, list(instructions), slots
    self.readers: dict[int, list[int]] = {}   # input slot → positions of the instructions that use it
    for position, instruction in enumerate(self.instructions):
      for s in dict.fromkeys(instruction.args):
        if slots[s].kind == INPUT: self.readers.setdefault(s, []).append(position)
    self.launches: list[Optional[Callable[[], Any]]] = [None] * len(self.instructions)
    self.stale = True
  def bind(self, changed_slots: Sequence[int]) -> None:
    for s in changed_slots:
      for position in self.readers.get(s, ()):
        self.launches[position] = None
        self.stale = True
  def rebind_variables(self, instructions: Sequence[Instruction]) -> None:
    wanted = {id(ins) for ins in instructions}
    for position, instruction in enumerate(self.instructions):
      if id(instruction) in wanted:
        self.launches[position] = None
        self.stale = True
  def __call__(self) -> None:
    if self.stale: self.prepare()
    for launch in self.launches: launch()   # type: ignore[misc]
  def prepare(self) -> None:
    if not self.stale: return
    for position, instruction in enumerate(self.instructions):
      if self.launches[position] is None:
        self.launches[position] = prepared_launch(instruction, [self.slots[s].buffer for s in instruction.args])
    self.stale = False

def prepared_launch(instruction: Instruction, bufs: list) -> Callable[[], Any]:
  """A no-argument call that runs the instruction on these Buffers."""
  runner = instruction.runner
  if isinstance(runner, CompiledKernel):
    return runner.prepare([b.handle for b in bufs], runner.argument_values(instruction.var_vals))
  return functools.partial(runner, bufs, False, instruction.var_vals)

def graph_runner_class(device: str) -> Callable[..., GraphRunner]:
  """The runner for a device's instructions: the one its backend names (CUDA graphs on CUDA unless CUDA_GRAPH=0),
  else the plain loop."""
  return backend(device).graph_runner() or PlainGraphRunner

def _is_kernel(instruction: Instruction) -> bool:
  return isinstance(instruction.runner, CompiledKernel) or hasattr(instruction.runner, "program")

def _joins_device_runs(instruction: Instruction) -> bool:
  """Whether a collective runs as one part per device inside each device's run (the runner is `per_device` and every
  device's graph runner `embeds_collectives`), instead of as one step between the runs."""
  return getattr(instruction.runner, "per_device", False) and \
    all(getattr(graph_runner_class(d), "embeds_collectives", False) for d in instruction.devices)

def device_runs(instructions: Sequence[Instruction]) -> list[tuple[str, list[Instruction]]]:
  """(device, instructions) for each graph runner, in launch order. On one device (or with nothing spanning
  devices): each device's consecutive instructions. Over several devices: each device's kernels up to the next
  instruction that is not a kernel (a copy, a host step: it may make the host wait) are one run, whatever other
  devices' kernels lie between them, and a collective that joins device runs (`_joins_device_runs`) is in the run of
  each of its devices, in program order; every other instruction is a run of its own. Each device keeps its order
  and the host steps keep theirs, and every part of a collective is launched before the host can wait on any."""
  if all(len(ins.devices) <= 1 for ins in instructions):
    runs: list[tuple[str, list[Instruction]]] = []
    for ins in instructions:
      if runs and runs[-1][0] == ins.device: runs[-1][1].append(ins)
      else: runs.append((ins.device, [ins]))
    return runs
  runs, open_runs = [], {}
  for ins in instructions:
    if len(ins.devices) <= 1 and _is_kernel(ins): open_runs.setdefault(ins.device, []).append(ins)
    elif len(ins.devices) > 1 and _joins_device_runs(ins):
      for device in ins.devices: open_runs.setdefault(device, []).append(ins)
    else:
      runs.extend(open_runs.items())
      open_runs = {}
      runs.append((ins.device, [ins]))
  runs.extend(open_runs.items())
  return runs

def placed_side_kernels(instructions: list[Instruction], slots: Sequence[Slot]) -> list[Instruction]:
  """The instructions with each kernel that reads only weights moved to start beside the least busy kernel before its
  first user (side_kernels.py), where its device's graph runner estimates how busy a kernel keeps the device
  (`busy_fraction`) and SIDE_KERNELS=1; otherwise as they are."""
  if not Context.SIDE_KERNELS: return instructions
  estimators = {device: getattr(graph_runner_class(device), "busy_fraction", None)
                for device in dict.fromkeys(ins.device for ins in instructions)}
  if not any(estimators.values()): return instructions
  steps = []
  for ins in instructions:
    estimate = estimators[ins.device]
    single = len(ins.devices) <= 1 and _is_kernel(ins)
    busy = estimate(ins) if single and estimate is not None else None
    inputs, outputs = ins.args[ins.output_count:], ins.args[:ins.output_count]
    side = busy is not None and bool(inputs) and all(slots[s].kind == WEIGHT for s in inputs) and \
      all(slots[s].kind == ACTIVATION for s in outputs)
    steps.append(Step(ins.args, ins.output_count, ins.device, side, busy))
  placement = place_side_kernels(steps)
  return [replace(instructions[i], starts_with_previous=True) if i in placement.starts_with_previous
          else instructions[i] for i in placement.order]

def instruction_uses(instructions: Sequence[Instruction]) -> list[tuple[int, ...]]:
  """The slots each instruction uses, for liveness: its arguments, and at a side kernel's anchor (the instruction
  before a run of `starts_with_previous` ones) their outputs too, since they run beside it."""
  uses = [ins.args for ins in instructions]
  anchor = None
  for position, ins in enumerate(instructions):
    if not ins.starts_with_previous: anchor = position
    elif anchor is not None: uses[anchor] = uses[anchor] + ins.args[:ins.output_count]
  return uses

class CompiledGraph:
  """A captured program: instructions over slots, memory planned and bound, replayed by `graph(input_buffers)`.
  `print(graph)` lists the memory per device and kind, then one instruction per line with each argument as
  kind#slot@offset+bytes (offset in the device arena for a planned activation, else 0 in its own buffer)."""
  def __init__(self, instructions: list[Instruction], slots: list[Slot], input_slots: list[int], plan: bool = True,
               constants: Sequence[tuple[int, np.ndarray]] = ()):
    instructions = placed_side_kernels(instructions, slots)
    self.instructions, self.slots, self.input_slots, self.planned = instructions, slots, input_slots, plan
    self.arenas: dict[str, Buffer] = {}
    self.arena_plans: dict[str, ArenaPlan] = {}
    lifetimes = liveness(instruction_uses(instructions))
    activations = [s for s, slot in enumerate(slots) if slot.kind == ACTIVATION]
    self.lifetimes = {s: Lifetime(*lifetimes[s], slots[s].nbytes) for s in activations}
    if plan:
      for device in dict.fromkeys(slots[s].device for s in activations):
        mine = [s for s in activations if slots[s].device == device]
        self.arena_plans[device] = arena = plan_arena([self.lifetimes[s] for s in mine])
        for s, offset in zip(mine, arena.offsets): slots[s].offset = offset
    self.allocated_bytes = self.bytes_to_allocate()   # what binding the memory below allocates, per device
    self.check_memory()   # an OutOfMemoryError here comes before any allocation or launch
    self._bind_memory(constants)
    self.state_buffers = {id(slot.buffer) for slot in slots if slot.kind == STATE}
    self.written_state = [slot.buffer for slot in slots if slot.kind == STATE and slot.buffer is not None]
    self.written_slots = sorted({s for ins in instructions for s in ins.args[:ins.output_count]})   # Buffer.version
    # symbolic variables: the values last run, and which instructions take which
    self.var_vals: dict[str, int] = {k: v for ins in instructions for k, v in ins.var_vals.items()}
    self.users_of_variable: dict[str, list[Instruction]] = {}
    for ins in instructions:
      for name in ins.var_vals: self.users_of_variable.setdefault(name, []).append(ins)
    self.runners: list[GraphRunner] = [graph_runner_class(device)(device, run, slots)
                                       for device, run in device_runs(instructions)]

  # ---- memory
  def memory_breakdown(self) -> dict[str, dict[str, int]]:
    """Per device, bytes of weights, state, activations (the arena when planned, else their sum), inputs, and
    `activations unplanned` (every activation's size added up, what the arena is compared with)."""
    out: dict[str, dict[str, int]] = {}
    for slot in self.slots:
      parts = out.setdefault(slot.device, {**{kind: 0 for kind in SLOT_KINDS}, "activations unplanned": 0})
      if slot.kind == ACTIVATION: parts["activations unplanned"] += slot.nbytes
      else: parts[slot.kind] += slot.nbytes
    for device, parts in out.items():
      planned = self.arena_plans.get(device)
      parts[ACTIVATION] = planned.size if planned is not None else parts["activations unplanned"]
    return out

  def estimate_memory(self, symbolic: bool = False) -> dict[str, Any]:
    """Bytes per device that the program touches: weights + state + activations + inputs (see memory_breakdown),
    with symbolic buffers at their maximum. With `symbolic=True`, each device's bytes as a sympy expression in the
    symbolic variables (`.subs(n, 100)` evaluates it): every buffer at its symbolic size, activations as their
    largest live total (memory_planner.symbolic_peak); the arena itself is allocated once, at the maximum."""
    if symbolic: return self._symbolic_memory()
    return {device: sum(parts[kind] for kind in SLOT_KINDS) for device, parts in self.memory_breakdown().items()}

  def _symbolic_memory(self) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for device in dict.fromkeys(slot.device for slot in self.slots):
      fixed = sum((slot.symbolic_nbytes() for slot in self.slots if slot.device == device and slot.kind != ACTIVATION),
                  to_sympy(0))
      transients = [s for s, slot in enumerate(self.slots) if slot.device == device and slot.kind == ACTIVATION]
      out[device] = fixed + symbolic_peak([self.lifetimes[s] for s in transients],
                                          [self.slots[s].symbolic_nbytes() for s in transients])
    return out

  def bytes_to_allocate(self) -> dict[str, int]:
    """Bytes per device not allocated yet: the arena (or each activation), and persistent buffers still unallocated."""
    out: dict[str, int] = {}
    for device, arena in self.arena_plans.items(): out[device] = out.get(device, 0) + arena.size
    for slot in self.slots:
      unplanned = slot.kind == ACTIVATION and slot.offset is None
      unallocated = slot.kind in (WEIGHT, STATE) and (slot.buffer is None or not slot.buffer.is_allocated)
      if unplanned or unallocated: out[slot.device] = out.get(slot.device, 0) + slot.nbytes
    return out

  def check_memory(self) -> None:
    """Raise OutOfMemoryError (naming the device, the bytes needed and the bytes available) if a device can't give
    what this graph still has to allocate."""
    for device, needed in self.allocated_bytes.items():
      if needed and needed > (available := Device[device].available_memory()):
        raise OutOfMemoryError(device, needed, available, "a TinyJit's compiled graph")

  def _bind_memory(self, constants: Sequence[tuple[int, np.ndarray]]) -> None:
    for device, arena in self.arena_plans.items():
      self.arenas[device] = Buffer(device, arena.size, dtypes.uint8)
    for slot in self.slots:
      if slot.kind == ACTIVATION:   # a view of the arena, or (planning off) an allocation of its own
        slot.buffer = Buffer(slot.device, slot.size, slot.dtype, self.arenas.get(slot.device), slot.offset or 0)
      elif slot.kind in (WEIGHT, STATE) and slot.buffer is None:   # a constant whose buffer the call did not keep
        slot.buffer = Buffer(slot.device, slot.size, slot.dtype)
      if slot.buffer is not None: _ = slot.buffer.handle   # allocate now, not in the middle of a replay
    for s, data in constants: self.slots[s].buffer.copyin(data)   # type: ignore[union-attr]

  # ---- running
  def __call__(self, inputs: Sequence[Buffer], var_vals: Optional[dict[str, int]] = None) -> None:
    """Run the program on these input Buffers (one per input slot, in order) and symbolic variable values (a
    variable not given keeps its last value)."""
    if is_capturing(): raise JitError("a TinyJit replayed while another TinyJit captures: jitted functions can't nest")
    if var_vals: self._set_variables(var_vals)
    changed = []
    for s, buffer in zip(self.input_slots, inputs):
      if self.slots[s].buffer is not buffer:
        if id(buffer) in self.state_buffers:
          raise JitError(f"TinyJit: argument {self.slots[s].name!r} is a buffer the compiled program writes (one it "
                         "returned, or its state): pass a copy (e.g. `x + 0`)")
        self.slots[s].buffer = buffer
        changed.append(s)
    keep_old_values_of(self.written_state)   # values built before this call that read state keep its old data
    for runner in self.runners:
      if changed: runner.bind(changed)
    # every runner is ready before the first launches: once one device's part of a collective is queued, it waits for
    # its peers, so nothing may stand between the launches of the devices' runs (building a CUDA graph loads modules
    # and allocates, work the host should not do while a peer spins in that collective)
    for runner in self.runners: runner.prepare()
    if Context.DEBUG >= 2: self._run_one_by_one()
    elif profiler.ENABLED: self._run_traced()
    else:
      for runner in self.runners: runner()
    for s in self.written_slots: self.slots[s].buffer.wrote()   # type: ignore[union-attr]

  def _set_variables(self, var_vals: dict[str, int]) -> None:
    changed = {name: value for name, value in var_vals.items()
               if name in self.var_vals and self.var_vals[name] != value}
    if not changed: return
    self.var_vals.update(changed)
    touched = {id(ins): ins for name in changed for ins in self.users_of_variable[name]}
    for ins in touched.values(): ins.var_vals.update({k: v for k, v in changed.items() if k in ins.var_vals})
    for runner in self.runners: runner.rebind_variables(list(touched.values()))

  def _run_traced(self) -> None:
    """The profiler records: the same launches in the same order, one by one, each timed on its device (so a replay
    shows every kernel; on CUDA this is not the CUDA graph's launch, whose kernels can't be timed one by one)."""
    with profiler.phase("JIT replay", instructions=len(self.instructions)):
      run_traced([ExecItem(ins.runner, [self.slots[s].buffer for s in ins.args], ins.var_vals, ins.output_count)
                  for ins in self.instructions], "jit replay")

  def _run_one_by_one(self) -> None:
    for i, ins in enumerate(self.instructions):
      elapsed = ins.runner([self.slots[s].buffer for s in ins.args], True, ins.var_vals) or 0.0
      print(f"*** jit {i:4d} {ins.name:40s} {ins.launch_dims:40s} {elapsed*1e6:9.1f} us")

  # ---- printing
  def describe_arg(self, s: int) -> str:
    slot = self.slots[s]
    name = f"{INPUT}:{slot.name}" if slot.kind == INPUT else slot.kind
    return f"{name}#{s}@{slot.offset or 0}+{slot.nbytes}"

  def __str__(self) -> str:
    lines = [f"CompiledGraph: {len(self.instructions)} instructions, {len(self.slots)} buffers, memory planning "
             f"{'on' if self.planned else 'off'}"]
    for device, parts in self.memory_breakdown().items():
      lines.append(f"  {device}: " + ", ".join(f"{kind} {nbytes} B" for kind, nbytes in parts.items()))
    for i, ins in enumerate(self.instructions):
      lines.append(f"{i:4d} {ins.name:36s} {ins.launch_dims:34s} " + " ".join(self.describe_arg(s) for s in ins.args))
    return "\n".join(lines)
  __repr__ = __str__

def graph_from_capture(items: list[ExecItem], inputs: Sequence[tuple[str, Buffer]], first_new_serial: int,
                       plan: bool = True) -> CompiledGraph:
  """A CompiledGraph from captured ExecItems. `inputs` are the (argument name, Buffer) of the call; Buffers made
  after `first_new_serial` were made by the captured call. `items` is emptied: a new Buffer that only the program
  referenced dies (it is an activation), one still referenced elsewhere survives (it is state). A host copy that is
  the first use of the only writer of its buffer is a constant: copied once, at construction, not per call."""
  slots = [Slot(INPUT, buffer.device, buffer.size, buffer.dtype, name, symbolic_size=buffer.symbolic_size)
           for name, buffer in inputs]
  instructions, persistent, new = _instructions_of(items, slots, {id(b): s for s, (_, b) in enumerate(inputs)},
                                                   first_new_serial)
  items.clear()
  gc.collect()   # buffers in reference cycles die now, not later
  for s, ref in new.items():
    if (buffer := ref()) is not None: persistent[s] = buffer
    else: slots[s].kind = ACTIVATION
  written = {s for ins in instructions for s in ins.args[:ins.output_count]}
  for s, buffer in persistent.items(): slots[s].kind, slots[s].buffer = (STATE if s in written else WEIGHT), buffer
  instructions = [_kept_only_from_weights(ins, slots) for ins in instructions]
  writers = [0] * len(slots)
  for ins in instructions:
    for s in ins.args[:ins.output_count]: writers[s] += 1
  first_use = {s: i for i in reversed(range(len(instructions))) for s in instructions[i].args}
  constants, kept = [], []
  for i, ins in enumerate(instructions):
    target = ins.args[0]
    if isinstance(ins.runner, HostCopy) and writers[target] == 1 and first_use[target] == i and \
       slots[target].kind != INPUT:
      slots[target].kind = WEIGHT
      constants.append((target, ins.runner.data))
    else: kept.append(ins)
  return CompiledGraph(kept, slots, list(range(len(inputs))), plan, constants)

def _kept_only_from_weights(ins: Instruction, slots: list[Slot]) -> Instruction:
  """A kept copy (tgrad/kept_copies.py: it runs only when its sources' write counts changed) stays kept in the graph
  only when every source is a weight: the program never writes it, so its count changes only between replays. A
  source the program writes is counted at the end of a replay, after the copy would have read it; an input is
  another Buffer per call. Those copy every time."""
  if not isinstance(ins.runner, KeptCopy) or all(slots[s].kind == WEIGHT for s in ins.args[ins.output_count:]):
    return ins
  return replace(ins, runner=ins.runner.kernel)

def _instructions_of(items: list[ExecItem], slots: list[Slot], slot_of: dict[int, int], first_new_serial: int
                     ) -> tuple[list[Instruction], dict[int, Buffer], dict[int, weakref.ref]]:
  """Instructions over slots (appending a slot per new Buffer), the Buffers that existed before the capture, and
  weak references to those made by it (kept weak, so that the ones no one else holds can die)."""
  persistent: dict[int, Buffer] = {}
  new: dict[int, weakref.ref] = {}
  instructions = []
  for item in items:
    for buffer in item.bufs:
      if id(buffer) not in slot_of:
        slot_of[id(buffer)] = len(slots)
        if buffer.serial > first_new_serial: new[len(slots)] = weakref.ref(buffer)
        else: persistent[len(slots)] = buffer
        slots.append(Slot(STATE, buffer.device, buffer.size, buffer.dtype, symbolic_size=buffer.symbolic_size))
    args = tuple(slot_of[id(buffer)] for buffer in item.bufs)
    instructions.append(Instruction(item.runner, args, item.bufs[0].device, item.output_count, dict(item.var_vals),
                                    tuple(dict.fromkeys(buffer.device for buffer in item.bufs))))
  return instructions, persistent, new

# ---------------------------------------------------------------------------------------------------------------
# TinyJit

@dataclass(frozen=True)
class InputSpec:
  """What a Tensor argument was at capture: every later call must pass the same."""
  name: str
  shape: tuple[int, ...]
  dtype: DType
  device: str
  st: ShapeTracker
  buffer_size: int
  @staticmethod
  def of(name: str, t: Tensor) -> InputSpec:   # symbolic sizes by their variables: any value in range matches
    st = t.lazydata.st.unbind()[0]
    return InputSpec(name, st.shape, t.dtype, t.device, st, t.lazydata.base.buffer.size)
  def check(self, name: str, t: Tensor) -> None:
    problems = []
    st = t.lazydata.st.unbind()[0]
    if st.shape != self.shape: problems.append(f"shape {t.shape} (captured {self.shape})")
    if t.dtype != self.dtype: problems.append(f"dtype {t.dtype} (captured {self.dtype})")
    if t.device != self.device: problems.append(f"device {t.device} (captured {self.device})")
    if not problems and (st != self.st or t.lazydata.base.buffer.size != self.buffer_size):
      problems.append(f"view {_describe_view(st, t.lazydata.base.buffer.size)} (captured "
                      f"{_describe_view(self.st, self.buffer_size)})")
    if problems:
      raise JitError(f"TinyJit: argument {name!r} differs from the capture: {'; '.join(problems)}. Pass tensors like "
                     "the captured ones, or call .reset() to capture again")

def _describe_view(st: ShapeTracker, buffer_size: int) -> str:
  if st.contiguous: return f"contiguous over a buffer of {buffer_size} elements"
  return f"{st.views} over a buffer of {buffer_size} elements"

class TinyJit:
  """`TinyJit(fn)` or `@TinyJit`: call 1 runs `fn` normally; call 2 captures the kernels it runs (realize records them
  instead of launching) into a CompiledGraph (`.captured`) and runs that; later calls only replay the graph with the
  new Tensor arguments' buffers swapped in, without calling `fn`.

  - Inputs are the Tensor arguments (positional and keyword); they are realized first. Each later call must pass
    Tensors of the captured shape, dtype, device and view, and equal non-Tensor arguments, else JitError names the
    argument. Two arguments may not share a buffer.
  - Outputs: the returned value is the capture call's, returned again by every replay; its tensors' buffers are the
    program's and are rewritten by each call (they alias the JIT's memory: copy what you want to keep, e.g.
    `out.numpy()`). Returned tensors are detached from autograd.
  - Everything else `fn` does in Python (counters, host arrays turned into tensors, reading values) happens only at
    capture: host data is baked into the program, and `.numpy()`/`.item()` inside `fn` raise JitError at capture.
    Device state the kernels update (assigned buffers, Tensor.rand's counter) does change every call.
  - `reset()` forgets the capture. JIT_PLAN=0 turns memory planning off (see docs/jit.md)."""
  def __init__(self, fn: Callable):
    if not callable(fn): raise TypeError(f"TinyJit needs a callable, got {type(fn).__name__}")
    self.fn = fn
    try: self.signature: Optional[inspect.Signature] = inspect.signature(fn)
    except (TypeError, ValueError): self.signature = None   # a builtin without one: arguments are named by position
    functools.update_wrapper(self, fn)
    self.reset()

  def reset(self) -> None:
    """Forget the capture: the next call runs the function normally, the one after captures again."""
    self.calls = 0
    self.captured: Optional[CompiledGraph] = None
    self._inputs: list[InputSpec] = []
    self._others: list[tuple[str, Any]] = []
    self._ret: Any = None

  def __get__(self, obj, objtype=None):   # a jitted method: `self` becomes an argument (checked like the others)
    return self if obj is None else functools.partial(self.__call__, obj)

  def __call__(self, *args, **kwargs):
    named = _named_arguments(self.signature, args, kwargs)
    tensors = _per_shard([(name, value) for name, value in named if isinstance(value, Tensor)])
    others = [(name, value) for name, value in named if not isinstance(value, Tensor)]
    for name, value in others:
      if _tensors_in(value):
        raise JitError(f"TinyJit: argument {name!r} holds Tensors inside a {type(value).__name__}: pass each Tensor "
                       "as an argument of its own")
    if is_capturing(): raise JitError("a TinyJit called while another TinyJit captures: jitted functions can't nest")
    pending = [t for _, t in tensors if t.lazydata.base.buffer is None]
    if pending: Tensor.realize(*pending)
    input_buffers = _input_buffers(tensors)   # every call: two arguments sharing a buffer can't be told apart
    if self.captured is not None: return self._replay(tensors, input_buffers, others)
    self.calls += 1
    if self.calls == 1:
      ret = self.fn(*args, **kwargs)
      if (outputs := _tensors_in(ret)): Tensor.realize(*outputs)
      return ret
    return self._capture(args, kwargs, tensors, input_buffers, others)

  def _capture(self, args, kwargs, tensors: list[tuple[str, Tensor]], input_buffers: list[Buffer],
               others: list[tuple[str, Any]]):
    specs = [InputSpec.of(name, t) for name, t in tensors]
    first_new_serial, start = newest_buffer_serial(), profiler.now()
    capture = None
    try:
      with capturing() as capture:
        ret = self.fn(*args, **kwargs)
        outputs = _tensors_in(ret)
        if outputs: Tensor.realize(*outputs)
      items = capture.items
      if not items:
        raise JitError("TinyJit: the function ran no kernel when it was captured (its second call), so there is "
                       "nothing to replay; realize its results inside it, or don't jit it")
      taken = {id(b): name for (name, _), b in zip(tensors, input_buffers)}
      for _, t in _per_shard([("", t) for t in outputs]):
        if id(t.lazydata.base.buffer) in taken:
          raise JitError(f"TinyJit: the function returns its argument {taken[id(t.lazydata.base.buffer)]!r} (or a "
                         "view of it); return a computed tensor (e.g. `x + 0`)")
    except BaseException:
      if capture is not None: run(capture.items)   # what was scheduled gets computed: no value is left unwritten
      raise
    for t in outputs: t._ctx = None   # the graph behind them belongs to the capture call, not to any replay
    self._inputs, self._others, self._ret = specs, others, ret
    plan = Context.JIT_PLAN
    if plan not in (0, 1): raise ValueError(f"JIT_PLAN must be 0 or 1, got {plan}")
    del capture, outputs
    graph = graph_from_capture(items, [(name, b) for (name, _), b in zip(tensors, input_buffers)], first_new_serial,
                               bool(plan))
    graph(input_buffers)
    self.captured = graph
    if profiler.ENABLED: profiler.span("JIT capture", start, instructions=len(graph.instructions))
    return ret

  def _replay(self, tensors: list[tuple[str, Tensor]], input_buffers: list[Buffer], others: list[tuple[str, Any]]):
    names, captured_names = [name for name, _ in tensors], [spec.name for spec in self._inputs]
    if names != captured_names:
      raise JitError(f"TinyJit: called with Tensor arguments {names}, captured with {captured_names}")
    for (name, t), spec in zip(tensors, self._inputs): spec.check(name, t)
    if [name for name, _ in others] != [name for name, _ in self._others]:
      raise JitError(f"TinyJit: called with non-Tensor arguments {[n for n, _ in others]}, captured with "
                     f"{[n for n, _ in self._others]}")
    for (name, value), (_, captured) in zip(others, self._others):
      if not _same_argument(value, captured):
        raise JitError(f"TinyJit: argument {name!r} is {_shown(value)} in this call but was {_shown(captured)} when "
                       "captured: non-Tensor arguments are baked into the capture. Pass it as a Tensor, or call "
                       ".reset() to capture again")
    assert self.captured is not None
    if not symbolic_in_use():
      self.captured(input_buffers)
      return self._ret
    var_vals = _variable_values(tensors, others)
    self.captured(input_buffers, var_vals)
    return _rebound(self._ret, var_vals) if var_vals else self._ret

def _named_arguments(signature: Optional[inspect.Signature], args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
  """(name, value) of every argument: parameter names where the signature binds, `args[i]` for *args."""
  try:
    if signature is None: raise TypeError("no signature")
    bound = signature.bind(*args, **kwargs)
  except TypeError: return [(f"argument {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
  out: list[tuple[str, Any]] = []
  for name, value in bound.arguments.items():
    kind = bound.signature.parameters[name].kind
    if kind is inspect.Parameter.VAR_POSITIONAL: out.extend((f"{name}[{i}]", v) for i, v in enumerate(value))
    elif kind is inspect.Parameter.VAR_KEYWORD: out.extend(value.items())
    else: out.append((name, value))
  return out

def _per_shard(tensors: list[tuple[str, Tensor]]) -> list[tuple[str, Tensor]]:
  """The (name, tensor) arguments with each sharded tensor (tgrad/multi/) as one tensor per device, named
  'name@DEVICE': the capture binds, checks and swaps each shard's buffer as an argument of its own."""
  out: list[tuple[str, Tensor]] = []
  for name, t in tensors:
    lb = t.lazydata
    if isinstance(lb, MultiLazyBuffer): out.extend((f"{name}@{s.device}", Tensor(s, requires_grad=False))
                                                   for s in lb.shards)
    else: out.append((name, t))
  return out

def _tensors_in(value: Any) -> list[Tensor]:
  """The Tensors in a value: itself, or inside (nested) lists, tuples and dict values; each once, in order."""
  found: dict[int, Tensor] = {}
  stack = [value]
  while stack:
    v = stack.pop()
    if isinstance(v, Tensor): found.setdefault(id(v), v)
    elif isinstance(v, (list, tuple)): stack.extend(reversed(v))
    elif isinstance(v, dict): stack.extend(reversed(list(v.values())))
  return list(found.values())

def _input_buffers(tensors: list[tuple[str, Tensor]]) -> list[Buffer]:
  buffers, seen = [], {}
  for name, t in tensors:
    buffer = t.lazydata.base.buffer
    if id(buffer) in seen:
      raise JitError(f"TinyJit: arguments {seen[id(buffer)]!r} and {name!r} are the same tensor (or views of one "
                     "buffer): the captured program could not tell them apart later. Pass distinct tensors")
    seen[id(buffer)] = name
    buffers.append(buffer)
  return buffers

def _variable_values(tensors: list[tuple[str, Tensor]], others: list[tuple[str, Any]]) -> dict[str, int]:
  """The symbolic variables' values a call brings: in its Tensor arguments' views, and bound Variable arguments."""
  values: dict[str, int] = {}
  for _, t in tensors: values.update(t.lazydata.st.unbind()[1])
  for _, value in others:
    if isinstance(value, UOp) and value.op is Ops.BIND:
      variable, bound = value.unbind()
      values[variable.arg[0]] = bound
  return values

def _rebound(value: Any, var_vals: dict[str, int]) -> Any:
  """The returned value with each symbolic Tensor's shape bound to this call's values (same buffers)."""
  if isinstance(value, Tensor):
    lb = value.lazydata
    if isinstance(lb, MultiLazyBuffer):   # a sharded value: each device's shard bound alike
      return Tensor(MultiLazyBuffer([_rebound(Tensor(s), var_vals).lazydata for s in lb.shards], lb.axis))
    if not lb.st.symbolic or lb.base.buffer is None: return value
    base = LazyBuffer.from_buffer(lb.base.buffer, lb.base.st.bind(var_vals).shape)
    return Tensor(base if lb.is_base else LazyBuffer(lb.device, lb.st.bind(var_vals), lb.dtype, base=base))
  if isinstance(value, (list, tuple)): return type(value)(_rebound(v, var_vals) for v in value)
  if isinstance(value, dict): return {k: _rebound(v, var_vals) for k, v in value.items()}
  return value

def _same_argument(a: Any, b: Any) -> bool:
  if a is b: return True
  if isinstance(a, UOp) and isinstance(b, UOp) and a.op is b.op is Ops.BIND: return a.src[0] is b.src[0]   # any value
  if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
    return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
  try: return type(a) is type(b) and bool(a == b)
  except Exception: return False   # values that can't be compared count as different

def _shown(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= SHOWN_VALUE_CHARS else text[:SHOWN_VALUE_CHARS] + "..."
