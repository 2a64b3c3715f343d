"""Copies between two GPUs of one process, ordered on their streams without waiting on the host.

Input: a destination and a source device (runtime.py's CUDADevice), a device pointer on each, a byte count.
Where the two GPUs can reach each other's memory (`can_access_peer`, NVLink or PCIe peer-to-peer) peer access is
enabled once in both directions and the copy is one cuMemcpyPeerAsync; otherwise it is staged through two pinned
host chunks (portable: pinned for every context), the source's device→host DMA of one chunk overlapping the
destination's host→device DMA of the other. Either way the copy runs after the work already queued on both devices
(the source's result is written, the destination's old value is no longer read) and before work queued later on the
destination: events recorded on one device's stream and waited on by the other's, so the host never blocks.
"""
from __future__ import annotations
import ctypes
from typing import Any
from tgrad.runtime.cuda.driver import (CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, CUDA_SUCCESS, DEFAULT_STREAM,
  HOST_ALLOC_PORTABLE, CUcontext, CUstream, Event, check, driver)

# Bytes per pinned chunk of a staged copy: large enough that each DMA runs near full PCIe bandwidth, small enough that
# two per pair of GPUs stay cheap to pin.
STAGING_CHUNK_BYTES = 4 << 20

class _InContext:
  """`with _InContext(device):` runs the body with the device's context current (pushed over whatever is current)."""
  def __init__(self, device: Any): self.context = device.context
  def __enter__(self): self.context.enter()
  def __exit__(self, *exc): self.context.leave()

_peer_access: dict[tuple[int, int], bool] = {}   # (source ordinal, destination ordinal) → peer access enabled

def peer_access(dst_device: Any, src_device: Any) -> bool:
  """Whether the two GPUs reach each other's memory directly; the first time, peer access is enabled both ways."""
  key = (src_device.ordinal, dst_device.ordinal)
  if (known := _peer_access.get(key)) is not None: return known
  lib, forward, backward = driver(), ctypes.c_int(0), ctypes.c_int(0)
  # CUdevice handles are the ordinals (cuDeviceGet returns its argument on every driver tgrad supports)
  for answer, device, peer in ((forward, src_device, dst_device), (backward, dst_device, src_device)):
    check(lib.cuDeviceCanAccessPeer(ctypes.byref(answer), device.ordinal, peer.ordinal), "cuDeviceCanAccessPeer")
  enabled = bool(forward.value and backward.value)
  if enabled:
    for device, peer in ((src_device, dst_device), (dst_device, src_device)):
      with _InContext(device):
        result = lib.cuCtxEnablePeerAccess(CUcontext(peer.context.handle), 0)
      if result not in (CUDA_SUCCESS, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
        check(result, f"cuCtxEnablePeerAccess (GPU {device.ordinal} → GPU {peer.ordinal})")
  _peer_access[key] = _peer_access[key[::-1]] = enabled
  return enabled

class _PeerRoute:
  """The events of a direct copy: `destination_free` (destination's stream: its earlier work is done with the
  buffer) and `copied` (source's stream: the copy has landed)."""
  def __init__(self, dst_device: Any, src_device: Any):
    with _InContext(dst_device): self.destination_free = Event()
    with _InContext(src_device): self.copied = Event()

class _StagedRoute:
  """Two pinned host chunks and, per chunk, `filled` (source's stream: its bytes are in the chunk) and `drained`
  (destination's stream: its bytes have left the chunk, which may be filled again)."""
  def __init__(self, dst_device: Any, src_device: Any):
    self.chunks = []
    with _InContext(src_device):
      for _ in range(2):
        pointer = ctypes.c_void_p()
        check(driver().cuMemHostAlloc(ctypes.byref(pointer), STAGING_CHUNK_BYTES, HOST_ALLOC_PORTABLE),
              f"cuMemHostAlloc ({STAGING_CHUNK_BYTES} bytes, portable)")
        self.chunks.append(pointer.value)
      self.filled = [Event(), Event()]
    with _InContext(dst_device): self.drained = [Event(), Event()]

_routes: dict[tuple[int, int, bool], Any] = {}

def _route(dst_device: Any, src_device: Any, direct: bool) -> Any:
  key = (src_device.ordinal, dst_device.ordinal, direct)
  if (route := _routes.get(key)) is None:
    route = _routes[key] = (_PeerRoute if direct else _StagedRoute)(dst_device, src_device)
  return route

def copy_between(dst_device: Any, dst_handle: Any, src_device: Any, src_handle: Any, nbytes: int) -> None:
  """Copy `nbytes` from `src_handle` on `src_device` to `dst_handle` on `dst_device` (device pointers, or anything
  int() turns into one), queued on both devices' streams; returns before the copy runs."""
  if not isinstance(nbytes, int) or nbytes < 0: raise ValueError(f"a copy of {nbytes!r} bytes: needs an int >= 0")
  if nbytes == 0: return
  dst, src, lib = int(dst_handle), int(src_handle), driver()
  if dst_device is src_device:
    with _InContext(src_device):
      check(lib.cuMemcpyDtoDAsync_v2(dst, src, nbytes, CUstream(DEFAULT_STREAM)), "cuMemcpyDtoDAsync_v2")
    return
  if peer_access(dst_device, src_device):
    route = _route(dst_device, src_device, direct=True)
    with _InContext(dst_device): route.destination_free.record()
    with _InContext(src_device):
      route.destination_free.wait_on()
      check(lib.cuMemcpyPeerAsync(dst, CUcontext(dst_device.context.handle), src, CUcontext(src_device.context.handle),
                                  nbytes, CUstream(DEFAULT_STREAM)),
            f"cuMemcpyPeerAsync ({nbytes} bytes, GPU {src_device.ordinal} → GPU {dst_device.ordinal})")
      route.copied.record()
    with _InContext(dst_device): route.copied.wait_on()
    return
  staged = _route(dst_device, src_device, direct=False)
  for index, start in enumerate(range(0, nbytes, STAGING_CHUNK_BYTES)):
    slot, size = index % 2, min(STAGING_CHUNK_BYTES, nbytes - start)
    with _InContext(src_device):
      staged.drained[slot].wait_on()   # the destination has taken the chunk's previous bytes
      check(lib.cuMemcpyDtoHAsync_v2(staged.chunks[slot], src + start, size, CUstream(DEFAULT_STREAM)),
            "cuMemcpyDtoHAsync_v2")
      staged.filled[slot].record()
    with _InContext(dst_device):
      staged.filled[slot].wait_on()
      check(lib.cuMemcpyHtoDAsync_v2(dst + start, staged.chunks[slot], size, CUstream(DEFAULT_STREAM)),
            "cuMemcpyHtoDAsync_v2")
      staged.drained[slot].record()
