"""Gemma 3 tensor-parallel over two CPU devices (LLVM:0, LLVM:1) equals the one-device model: the same logits (within
float32 rounding of the split sums) for a prefill, an extend and decode steps, the same greedy ids with the captured
decode step, two all-reduces per layer and no other traffic, and each weight placed as gemma3_parallel.py says
(tiny preset, seeded random weights)."""
import dataclasses, os, sys
from collections import Counter
import numpy as np
import pytest
import tgrad.realize as realize_module
from tgrad import Tensor
from tgrad.ops import Ops
from tgrad.schedule import create_schedule
from tgrad.multi import MultiLazyBuffer
from tgrad.models.gemma3 import Gemma3, Gemma3Config
from tgrad.models.generation import generate
from tgrad.nn.quant import GGMLType, QuantizedTensor
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from decode_kernels import decode_step_items, schedule_only  # noqa: E402

DEVICES = ("LLVM:0", "LLVM:1")
PROMPT = [2, 17, 301, 5, 88, 412, 9]
EXTEND = [44, 3, 250]
DECODE_STEPS = 2   # with the extend: 12 positions, past the tiny preset's sliding window (8): the ring wraps
CONTEXT = 32
LOGIT_TOLERANCE = 2e-5   # float32; the split sums add the same terms in another order

@pytest.fixture(scope="module")
def models() -> tuple[Gemma3, Gemma3]:
  one = Gemma3.random(Gemma3Config.preset("tiny"), seed=11, progress=False)
  return one, one.shard(DEVICES)

def axis_of(t: Tensor):
  assert isinstance(t.lazydata, MultiLazyBuffer), t.lazydata
  return t.lazydata.axis

def run_steps(model: Gemma3) -> list[np.ndarray]:
  """Logits of a prefill (its last position: the kernels the captured prefill runs too), an extend of three tokens
  (every position) and greedy decode steps, without the JIT."""
  model.reset_cache(1, CONTEXT)
  out = [model(Tensor(np.array([PROMPT], np.int32), device=model.device), 0, last_only=True).numpy()[0]]
  out.append(model(Tensor(np.array([EXTEND], np.int32), device=model.device), len(PROMPT)).numpy()[0])
  for k in range(DECODE_STEPS):
    token = int(out[-1][-1].argmax())
    out.append(model(Tensor(np.array([[token]], np.int32), device=model.device), len(PROMPT) + len(EXTEND) + k,
                     last_only=True).numpy()[0])
  return out

def test_sharded_logits_equal_one_device(models):
  one, sharded = models
  for step, (a, b) in enumerate(zip(run_steps(one), run_steps(sharded))):
    assert a.shape == b.shape
    np.testing.assert_allclose(b, a, rtol=0, atol=LOGIT_TOLERANCE * max(1.0, np.abs(a).max()), err_msg=f"step {step}")
    np.testing.assert_array_equal(b.argmax(-1), a.argmax(-1))

def test_sharded_greedy_ids_equal_one_device_with_the_jit(models):
  one, sharded = models
  # the cache of run_steps: the same kernels, compiled once
  want = generate(one, PROMPT, 8, jit=True, max_context=CONTEXT).ids
  got = generate(sharded, PROMPT, 8, jit=True, max_context=CONTEXT).ids
  assert got == want and len(got) == 8
  assert sharded._decode_jit is not None and sharded._decode_jit.captured is not None   # later steps were replays

def cross_device_steps(model: Gemma3, ids: list[int], start: int) -> tuple[list[int], list[int]]:
  """What one forward call schedules across devices (its logits left on the devices): the byte counts of the outputs
  of its collective steps (one per all-reduce, whatever the device count), and of its device-to-device copies."""
  items: list = []
  def recording(scheduler):
    def record(*args, **kwargs):
      out = scheduler(*args, **kwargs)
      items.extend(out)
      return out
    return record
  # both ways realize schedules: the full walk and a cache hit's (an eager plan holds kernels only: no copy or
  # collective runs without one of these)
  schedule, schedule_found = realize_module.schedule, realize_module.schedule_found
  realize_module.schedule, realize_module.schedule_found = recording(schedule), recording(schedule_found)
  try: model(Tensor(np.array([ids], np.int32), device=model.device), start, last_only=True)
  finally: realize_module.schedule, realize_module.schedule_found = schedule, schedule_found
  collectives = [item.bufs[0].nbytes for item in items if item.ast.op is Ops.COLLECTIVE]
  copies = [item.bufs[0].nbytes for item in items if item.ast.op is Ops.COPY and item.host_data is None
            and item.bufs[0].device != item.bufs[1].device]
  return collectives, copies

def test_two_all_reduces_per_layer_and_nothing_else(models):
  """Each all-reduce is one collective step over both devices of one [B, T, hidden] float32 value: one per block
  half, 2 per layer; no copy between devices (a hidden gather, a split axis reshaped or sliced, would add them)."""
  _, sharded = models
  config = sharded.config
  layers, hidden_bytes = config.num_hidden_layers, config.hidden_size * 4
  sharded.reset_cache(1, CONTEXT)
  prefill, prefill_copies = cross_device_steps(sharded, PROMPT, 0)
  assert prefill_copies == []
  assert len(prefill) == 2 * layers and len(set(prefill)) == 1 and prefill[0] % hidden_bytes == 0
  decode, decode_copies = cross_device_steps(sharded, [7], len(PROMPT))
  assert decode_copies == [] and decode == [hidden_bytes] * (2 * layers)

def test_weights_are_placed_megatron_style(models):
  one, sharded = models
  state, config = sharded.state_dict(), sharded.config
  p = "model.layers.0."
  expected = {"self_attn.q_proj.weight": 0, "self_attn.k_proj.weight": None, "self_attn.v_proj.weight": None,
              "self_attn.o_proj.weight": 1, "mlp.gate_proj.weight": 0, "mlp.up_proj.weight": 0,
              "mlp.down_proj.weight": 1, "input_layernorm.weight": None}
  for name, axis in expected.items():
    assert axis_of(state[p + name]) == axis, name
    np.testing.assert_array_equal(state[p + name].numpy(), one.state_dict()[p + name].numpy(), err_msg=name)
  assert axis_of(state["model.embed_tokens.weight"]) is None and axis_of(sharded.head_weight) == 0
  # one stacked buffer per device: its q heads (half), k and v (whole); its gate and up rows (half each)
  attention, mlp = sharded.model.layers[0].self_attn, sharded.model.layers[0].mlp
  (qkv,), (gate_up,) = attention.qkv_weights, mlp.gate_up_weights
  D, heads, kv_heads = config.head_dim, config.num_attention_heads, config.num_key_value_heads
  assert [s.shape for s in qkv.lazydata.shards] == [((heads // 2 + 2 * kv_heads) * D, config.hidden_size)] * 2
  assert [s.shape for s in gate_up.lazydata.shards] == [(config.intermediate_size, config.hidden_size)] * 2
  assert all(s.realized is not None for s in qkv.lazydata.shards + gate_up.lazydata.shards)
  # the KV cache: replicated, each device its own buffer (made here: this test may run before any other uses the model)
  sharded.reset_cache(1, CONTEXT)
  assert all(axis_of(t) is None and len({s.device for s in t.lazydata.shards}) == 2 for t in sharded.cache.tensors())

def test_bad_splits_raise(models):
  one, _ = models
  with pytest.raises(ValueError, match="num_attention_heads"):   # tiny has 2 query heads: not over 3 devices
    one.shard(("LLVM:0", "LLVM:1", "LLVM:2"))
  with pytest.raises(ValueError, match="two or more distinct devices"): one.shard(("LLVM:0", "LLVM:0"))

# ---- packed (GGUF-quantized) weights

def packed_model(seed: int) -> Gemma3:
  """A small model whose projections and embedding are Q8_0 blocks (llama.cpp's quantizer, gguf.quants), with input
  sizes of whole blocks (the tiny preset's hidden size, 80, is not)."""
  gguf = pytest.importorskip("gguf")
  config = dataclasses.replace(Gemma3Config.preset("tiny"), hidden_size=64, head_dim=32, intermediate_size=128)
  weights = {}
  for name, w in Gemma3.random(config, seed=seed, progress=False).state_dict().items():
    if name.endswith("proj.weight") or name.endswith("embed_tokens.weight"):
      blocks = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0)
      weights[name] = QuantizedTensor.from_bytes(blocks, GGMLType.Q8_0, w.shape)
    else: weights[name] = w
  return Gemma3(config, weights)

def test_packed_weights_shard_by_rows_and_equal_one_device():
  one = packed_model(5)
  sharded = one.shard(DEVICES)
  state = sharded.state_dict()
  for name, weight in state.items():
    if not isinstance(weight, QuantizedTensor): continue
    axis = axis_of(weight.packed)
    assert axis == (0 if name.endswith(("q_proj.weight", "gate_proj.weight", "up_proj.weight")) else None), name
  one_logits, sharded_logits = run_steps(one), run_steps(sharded)
  for step, (a, b) in enumerate(zip(one_logits, sharded_logits)):
    np.testing.assert_allclose(b, a, rtol=0, atol=LOGIT_TOLERANCE * max(1.0, np.abs(a).max()), err_msg=f"step {step}")
    np.testing.assert_array_equal(b.argmax(-1), a.argmax(-1))
  # the decode step: two all-reduces a layer and two for the argmax, no copy between devices
  with schedule_only() as items:
    sharded.reset_cache(1, CONTEXT)
    sharded._decode_inputs(1)
    items.clear()
    sharded._decode_step(*sharded.cache.decode_variables(len(PROMPT)))
  collectives = [item.ast.arg.kind for item in items if item.ast.op is Ops.COLLECTIVE]
  assert collectives == ["all_reduce"] * (2 * one.config.num_hidden_layers + 2)
  assert not [item for item in items if item.ast.op is Ops.COPY and item.host_data is None]

# ---- the two sharded-tensor operations the model needed

def test_gather_from_a_replicated_table():
  table = np.arange(40, dtype=np.float32).reshape(10, 4)
  ids = np.array([[3, 1, 9], [0, 9, 2]], np.int32)
  replicated = Tensor(table).shard(DEVICES)
  got = replicated[Tensor(ids).shard(DEVICES)]
  assert axis_of(got) is None
  np.testing.assert_array_equal(got.numpy(), table[ids])
  by_rows = replicated[Tensor(ids).shard(DEVICES, 0)]   # the index split: the result split the same way
  assert axis_of(by_rows) == 0
  np.testing.assert_array_equal(by_rows.numpy(), table[ids])
  by_columns = Tensor(table).shard(DEVICES, 1)   # split along another axis than the gathered one: split alike
  rows = np.array([[9, 0, 3, 3], [1, 1, 8, 2]], np.int32)
  got = by_columns.gather(0, Tensor(rows).shard(DEVICES))
  assert axis_of(got) == 1
  np.testing.assert_array_equal(got.numpy(), np.take_along_axis(table, rows, 0))
  with pytest.raises(NotImplementedError, match="gather it to one device first"):
    Tensor(table).shard(DEVICES, 0)[Tensor(ids).shard(DEVICES)]

def test_argmax_of_logits_split_by_vocabulary():
  """A gemma-3-270m-sized vocabulary (its argmax runs in chunks): numpy's argmax, ties across the devices' parts and
  NaN included, with nothing gathered: two all-reduces of one value a row and no copy between devices."""
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((4, 262144)).astype(np.float32)
  logits[1, [7, 200000]] = 50.0          # a tie across the two parts: the first wins
  logits[2, [131072, 131073]] = 60.0     # a tie at the start of the second part
  logits[3, 150000] = np.nan             # NaN counts as the largest, as numpy's
  got = Tensor(logits).shard(DEVICES, 1).realize().argmax(-1, keepdim=True)
  assert axis_of(got) is None and got.shape == (4, 1)
  steps = create_schedule([s for s in got.lazydata.shards])
  assert [item.bufs[0].nbytes for item in steps if item.ast.op is Ops.COLLECTIVE] == [4 * 4, 4 * 4]
  assert not [item for item in steps if item.ast.op is Ops.COPY]
  np.testing.assert_array_equal(got.numpy().reshape(-1), np.argmax(logits, -1))

def test_assign_region_of_sharded_tensors():
  from tgrad.shape.sint import Variable
  start = Variable("row", 0, 5)
  base = np.arange(48, dtype=np.float32).reshape(6, 8)
  for axis in (None, 1):
    t = Tensor(base).shard(DEVICES, axis).contiguous().realize()
    row = np.full((1, 8), -1.0, np.float32)
    t.assign_region(((start.bind(4), start.bind(4) + 1), None), Tensor(row).shard(DEVICES, axis))
    want = base.copy()
    want[4] = -1.0
    np.testing.assert_array_equal(t.numpy(), want)
    assert axis_of(t) == axis and all(Tensor(s).realize().numpy().shape == (6, 8 if axis is None else 4)
                                      for s in t.lazydata.shards)
  split = Tensor(base).shard(DEVICES, 1).contiguous().realize()
  with pytest.raises(ValueError, match="cover that axis whole"):
    split.assign_region((None, (0, 4)), Tensor(np.zeros((6, 4), np.float32)).shard(DEVICES, 1))

def test_gemma_270m_decode_step_over_two_gpus_is_scheduled_without_gathers():
  """gemma-3-270m's tensor-parallel decode step on CUDA:0/CUDA:1, scheduled without a GPU (bench/decode_kernels.py):
  two all-reduces (collective steps) of the [1, 1, 640] float32 block output per layer, two of one number for the
  greedy argmax over the 262,144-token vocabulary, and no copy between devices; as many kernels on each device."""
  items = decode_step_items("270m", dtype="float16", devices=("CUDA:0", "CUDA:1"))
  copies = [item.bufs[0].nbytes for item in items if item.ast.op is Ops.COPY and item.host_data is None]
  collectives = [item.bufs[0].nbytes for item in items if item.ast.op is Ops.COLLECTIVE]
  layers, hidden = Gemma3Config.preset("270m").num_hidden_layers, Gemma3Config.preset("270m").hidden_size
  assert copies == []
  assert sorted(collectives) == sorted([hidden * 4] * 2 * layers + [2, 4]), sorted(set(collectives))   # fp16 max, index
  per_device = Counter(item.outputs[0].device for item in items if item.ast.op is Ops.SINK)
  assert set(per_device) == {"CUDA", "CUDA:1"} and per_device["CUDA"] == per_device["CUDA:1"]
