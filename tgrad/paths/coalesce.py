"""Copy coalescing: a region computed on another device between copies from the CPU and a copy back runs on the CPU
instead, when the benchmark database says that is faster.

The pattern, in the unrealized lazy graph: `out`, a COPY to LLVM of the root of a composite region on device D (not
LLVM), every input of which is (a view of) a COPY from LLVM to D — `x.to(D).f().to("LLVM")`.

What is compared (each quantity the least `min_time` of the path that selection (db.select, the graph's tolerance,
this hardware, tgrad version and settings) picks among the records of one graph; a graph's key is what any program
realizing it records it under):
  t_llvm — the region alone on LLVM: `composite(name, inputs, **params)` over realized LLVM inputs of the region's
           input shapes and dtypes (`region_key`);
  t_dev  — the same region alone on D;
  t_in   — each input's copy LLVM → D: `x.to(D)` of a realized LLVM x of that shape and dtype (`copy_key`);
  t_out  — the result's copy D → LLVM.
The region runs on LLVM iff every quantity is recorded and t_llvm < t_dev + Σ t_in + t_out; otherwise nothing changes
(no record is no evidence). The rewrite makes `out` itself compute the region on LLVM from the copies' LLVM
sources, as a composite region there (so selection can still pick its lowering); the copies and the D-side region
are no longer read by it. `record_copy_times` measures the copies for the database (the regions are profiled like
any graph).
"""
from __future__ import annotations
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence
import numpy as np
from tgrad.backend import HOST_DEVICE
from tgrad.device import Buffer
from tgrad.dtype import DType
from tgrad.helpers import code_settings
from tgrad.lazy import LazyBuffer, walk
from tgrad.ops import Ops
from tgrad.paths.db import Measurement, PathsDB, default_tolerance, get_paths_db, select
from tgrad.paths.fingerprint import hardware_fingerprint, tgrad_version
from tgrad.paths.graph import graph_description, graph_key, placeholders
from tgrad.realize import BufferCopy
from tgrad.regions import DEFAULT, Region, composite
from tgrad.tensor import Tensor

HOST = HOST_DEVICE
COPY_PATH_ID = "copy"
COPY_REPEATS = 5

@dataclass(frozen=True)
class RoundTrip:
  """One occurrence of the pattern: the copy back (`out`), the region on the other device, and the LLVM-side value
  of each of its inputs."""
  out: LazyBuffer
  region: Region
  host_inputs: tuple[LazyBuffer, ...]
  @property
  def device(self) -> str: return self.region.root.device

def _host_value(x: LazyBuffer, device: str) -> Optional[LazyBuffer]:
  """x (on device) as the LLVM value it was copied from, through the same view; None unless x is such a copy."""
  base = x.base
  if base.buffer is not None or base.op is not Ops.COPY or not base.srcs or base.device != device: return None
  source = base.srcs[0]
  if source.device != HOST: return None
  whole = source.reshape(base.shape)
  return whole if x.is_base else LazyBuffer(HOST, whole.st + x.st, x.dtype, base=whole.base)

def find_round_trips(outs: Sequence[LazyBuffer]) -> list[RoundTrip]:
  """Every occurrence of the pattern above outs (module doc)."""
  found = []
  for lb in walk(outs, views=False, realized=False):
    if lb.op is not Ops.COPY or lb.device != HOST or not lb.srcs: continue
    root = lb.srcs[0]
    region = root.region if root.is_base else None
    if region is None or region.root is not root or region.current != DEFAULT or root.device == HOST: continue
    host_inputs = [_host_value(x, root.device) for x in region.inputs]
    if region.inputs and all(h is not None for h in host_inputs):
      found.append(RoundTrip(lb, region, tuple(host_inputs)))
  return found

# ---- the graphs whose records are compared

def region_key(region: Region, device: str) -> str:
  """The key of the region alone on `device`, over realized inputs of its input shapes and dtypes."""
  inputs = placeholders(device, [x.shape for x in region.inputs], [x.dtype for x in region.inputs])
  out = composite(region.name, tuple(Tensor(p, requires_grad=False) for p in inputs), **dict(region.params))
  return graph_key([out.lazydata])

def _copy_graph(source: str, destination: str, shape: tuple[int, ...], dtype: DType) -> LazyBuffer:
  [x] = placeholders(source, [shape], [dtype])
  return x.copy_to_device(destination)

def copy_key(source: str, destination: str, shape: tuple[int, ...], dtype: DType) -> str:
  """The key of copying a realized value of this shape and dtype from `source` to `destination`."""
  return graph_key([_copy_graph(source, destination, shape, dtype)])

def recorded_time(db: PathsDB, key: str, device: str, dtype: DType, fingerprint: Optional[Callable] = None
                  ) -> Optional[float]:
  """min_time of the path selection picks among the graph's records (`fingerprint`: of a device, default this
  machine's), or None."""
  chosen = select(db.runs(key, device), default_tolerance(dtype), fingerprint or hardware_fingerprint, tgrad_version(),
                  code_settings()).chosen
  return None if chosen is None else chosen.min_time

@dataclass(frozen=True)
class Decision:
  on_host: bool
  reason: str

def decide(t_host: Optional[float], t_device: Optional[float], t_copies: Sequence[Optional[float]]) -> Decision:
  """Run on the host iff every time is recorded and t_host < t_device + Σ copies (the module doc)."""
  if t_host is None or t_device is None or any(t is None for t in t_copies):
    return Decision(False, "not every part is recorded (region on both devices, each copy)")
  round_trip = t_device + sum(t_copies)
  if t_host < round_trip:
    return Decision(True, f"host {t_host*1e6:.1f} us < device {t_device*1e6:.1f} us + copies "
                          f"{sum(t_copies)*1e6:.1f} us")
  return Decision(False, f"host {t_host*1e6:.1f} us >= device {t_device*1e6:.1f} us + copies "
                         f"{sum(t_copies)*1e6:.1f} us")

_decisions: dict[tuple, Decision] = {}   # a round trip's signature → the decision (until forget(): records changed)

def forget() -> None: _decisions.clear()

def decision_for(trip: RoundTrip, db: PathsDB, fingerprint: Optional[Callable] = None) -> Decision:
  """The decision for one round trip, remembered per signature (composite, params, input and output shapes and
  dtypes, device) while the records stay the same."""
  region = trip.region
  signature = (region.name, region.params, tuple((x.shape, x.dtype) for x in region.inputs), region.root.shape,
               region.root.dtype, trip.device, db.path, fingerprint)
  try: known = _decisions.get(signature)
  except TypeError: return _decide_now(trip, db, fingerprint)   # a param that can't be a key
  if known is None: known = _decisions[signature] = _decide_now(trip, db, fingerprint)
  return known

def _decide_now(trip: RoundTrip, db: PathsDB, fingerprint: Optional[Callable]) -> Decision:
  region, device = trip.region, trip.device
  dtype = region.root.dtype
  t_host = recorded_time(db, region_key(region, HOST), HOST, dtype, fingerprint)
  t_device = recorded_time(db, region_key(region, device), device, dtype, fingerprint)
  copies = [recorded_time(db, copy_key(HOST, device, x.shape, x.dtype), device, x.dtype, fingerprint)
            for x in region.inputs]
  copies.append(recorded_time(db, copy_key(device, HOST, region.root.shape, dtype), HOST, dtype, fingerprint))
  return decide(t_host, t_device, copies)

def rewrite_on_host(trip: RoundTrip) -> None:
  """Make trip.out compute the region on LLVM from the host inputs (a composite region there, rooted at out). The
  rewrite is final: the graph as built is the coalesced one (its key is what selection then looks up)."""
  region = trip.region
  value = composite(region.name, tuple(Tensor(x, requires_grad=False) for x in trip.host_inputs),
                    **dict(region.params)).lazydata.reshape(trip.out.shape)
  out = trip.out
  if value.is_base and value.buffer is None and value.srcs:
    out.rewrite(value.op, value.srcs, value.arg, keep_built=False)
    moved = value.region
    if moved is not None and moved.root is value: moved.move_to(out)
  else: out.rewrite(Ops.CAST, (value,), None, keep_built=False)

def coalesce_copies(outs: Sequence[LazyBuffer], db: Optional[PathsDB] = None, fingerprint: Optional[Callable] = None,
                    log: Optional[list[str]] = None) -> int:
  """Rewrite every round trip above outs that the database (default: the one selection reads) says is faster on the
  host; how many were rewritten (each decision's reason is appended to `log` when given)."""
  if db is None: db = get_paths_db()
  rewritten = 0
  for trip in find_round_trips(outs):
    decision = decision_for(trip, db, fingerprint)
    if log is not None: log.append(f"{trip.region.name} on {trip.device}: {decision.reason}")
    if decision.on_host:
      rewrite_on_host(trip)
      rewritten += 1
  return rewritten

# ---- measuring copies for the database

def record_copy_times(db: PathsDB, source: str, destination: str, shape: tuple[int, ...], dtype: DType,
                      repeats: int = COPY_REPEATS) -> Measurement:
  """Time a copy of a value of this shape and dtype from `source` to `destination` and record it (graph copy_key)."""
  size = int(np.prod(shape)) if shape else 1
  src, dst = Buffer(source, size, dtype), Buffer(destination, size, dtype)
  src.copyin(np.zeros(size, dtype=dtype.np))
  copy = BufferCopy(dst.nbytes)
  copy([dst, src], wait=True)   # the first copy allocates and warms up
  times = tuple(copy([dst, src], wait=True) or 0.0 for _ in range(repeats))
  outs = [_copy_graph(source, destination, shape, dtype)]
  measurement = Measurement(
    graph_key=graph_key(outs), graph_desc=graph_description(outs), path_id=COPY_PATH_ID,
    path_desc=f"copy {source} → {destination}", device=destination, parts=(source, destination),
    fingerprint=hardware_fingerprint(destination), tgrad_version=tgrad_version(), settings=code_settings(),
    times=times, max_rel_error=0.0, max_abs_error=0.0, input_distribution="zeros", status="ok",
    measured_at=time.time())
  db.add(measurement)
  return measurement
