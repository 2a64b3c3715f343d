"""Tensor maps (CUtensorMap) for the tensor-memory accelerator (TMA, sm_90): what a kernel that loads by
`cp.async.bulk.tensor` needs to know about a global matrix, made on the host by the driver's cuTensorMapEncodeTiled.

A kernel source names its tensor maps as TensorMapSpecs (which buffer argument, the matrix's size and row stride, the
box one copy moves, the shared-memory swizzle) in a module global (targets.TENSOR_MAPS_SUFFIX, `marker_values`); the
runtime reads them back (`specs_of_marker`) and, per launch, encodes one 128-byte map per spec from the buffer's
device address (`TensorMapCache`: a map embeds the address, so a new pointer, e.g. a rebound JIT input, is a new map).
The maps are passed by value as the kernel's first parameters (`const __grid_constant__`), 64-byte aligned, by
reference through kernelParams (kernel_params.py says why never in a packed buffer).
"""
from __future__ import annotations
import ctypes, struct
from dataclasses import dataclass
from typing import Sequence
from tgrad.runtime.cuda.driver import check, driver
from tgrad.runtime.cuda.targets import TENSOR_MAPS_SUFFIX

TENSOR_MAP_BYTES = 128       # sizeof(CUtensorMap)
TENSOR_MAP_ALIGNMENT = 64    # alignof(CUtensorMap): where the parameter sits in the kernel's parameter buffer
GLOBAL_ALIGNMENT = 16        # a tensor map's global address and row strides are multiples of 16 bytes
# cuda.h enums (CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
# CUtensorMapFloatOOBfill)
DATA_TYPE_UINT16 = 1         # 16-bit elements moved as bits (half and bfloat16 alike; out of bounds reads 0)
INTERLEAVE_NONE = 0
SWIZZLE_NONE, SWIZZLE_128B = 0, 3
L2_PROMOTION_128B = 2        # the L2 fetches 128 bytes at a time: one swizzled row of a box
OOB_FILL_ZEROS = 0           # elements outside the matrix land as zeros
RANK = 2
MARKER_FIELDS = 8            # values per spec in the marker global (marker_values)

@dataclass(frozen=True)
class TensorMapSpec:
  """A row-major matrix of `rows` × `columns` elements of `element_bytes` (rows `row_stride` bytes apart) in buffer
  argument `argument` of the kernel, copied in boxes of `box_rows` × `box_columns` (box_columns · element_bytes ≤ 128
  with the 128-byte swizzle) into shared memory laid out with `swizzle`."""
  argument: int
  rows: int
  columns: int
  row_stride: int
  box_rows: int
  box_columns: int
  element_bytes: int = 2
  swizzle: int = SWIZZLE_128B
  def __post_init__(self):
    if self.row_stride % GLOBAL_ALIGNMENT or min(self.rows, self.columns, self.box_rows, self.box_columns) < 1:
      raise ValueError(f"tensor map {self}: rows {GLOBAL_ALIGNMENT}-byte aligned and sizes >= 1 needed")
  @property
  def box_bytes(self) -> int: return self.box_rows * self.box_columns * self.element_bytes
  def marker_values(self) -> tuple[int, ...]:
    return (self.argument, self.rows, self.columns, self.row_stride, self.box_rows, self.box_columns,
            self.element_bytes, self.swizzle)

def marker_source(name: str, specs: Sequence[TensorMapSpec]) -> str:
  """The C of the module global that lists the kernel's tensor maps: their count, then MARKER_FIELDS values each."""
  values = [len(specs)] + [v for spec in specs for v in spec.marker_values()]
  return f'extern "C" __device__ const unsigned long long {name}{TENSOR_MAPS_SUFFIX}[] = ' \
         f'{{{", ".join(map(str, values))}}};'

def specs_of_marker(values: Sequence[int]) -> tuple[TensorMapSpec, ...]:
  """The specs a marker global lists (its values as read back from the module: the count first)."""
  count = int(values[0])
  return tuple(TensorMapSpec(*map(int, values[1 + i * MARKER_FIELDS:1 + (i + 1) * MARKER_FIELDS]))
               for i in range(count))

def encode(spec: TensorMapSpec, address: int) -> bytes:
  """The 128-byte CUtensorMap of `spec` for the matrix at device address `address` (cuTensorMapEncodeTiled)."""
  if address % GLOBAL_ALIGNMENT:
    raise ValueError(f"tensor map of buffer argument {spec.argument}: address {address:#x} is not "
                     f"{GLOBAL_ALIGNMENT}-byte aligned (TMA needs it)")
  # the driver writes the map at a 64-byte-aligned host address (cuTensorMapEncodeTiled requires it)
  storage = (ctypes.c_char * (TENSOR_MAP_BYTES + TENSOR_MAP_ALIGNMENT))()
  aligned = -(-ctypes.addressof(storage) // TENSOR_MAP_ALIGNMENT) * TENSOR_MAP_ALIGNMENT
  dims = (ctypes.c_uint64 * RANK)(spec.columns, spec.rows)            # innermost first
  strides = (ctypes.c_uint64 * (RANK - 1))(spec.row_stride)           # bytes, of every dimension but the innermost
  box = (ctypes.c_uint32 * RANK)(spec.box_columns, spec.box_rows)
  element_strides = (ctypes.c_uint32 * RANK)(1, 1)
  check(driver().cuTensorMapEncodeTiled(aligned, DATA_TYPE_UINT16, RANK, ctypes.c_void_p(address),
                                        dims, strides, box, element_strides, INTERLEAVE_NONE, spec.swizzle,
                                        L2_PROMOTION_128B, OOB_FILL_ZEROS),
        f"cuTensorMapEncodeTiled ({spec.rows}×{spec.columns} matrix, box {spec.box_rows}×{spec.box_columns}, "
        f"address {address:#x})")
  return ctypes.string_at(aligned, TENSOR_MAP_BYTES)

# A program keeps the maps of this many distinct pointer tuples (a JIT replays a few; an eager loop one or two)
TENSOR_MAP_CACHE_ENTRIES = 64

class TensorMapCache:
  """The encoded maps of one kernel's specs per tuple of its buffer pointers, least recently made dropped first."""
  def __init__(self, specs: Sequence[TensorMapSpec], encoder=encode):
    self.specs, self.encoder = tuple(specs), encoder
    self.maps: dict[tuple[int, ...], tuple[bytes, ...]] = {}
  def __call__(self, pointers: Sequence[int]) -> tuple[bytes, ...]:
    """One map per spec, for the buffer arguments at these device addresses."""
    key = tuple(int(p) for p in pointers)
    if (known := self.maps.get(key)) is not None: return known
    for spec in self.specs:
      if spec.argument >= len(key):
        raise ValueError(f"tensor map of buffer argument {spec.argument}: the launch has {len(key)} buffers")
    maps = tuple(self.encoder(spec, key[spec.argument]) for spec in self.specs)
    if len(self.maps) >= TENSOR_MAP_CACHE_ENTRIES: self.maps.pop(next(iter(self.maps)))
    self.maps[key] = maps
    return maps

def pack_parameters(maps: Sequence[bytes], pointers: Sequence[int], variables: Sequence[int] = ()) -> bytes:
  """The arguments back to back: the tensor maps (128 bytes each), the buffer pointers (8 bytes each), the variables
  (64-bit). Not the kernel's parameter layout: the compiler puts a 64-byte-aligned parameter at a 64-byte boundary of
  the constant bank, 48 bytes into the block on sm_90 (kernel_params.py), so a launch must pass the arguments by
  reference (kernel_params.launch_by_reference). Only for a launch that is recorded and never run (graph.py's
  kernel_identity)."""
  for m in maps:
    if len(m) != TENSOR_MAP_BYTES: raise ValueError(f"a tensor map is {TENSOR_MAP_BYTES} bytes, not {len(m)}")
  return b"".join(maps) + struct.pack(f"<{len(pointers)}Q{len(variables)}q", *map(int, pointers), *map(int, variables))
