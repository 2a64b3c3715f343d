"""The run loop while the profiler records: each launch of a lowered schedule with its start and end on its device.

Input: ExecItems (or anything with `runner`, `bufs`, `var_vals`), launched in order exactly as `realize.run` launches
them, so results are the same. Output: one trace event per launch on its device's track (tgrad/profiler.py), with
the kernel's name, launch sizes, opts, FLOPs, bytes and achieved GB/s as arguments. Clocks: each device marks a point
in its queue (`Compiled.profile_mark`): LLVM's launches return when done, so a mark is the host clock and a launch's
span is the host time around the call; CUDA records an event in the stream before and after the launch and nothing
waits for them until they are read: when the trace stops, at exit, or when MAX_PENDING_MARKS are in flight. Device
times become host times through an origin: a mark made right after a synchronize, when the host clock is read too.
"""
from __future__ import annotations
import atexit
from typing import Any, Sequence
from tgrad import profiler
from tgrad.codegen.compile import CompiledKernel
from tgrad.device import Device

# Launches whose device marks are not read yet, at most this many: then the oldest half is read (waiting for them).
MAX_PENDING_MARKS = 4096

_origins: dict[tuple[int, str], tuple[Any, float]] = {}   # (trace serial, device) → (origin mark, host seconds)
_pending: list[tuple] = []   # (trace, device, start mark, end mark, name, category, args, record)
_exit_hook_registered = False

def _origin(trace: profiler.Trace, device: str) -> tuple[Any, float]:
  if (origin := _origins.get((trace.serial, device))) is None:
    dev = Device[device]
    dev.synchronize()
    mark = dev.profile_mark()
    dev.profile_elapsed(mark, mark)   # waits until the mark is reached
    origin = _origins[(trace.serial, device)] = (mark, profiler.now())
  return origin

def run_traced(exec_items: Sequence[Any], category: str = "kernel") -> None:
  """Launch the items in order, recording each on its device's track (`category`: "kernel", or "jit replay")."""
  global _exit_hook_registered
  trace = profiler.current()
  if trace is None:
    for item in exec_items:
      item.runner(item.bufs, False, item.var_vals)
      item.wrote()
    return
  if not _exit_hook_registered:   # registered after the devices' own exit hooks, so it runs before they close
    atexit.register(_resolve_all)
    profiler._pending_resolvers.append(lambda _trace: _resolve_all())
    _exit_hook_registered = True
  dev, device = None, None
  for item in exec_items:
    runner, out = item.runner, item.bufs[0]
    if out.device != device:
      device, dev = out.device, Device[out.device]
      _origin(trace, device)
    start = dev.profile_mark()
    runner(item.bufs, False, item.var_vals)
    item.wrote()
    end = dev.profile_mark()
    record = profiler.kernel_record(runner) if isinstance(runner, CompiledKernel) else None
    var_vals = dict(item.var_vals) if item.var_vals else None   # a replay's values change in place between calls
    _pending.append((trace, device, start, end, runner.name, category, (runner, var_vals, out), record))
  if len(_pending) > MAX_PENDING_MARKS: _resolve(len(_pending) // 2)
  elif _pending and isinstance(_pending[-1][3], float): _resolve(len(_pending))   # host clocks: nothing to wait for

class _Arguments:
  """A launch's event arguments, worked out when the trace is written (a symbolic kernel's cost is an expression to
  evaluate: tens of microseconds that would otherwise be spent between launches)."""
  __slots__ = ("runner", "var_vals", "out", "seconds", "kernel_id")
  def __init__(self, runner: Any, var_vals: Any, out: Any, seconds: float, kernel_id: Any):
    self.runner, self.var_vals, self.out, self.seconds, self.kernel_id = runner, var_vals, out, seconds, kernel_id
  def __call__(self) -> dict:
    runner, out = self.runner, self.out
    args: dict[str, Any] = {"out": f"{out.size} x {out.dtype}"}
    if isinstance(runner, CompiledKernel):
      flops, nbytes = runner.cost(self.var_vals)
      global_size, local_size = runner.launch_dims(self.var_vals)
      args.update(global_size=list(global_size), local_size=list(local_size), opts=[str(o) for o in runner.opts],
                  flops=flops, bytes=nbytes, kernel_id=self.kernel_id)
      if self.var_vals: args["variables"] = self.var_vals
    else: args.update(flops=runner.flops, bytes=runner.nbytes)
    if self.seconds > 0:
      args["GB/s"] = round(args["bytes"] / self.seconds / 1e9, 3)
      args["GFLOP/s"] = round(args["flops"] / self.seconds / 1e9, 3)
    return args

def _resolve(count: int) -> None:
  """Turn the oldest `count` pending launches into trace events (waiting for their end marks)."""
  done, _pending[:count] = _pending[:count], []
  for trace, device, start, end, name, category, (runner, var_vals, out), record in done:
    origin_mark, origin_host = _origin(trace, device)
    dev = Device[device]
    begin = origin_host + dev.profile_elapsed(origin_mark, start)
    seconds = dev.profile_elapsed(start, end)
    args = _Arguments(runner, var_vals, out, seconds, record.kernel_id if record is not None else None)
    if record is not None:
      record.calls += 1
      record.seconds += seconds
    event = {"name": name, "cat": category, "ph": "X", "ts": begin, "dur": seconds,
             "pid": trace.pid_of(device), "tid": profiler.COPY_TID if name in profiler.COPY_NAMES else
             profiler.KERNEL_TID, "args": args}
    profiler.add_event(trace, event)

def _resolve_all() -> None:
  if _pending: _resolve(len(_pending))
  _origins.clear()
