"""The trace profiler: what tgrad did and when, as Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing).

Input: calls from the layers that do the work — realize (graph building, scheduling, lowering, launching, waiting),
codegen (opts, BEAM search, compiling), the device layer (memory in use), the run loop (every kernel and copy with its
start and end on its device's own clock) and TinyJit (capture and replays). Output: `Trace.to_json()`, one duration
event ("ph": "X") per host phase and device launch, one counter event ("ph": "C") per change of memory in use, and
metadata events naming the tracks. Every call site is written `if profiler.ENABLED: ...`: with the profiler off a
call site costs one module attribute read and nothing else.

    with tgrad.profile("trace.json"):      # or run a script with PROFILE=trace.json
      model.generate(...)

`RECORDING` keeps, beside the trace, each compiled kernel's source, UOps and opts for the viz page (tgrad/viz).
`graph_observer` is the hook tgrad/viz installs for GRAPH=1 (this module imports nothing from tgrad but helpers).
"""
from __future__ import annotations
import atexit, contextlib, json, os, sys, threading, time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

ENABLED = False     # a trace is being recorded: call sites check this and do nothing else when it is False
RECORDING = False   # compiled kernels are kept (source, UOps, opts) for the viz page; on whenever ENABLED is
# GRAPH=1: called with the LazyBuffers of every realize before scheduling; returns a callable that takes the
# ScheduleItems once they are made (tgrad/viz/graph.py installs it). None: no pictures.
graph_observer: Optional[Callable[[tuple], Callable[[list], None]]] = None

HOST_PID, FIRST_DEVICE_PID = 1, 2
MAIN_THREAD_TID = 1
KERNEL_TID, COPY_TID = 1, 2
# Gaps between realizes shorter than this are not drawn as "graph building": they are only the call overhead between
# two back-to-back realizes, and a decode loop would get thousands of empty-looking slivers.
MIN_GRAPH_BUILDING_SECONDS = 20e-6
COPY_NAMES = frozenset({"copy", "copyin", "copyout"})

def python_calls_per_call(call: Callable[[], Any], times: int) -> float:
  """How many Python functions one `call()` runs, on average over `times` calls (sys.setprofile's count of Python
  call events, less `call` itself): a deterministic measure of a host path's length, unlike its time."""
  calls = 0
  def count(frame, event, arg):
    nonlocal calls
    if event == "call": calls += 1
  previous = sys.getprofile()
  sys.setprofile(count)
  try:
    for _ in range(times): call()
  finally: sys.setprofile(previous)
  return (calls - times) / times

def now() -> float:
  """Host clock, seconds (the clock every event's timestamp is on)."""
  return time.perf_counter()

@dataclass
class KernelRecord:
  """What the viz page shows of one compiled kernel: where it runs, its source, UOps and opts, and its cost."""
  kernel_id: int
  name: str
  device: str
  src: str = ""
  uops: str = ""          # one line per UOp, empty when it was compiled before recording started
  opts: str = ""
  global_size: str = ""
  local_size: str = ""
  flops: int = 0          # per launch (a symbolic kernel: at its variables' maximum)
  nbytes: int = 0
  calls: int = 0
  seconds: float = 0.0    # summed over every timed launch

@dataclass
class Trace:
  """The events of one recording. Timestamps are host-clock seconds; `to_json` makes them microseconds from `origin`."""
  origin: float = field(default_factory=now)
  serial: int = 0          # numbers the traces of a process (a Buffer remembers the serial it was counted in)
  events: list[dict] = field(default_factory=list)
  devices: dict[str, int] = field(default_factory=dict)   # device name → its pid in the trace
  kernels: dict[int, KernelRecord] = field(default_factory=dict)   # id(runner) → its record
  memory: dict[str, int] = field(default_factory=dict)     # device → bytes in use, as this trace has seen it
  last_realize_end: Optional[float] = None

  def pid_of(self, device: str) -> int:
    if (pid := self.devices.get(device)) is None: pid = self.devices[device] = FIRST_DEVICE_PID + len(self.devices)
    return pid

  def to_json(self) -> dict:
    """The trace in the JSON Object Format of the trace-event spec: metadata naming the tracks, then the events."""
    meta = [_metadata("process_name", HOST_PID, 0, "tgrad host"), _metadata("thread_name", HOST_PID, MAIN_THREAD_TID,
                                                                             "main thread")]
    for device, pid in self.devices.items():
      meta += [_metadata("process_name", pid, 0, f"device {device}"),
               _metadata("thread_name", pid, KERNEL_TID, "kernels"), _metadata("thread_name", pid, COPY_TID, "copies")]
    events = []
    for event in self.events:
      out = dict(event)
      out["ts"] = round((event["ts"] - self.origin) * 1e6, 3)
      if "dur" in event: out["dur"] = round(max(event["dur"], 0.0) * 1e6, 3)
      if callable(args := event.get("args")): out["args"] = args()   # worked out now, not between launches
      events.append(out)
    return {"traceEvents": meta + events, "displayTimeUnit": "ns",
            "otherData": {"producer": "tgrad", "clock": "host perf_counter; CUDA events mapped onto it"}}

def _metadata(name: str, pid: int, tid: int, value: str) -> dict:
  return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {"name": value}}

_trace: Optional[Trace] = None
_traces_started = 0
_lock = threading.Lock()   # events may come from the compile workers' callbacks or a BEAM timing thread

def current() -> Optional[Trace]:
  """The trace being recorded (None when the profiler is off)."""
  return _trace

# ---- what the call sites record

def span(name: str, start: float, category: str = "host", **args: Any) -> float:
  """A host phase from `start` (a `now()` reading) to now on the main thread's track; returns now, the start of the
  next phase."""
  end = now()
  if (trace := _trace) is not None:
    event = {"name": name, "cat": category, "ph": "X", "ts": start, "dur": end - start, "pid": HOST_PID,
             "tid": MAIN_THREAD_TID}
    if args: event["args"] = args
    with _lock: trace.events.append(event)
  return end

@contextlib.contextmanager
def phase(name: str, category: str = "host", **args: Any) -> Iterator[None]:
  """`with profiler.phase("BEAM search"):` — a span around a block (for call sites inside `if profiler.ENABLED`)."""
  start = now()
  try: yield
  finally: span(name, start, category, **args)

def realize_started() -> float:
  """At the start of a realize: the host time since the last realize ended is drawn as graph building (the user's
  code building the lazy graph, and anything else it did on the host). Returns now."""
  start = now()
  if (trace := _trace) is not None:
    since = trace.last_realize_end if trace.last_realize_end is not None else trace.origin
    if start - since >= MIN_GRAPH_BUILDING_SECONDS:
      with _lock:
        trace.events.append({"name": "graph building", "cat": "host", "ph": "X", "ts": since, "dur": start - since,
                             "pid": HOST_PID, "tid": MAIN_THREAD_TID})
  return start

def realize_ended(end: Optional[float] = None) -> None:
  """At the end of a realize (`end`: the clock reading then, if the caller has one)."""
  if (trace := _trace) is not None: trace.last_realize_end = now() if end is None else end

def add_event(trace: Trace, event: dict) -> None:
  """Append a finished event (timestamps in host-clock seconds) to `trace`."""
  with _lock: trace.events.append(event)

def buffer_allocated(buffer: Any) -> None:
  """A Buffer got its memory: the "memory in use" counter of its device goes up (it counts the buffers allocated
  while this trace records; those made before it started are not counted, in or out)."""
  if (trace := _trace) is None: return
  buffer._profiled_in = trace.serial
  _memory_changed(trace, buffer.device, max(buffer.nbytes, 1))

def buffer_freed(buffer: Any) -> None:
  if (trace := _trace) is not None and getattr(buffer, "_profiled_in", None) == trace.serial:
    _memory_changed(trace, buffer.device, -max(buffer.nbytes, 1))

def _memory_changed(trace: Trace, device: str, delta: int) -> None:
  with _lock:
    in_use = trace.memory[device] = trace.memory.get(device, 0) + delta
    trace.events.append({"name": "memory in use", "cat": "memory", "ph": "C", "ts": now(),
                         "pid": trace.pid_of(device), "args": {"bytes": in_use}})

def kernel_compiled(runner: Any, uops: str) -> None:
  """A kernel was compiled while recording: its UOps are kept on its runner (a CompiledKernel), for the record made
  when it is first launched (a BEAM candidate that is never launched gets none)."""
  runner.profiled_uops = uops

def kernel_record(runner: Any) -> KernelRecord:
  """The record of a compiled kernel in the current trace (made on first sight: then without UOps)."""
  assert _trace is not None, "kernel_record is only called while recording"
  with _lock: return _record_of(_trace, runner)

def _record_of(trace: Trace, runner: Any) -> KernelRecord:
  if (record := trace.kernels.get(id(runner))) is None:
    record = trace.kernels[id(runner)] = KernelRecord(
      len(trace.kernels), runner.name, runner.device, runner.src, getattr(runner, "profiled_uops", ""),
      ", ".join(map(str, runner.opts)), str(runner.global_size), str(runner.local_size), *runner.cost())
    record._runner = runner   # type: ignore[attr-defined]  # keeps id(runner) unique while the trace lives
  return record

# ---- starting and stopping

def start() -> Trace:
  """Start recording a new trace (the profiler must be off)."""
  global ENABLED, RECORDING, _trace
  if _trace is not None: raise RuntimeError("the profiler is already recording: profiles can't nest")
  global _traces_started
  _traces_started += 1
  _trace = Trace(serial=_traces_started)
  ENABLED = RECORDING = True
  return _trace

def stop() -> Trace:
  """Stop recording and return the trace, with the kernels still running on a device waited for."""
  global ENABLED, RECORDING, _trace
  if _trace is None: raise RuntimeError("the profiler is not recording")
  trace, _trace = _trace, None
  ENABLED = RECORDING = False
  for resolve in list(_pending_resolvers): resolve(trace)
  return trace

# Functions that turn device timestamps still in flight (CUDA events) into events, called by `stop` (tgrad's run
# loop registers one while it has unresolved launches: see tgrad/traced_run.py).
_pending_resolvers: list[Callable[[Trace], None]] = []

def write(trace: Trace, path: str) -> None:
  """Write the trace to `path` as trace-event JSON (folders made as needed)."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  with open(path, "w") as f: json.dump(trace.to_json(), f, separators=(",", ":"))

@contextlib.contextmanager
def profile(path: Optional[str] = None) -> Iterator[Trace]:
  """Record a trace of the block; with `path`, write it there as trace-event JSON when the block ends."""
  trace = start()
  try: yield trace
  finally:
    stop()
    if path: write(trace, path)

# ---- the environment: PROFILE=trace.json records the whole program; VIZ=1 serves the viz page at its end

TRACE_ENV, VIZ_ENV = "PROFILE", "VIZ"
at_exit_hooks: list[Callable[[Trace], None]] = []   # tgrad/viz adds the page for VIZ=1

def start_from_environment() -> None:
  """Called once when tgrad is imported: PROFILE=path (or VIZ=1) records from now until the program exits."""
  path = os.environ.get(TRACE_ENV, "").strip()
  if not path and os.environ.get(VIZ_ENV, "").strip() in ("", "0"): return
  if _trace is not None: return
  start()
  def finish() -> None:
    if _trace is None: return
    trace = stop()
    if path:
      write(trace, path)
      print(f"tgrad: wrote a trace of {len(trace.events)} events to {path} (open it in ui.perfetto.dev)")
    for hook in at_exit_hooks: hook(trace)
  atexit.register(finish)
