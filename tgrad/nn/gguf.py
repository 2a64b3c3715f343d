"""GGUF files (llama.cpp's model format): header, metadata, tensor table, and the tensor data as a memory map.

Layout, little-endian: magic "GGUF", version (2 or 3), tensor count and metadata count (u64); the metadata key/value
pairs; one entry per tensor (name, dims fastest-first, ggml type, offset into the data section); padding to
`general.alignment` (default 32); the data section. `GGUFFile(path)` parses the header and checks every count, length
and tensor extent against the file size before building anything from it. `load_gguf` turns the entries into
Tensors (plain types: F32, F16, BF16, ints) and `QuantizedTensor`s (block types, tgrad/nn/quant.py) whose bytes stay
in the memory map until a device needs them. Input: a path; output: metadata dict and tensors by name.
"""
from __future__ import annotations
import os, struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Callable, Optional, Union
import numpy as np
from tgrad.dtype import DType, dtypes
from tgrad.device import canonical_device
from tgrad.lazy import LazyBuffer
from tgrad.tensor import Tensor
from tgrad.nn.quant import BLOCK_LAYOUTS, DEQUANTIZERS, PLAIN_DTYPES, GGMLType, QuantizedTensor

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)        # version 1 used 32-bit counts and lengths; nothing current writes it
DEFAULT_ALIGNMENT = 32             # GGUF_DEFAULT_ALIGNMENT in llama.cpp's gguf.h
ALIGNMENT_KEY = "general.alignment"
ARCHITECTURE_KEY = "general.architecture"
MAX_DIMS = 4                       # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8              # arrays of arrays: llama.cpp writes none deeper than 2; deeper is a broken file
HEADER_BYTES = 4 + 4 + 8 + 8       # magic, version, tensor count, metadata count
U64_BYTES, U32_BYTES = 8, 4
MIN_KV_BYTES = U64_BYTES + U32_BYTES + 1               # key length, value type, the smallest value (a u8)
MIN_TENSOR_INFO_BYTES = U64_BYTES + U32_BYTES + U32_BYTES + U64_BYTES   # name length, n_dims, type, offset

class GGUFValueType(IntEnum):
  """Metadata value types (gguf.h's `enum gguf_type`)."""
  UINT8 = 0; INT8 = 1; UINT16 = 2; INT16 = 3; UINT32 = 4; INT32 = 5; FLOAT32 = 6; BOOL = 7   # noqa: E702
  STRING = 8; ARRAY = 9; UINT64 = 10; INT64 = 11; FLOAT64 = 12                                 # noqa: E702

# little-endian numpy dtype of each fixed-size value type (arrays of it are read as one numpy array)
VALUE_NP_DTYPES: dict[GGUFValueType, np.dtype] = {
  GGUFValueType.UINT8: np.dtype("<u1"), GGUFValueType.INT8: np.dtype("<i1"), GGUFValueType.UINT16: np.dtype("<u2"),
  GGUFValueType.INT16: np.dtype("<i2"), GGUFValueType.UINT32: np.dtype("<u4"), GGUFValueType.INT32: np.dtype("<i4"),
  GGUFValueType.FLOAT32: np.dtype("<f4"), GGUFValueType.BOOL: np.dtype("?"), GGUFValueType.UINT64: np.dtype("<u8"),
  GGUFValueType.INT64: np.dtype("<i8"), GGUFValueType.FLOAT64: np.dtype("<f8")}
# the same as struct formats, for scalars (struct reads one value from a memoryview ~10x faster than numpy)
VALUE_STRUCTS: dict[GGUFValueType, struct.Struct] = {vtype: struct.Struct("<" + code) for vtype, code in zip(
  VALUE_NP_DTYPES, ("B", "b", "H", "h", "I", "i", "f", "?", "Q", "q", "d"))}
STRING_MIN_BYTES = U64_BYTES               # an empty string is its length alone
ARRAY_MIN_BYTES = U32_BYTES + U64_BYTES    # an empty array is its element type and count

class GGUFError(ValueError):
  """A GGUF file that does not follow the format (or not the one asked for); the message names the file and entry."""

@dataclass(frozen=True)
class GGUFTensorInfo:
  """One entry of the tensor table. `shape` is numpy's order (slowest first: GGUF's dims reversed); `offset` is the
  byte offset from the start of the file (the file stores it relative to the data section)."""
  name: str
  shape: tuple[int, ...]
  ggml_type: GGMLType
  offset: int
  nbytes: int
  @property
  def dims(self) -> tuple[int, ...]: return self.shape[::-1]   # GGUF's order, fastest first

MetadataValue = Union[int, float, bool, str, list, np.ndarray]

def map_read_only(path: str) -> np.ndarray:
  """The whole file as a read-only uint8 memory map: the default data source of a GGUFFile."""
  return np.memmap(path, dtype=np.uint8, mode="r")

class _HeaderReader:
  """A cursor over the file's bytes that never reads past the end: every read is checked against the size first."""
  def __init__(self, path: str, data: np.ndarray):
    self.path, self.view, self.pos, self.size = path, memoryview(data), 0, int(data.size)

  def fail(self, what: str, message: str) -> GGUFError: return GGUFError(f"{self.path}: {what}: {message}")

  def need(self, nbytes: int, what: str) -> None:
    if nbytes > self.size - self.pos:
      raise self.fail(what, f"needs {nbytes} bytes at offset {self.pos}, but the file has {self.size} "
                            f"(truncated or a corrupt length)")

  def scalar(self, vtype: GGUFValueType, what: str) -> Any:
    unpacker = VALUE_STRUCTS[vtype]
    self.need(unpacker.size, what)
    value = unpacker.unpack_from(self.view, self.pos)[0]
    self.pos += unpacker.size
    return value

  def u32(self, what: str) -> int: return self.scalar(GGUFValueType.UINT32, what)
  def u64(self, what: str) -> int: return self.scalar(GGUFValueType.UINT64, what)

  def string(self, what: str) -> str:
    length = self.u64(f"{what} (string length)")
    self.need(length, f"{what} (string of {length} bytes)")
    raw = bytes(self.view[self.pos:self.pos + length])
    self.pos += length
    try: return raw.decode("utf-8")
    except UnicodeDecodeError as e: raise self.fail(what, f"string is not UTF-8: {e}") from None

  def value_type(self, what: str) -> GGUFValueType:
    code = self.u32(f"{what} (value type)")
    try: return GGUFValueType(code)
    except ValueError: raise self.fail(what, f"unknown value type {code}") from None

  def value(self, vtype: GGUFValueType, what: str, depth: int = 0) -> MetadataValue:
    if vtype in VALUE_STRUCTS: return self.scalar(vtype, what)
    if vtype is GGUFValueType.STRING: return self.string(what)
    if depth >= MAX_ARRAY_NESTING: raise self.fail(what, f"arrays nested deeper than {MAX_ARRAY_NESTING}")
    item_type = self.value_type(f"{what} (array element)")
    count = self.u64(f"{what} (array length)")
    item_bytes = VALUE_NP_DTYPES[item_type].itemsize if item_type in VALUE_NP_DTYPES else \
      STRING_MIN_BYTES if item_type is GGUFValueType.STRING else ARRAY_MIN_BYTES
    self.need(count * item_bytes, f"{what} (array of {count} {item_type.name})")
    if item_type in VALUE_NP_DTYPES:   # numbers: one copy out of the map
      values = np.frombuffer(self.view, VALUE_NP_DTYPES[item_type], count=count, offset=self.pos).copy()
      self.pos += count * item_bytes
      return values
    if item_type is GGUFValueType.STRING: return self.strings(count, what)
    return [self.value(item_type, f"{what}[{i}]", depth + 1) for i in range(count)]

  def strings(self, count: int, what: str) -> list[str]:
    """`count` strings: the loop of `string` without building an error label per item (a vocabulary has 262144)."""
    unpack_length, view, size, out = VALUE_STRUCTS[GGUFValueType.UINT64].unpack_from, self.view, self.size, []
    for index in range(count):
      start = self.pos + U64_BYTES
      if start > size or start + unpack_length(view, self.pos)[0] > size:
        self.string(f"{what}[{index}]")   # raises, naming the position and the sizes
      end = start + unpack_length(view, self.pos)[0]
      try: out.append(str(view[start:end], "utf-8"))
      except UnicodeDecodeError as e: raise self.fail(f"{what}[{index}]", f"string is not UTF-8: {e}") from None
      self.pos = end
    return out

class GGUFFile:
  """A parsed GGUF header and the file's bytes (read-only memory map; `data_source` maps a path to a uint8 array, so
  a snapshotting source can replace the plain map). Metadata: scalars as Python numbers, strings as str, arrays of
  numbers as numpy arrays, arrays of strings or arrays as lists. Raises GGUFError for anything malformed."""
  def __init__(self, path: str, expect_architecture: Optional[str] = None,
               data_source: Callable[[str], np.ndarray] = map_read_only):
    self.path = os.fspath(path)
    file_size = os.path.getsize(self.path)
    if file_size < HEADER_BYTES:
      raise GGUFError(f"{self.path}: file of {file_size} bytes is shorter than a GGUF header ({HEADER_BYTES})")
    self.data = data_source(self.path)
    if self.data.dtype != np.uint8 or self.data.ndim != 1 or self.data.size != file_size:
      raise GGUFError(f"{self.path}: data source gave {self.data.dtype} {self.data.shape}, not {file_size} bytes")
    reader = _HeaderReader(self.path, self.data)
    self.version, tensor_count, kv_count = self._read_counts(reader)
    self.metadata: dict[str, MetadataValue] = {}
    self.value_types: dict[str, GGUFValueType] = {}
    self._read_metadata(reader, kv_count)
    if expect_architecture is not None and self.architecture != expect_architecture:
      raise GGUFError(f"{self.path}: {ARCHITECTURE_KEY} is {self.architecture!r}, expected {expect_architecture!r}")
    self.alignment = self._alignment()
    self.tensors: dict[str, GGUFTensorInfo] = {}
    entries = self._read_tensor_table(reader, tensor_count)
    self.data_start = -(-reader.pos // self.alignment) * self.alignment
    for name, shape, ggml_type, relative_offset in entries:
      self.tensors[name] = self._check_extent(name, shape, ggml_type, relative_offset, file_size)

  @property
  def architecture(self) -> Optional[str]:
    arch = self.metadata.get(ARCHITECTURE_KEY)
    return arch if isinstance(arch, str) else None

  def _read_counts(self, reader: _HeaderReader) -> tuple[int, int, int]:
    magic = bytes(self.data[:len(GGUF_MAGIC)])
    if magic != GGUF_MAGIC: raise GGUFError(f"{self.path}: magic {magic!r} is not {GGUF_MAGIC!r}: not a GGUF file")
    reader.pos = len(GGUF_MAGIC)
    version = reader.u32("version")
    if version not in SUPPORTED_VERSIONS:
      swapped = int.from_bytes(version.to_bytes(U32_BYTES, "little"), "big")
      hint = " (a big-endian file: only little-endian GGUF is read)" if swapped in SUPPORTED_VERSIONS else ""
      raise GGUFError(f"{self.path}: GGUF version {version} is not supported{hint}; tgrad reads {SUPPORTED_VERSIONS}")
    tensor_count, kv_count = reader.u64("tensor count"), reader.u64("metadata count")
    remaining = reader.size - reader.pos
    if kv_count * MIN_KV_BYTES > remaining:
      raise GGUFError(f"{self.path}: metadata count {kv_count} cannot fit the {remaining} bytes after the header")
    if tensor_count * MIN_TENSOR_INFO_BYTES > remaining:
      raise GGUFError(f"{self.path}: tensor count {tensor_count} cannot fit the {remaining} bytes after the header")
    return version, tensor_count, kv_count

  def _read_metadata(self, reader: _HeaderReader, kv_count: int) -> None:
    for index in range(kv_count):
      key = reader.string(f"metadata entry {index} (key)")
      if key in self.metadata: raise GGUFError(f"{self.path}: metadata key {key!r} appears twice")
      vtype = reader.value_type(f"metadata {key!r}")
      self.metadata[key] = reader.value(vtype, f"metadata {key!r}")
      self.value_types[key] = vtype

  def _alignment(self) -> int:
    if ALIGNMENT_KEY not in self.metadata: return DEFAULT_ALIGNMENT
    alignment, vtype = self.metadata[ALIGNMENT_KEY], self.value_types[ALIGNMENT_KEY]
    if vtype is not GGUFValueType.UINT32 or alignment <= 0 or alignment & (alignment - 1):
      raise GGUFError(f"{self.path}: {ALIGNMENT_KEY} must be a power-of-two UINT32, got {vtype.name} {alignment!r}")
    return alignment

  def _read_tensor_table(self, reader: _HeaderReader, tensor_count: int) -> list[tuple[str, tuple, GGMLType, int]]:
    entries, names = [], set()
    for index in range(tensor_count):
      name = reader.string(f"tensor entry {index} (name)")
      what = f"tensor {name!r}"
      if name in names: raise GGUFError(f"{self.path}: {what} appears twice in the tensor table")
      names.add(name)
      n_dims = reader.u32(f"{what} (n_dims)")
      if n_dims > MAX_DIMS: raise GGUFError(f"{self.path}: {what} has {n_dims} dims; GGUF allows at most {MAX_DIMS}")
      dims = tuple(reader.u64(f"{what} (dim {i})") for i in range(n_dims))
      code = reader.u32(f"{what} (type)")
      try: ggml_type = GGMLType(code)
      except ValueError: raise GGUFError(f"{self.path}: {what} has unknown ggml type {code}") from None
      entries.append((name, dims[::-1], ggml_type, reader.u64(f"{what} (offset)")))
    return entries

  def _check_extent(self, name: str, shape: tuple[int, ...], ggml_type: GGMLType, relative_offset: int,
                    file_size: int) -> GGUFTensorInfo:
    what = f"{self.path}: tensor {name!r} ({ggml_type.name}, shape {shape})"
    data_size = file_size - self.data_start
    layout = BLOCK_LAYOUTS[ggml_type]
    row = shape[-1] if shape else 1   # n_dims 0: one value, as llama.cpp reads it
    if row % layout.block_size:
      raise GGUFError(f"{what}: the first GGUF dim {row} is not a multiple of the block size {layout.block_size}")
    max_dim = max(data_size, 0) // layout.block_bytes * layout.block_size   # values the data section could hold
    if any(dim > max_dim for dim in shape):
      raise GGUFError(f"{what}: a dim exceeds the {max_dim} values the {data_size}-byte data section could hold")
    count = 1
    for dim in shape: count *= dim
    nbytes = count // layout.block_size * layout.block_bytes
    if relative_offset % self.alignment:
      raise GGUFError(f"{what}: offset {relative_offset} is not a multiple of the alignment {self.alignment}")
    if relative_offset + nbytes > data_size:
      raise GGUFError(f"{what}: bytes {relative_offset}..{relative_offset + nbytes} of the data section run past "
                      f"its end ({data_size} bytes from file offset {self.data_start})")
    return GGUFTensorInfo(name, shape, ggml_type, self.data_start + relative_offset, nbytes)

  def raw(self, name: str) -> np.ndarray:
    """The tensor's bytes as a uint8 view of the map (no copy)."""
    info = self.tensors[name]
    return self.data[info.offset:info.offset + info.nbytes]

  def tensor(self, name: str, device: Optional[str] = None) -> Union[Tensor, QuantizedTensor]:
    """A plain type as a Tensor of its dtype; a block type as a QuantizedTensor. Data moves when a device needs it."""
    info = self.tensors.get(name)
    if info is None: raise KeyError(f"{self.path}: no tensor {name!r}")
    if info.ggml_type in PLAIN_DTYPES:
      dtype: DType = PLAIN_DTYPES[info.ggml_type]
      storage = np.dtype("<u2") if dtype == dtypes.bfloat16 else np.dtype(dtype.np).newbyteorder("<")
      host = self.raw(name).view(storage).reshape(info.shape)
      return Tensor(LazyBuffer.from_host(host, canonical_device(device), dtype))
    try: return QuantizedTensor.from_bytes(self.raw(name), info.ggml_type, info.shape, device)
    except ValueError as e: raise GGUFError(f"{self.path}: tensor {name!r}: {e}") from None

def load_gguf(path: str, device: Optional[str] = None, dequantize: Optional[DType] = None,
              expect_architecture: Optional[str] = None
              ) -> tuple[dict[str, MetadataValue], dict[str, Union[Tensor, QuantizedTensor]]]:
  """(metadata, tensors by name). Block-quantized tensors stay packed (QuantizedTensor) unless `dequantize` names a
  float dtype, which makes every float tensor a lazy Tensor of that dtype (integer tensors keep their dtype)."""
  gguf = GGUFFile(path, expect_architecture)
  if dequantize is not None and not dequantize.is_float:
    raise GGUFError(f"{gguf.path}: dequantize needs a float dtype, got {dequantize}")
  for info in gguf.tensors.values():   # fail before building anything: a packed tensor tgrad can't use is no use
    if info.ggml_type not in PLAIN_DTYPES and info.ggml_type not in DEQUANTIZERS:
      raise GGUFError(f"{gguf.path}: tensor {info.name!r}: tgrad has no dequantization for {info.ggml_type.name}; "
                      f"it reads {', '.join(t.name for t in (*PLAIN_DTYPES, *DEQUANTIZERS))}")
  tensors: dict[str, Union[Tensor, QuantizedTensor]] = {}
  for name in gguf.tensors:
    loaded = gguf.tensor(name, device)
    if dequantize is not None:
      if isinstance(loaded, QuantizedTensor): loaded = loaded.dequantize(dequantize)
      elif loaded.dtype.is_float: loaded = loaded.cast(dequantize)
    tensors[name] = loaded
  return gguf.metadata, tensors
