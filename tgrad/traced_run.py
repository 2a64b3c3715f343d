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
    for item in exec_items: item.runner(item.bufs, False, item.var_vals)
    return
  if not _exit_hook_registered:   # registered after the devices' own exit hooks, so it runs before they close
    atexit.register(_resolve_all)
    profiler._pending_resolvers.append(lambda _trace: _resolve_all())
    _exit_hook_registered = True
  for item in exec_items:
    runner, device = item.runner, item.bufs[0].device
    dev = Device[device]
    _origin(trace, device)
    start = dev.profile_mark()
    runner(item.bufs, False, item.var_vals)
    end = dev.profile_mark()
    record = profiler.kernel_record(runner) if isinstance(runner, CompiledKernel) else None
    _pending.append((trace, device, start, end, runner.name, category, _arguments(item), record))
  if len(_pending) > MAX_PENDING_MARKS: _resolve(len(_pending) // 2)
  elif _pending and isinstance(_pending[-1][3], float): _resolve(len(_pending))   # host clocks: nothing to wait for

def _arguments(item: Any) -> dict:
  runner, out = item.runner, item.bufs[0]
  args: dict[str, Any] = {"out": f"{out.size} x {out.dtype}"}
  if isinstance(runner, CompiledKernel):
    flops, nbytes = runner.cost(item.var_vals)
    global_size, local_size = runner.launch_dims(item.var_vals)
    args.update(global_size=list(global_size), local_size=list(local_size), opts=[str(o) for o in runner.opts],
                flops=flops, bytes=nbytes)
    if item.var_vals: args["variables"] = dict(item.var_vals)
  else: args.update(flops=runner.flops, bytes=runner.nbytes)
  return args

def _resolve(count: int) -> None:
  """Turn the oldest `count` pending launches into trace events (waiting for their end marks)."""
  done, _pending[:count] = _pending[:count], []
  for trace, device, start, end, name, category, args, record in done:
    origin_mark, origin_host = _origin(trace, device)
    dev = Device[device]
    begin = origin_host + dev.profile_elapsed(origin_mark, start)
    seconds = dev.profile_elapsed(start, end)
    if seconds > 0:
      args["GB/s"] = round(args["bytes"] / seconds / 1e9, 3)
      args["GFLOP/s"] = round(args["flops"] / seconds / 1e9, 3)
    if record is not None:
      args["kernel_id"] = record.kernel_id
      record.calls += 1
      record.seconds += seconds
      record.flops, record.nbytes = args["flops"], args["bytes"]
    event = {"name": name, "cat": category, "ph": "X", "ts": begin, "dur": seconds,
             "pid": trace.pid_of(device), "tid": profiler.COPY_TID if name in profiler.COPY_NAMES else
             profiler.KERNEL_TID, "args": args}
    profiler.add_event(trace, event)

def _resolve_all() -> None:
  if _pending: _resolve(len(_pending))
  _origins.clear()
