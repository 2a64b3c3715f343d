"""TinyJit and CompiledGraph: replays equal eager runs (seeded random models, training steps with optimizer and
BatchNorm state), memory planning on and off gives identical results with no two live activations sharing bytes,
the memory estimate and the out-of-memory check, and the documented footguns raise clear errors."""
import subprocess, sys
import numpy as np
import pytest
from tgrad import Tensor, TinyJit, nn
from tgrad.device import Device, OutOfMemoryError
from tgrad.helpers import Context
from tgrad.jit import ACTIVATION, INPUT, STATE, WEIGHT, JitError
from tgrad.nn.optim import SGD, Adam
from tgrad.nn.state import get_parameters

@pytest.fixture(autouse=True)
def on_the_cpu():
  """Every test here runs on LLVM (the memory checks name it) unless it sets another device itself."""
  with Context(DEVICE="LLVM"): yield

def random_model(seed: int):
  """A small MLP with a random depth, widths and activations, and a numpy-free way to run it."""
  rng = np.random.default_rng(seed)
  widths = [int(w) for w in rng.integers(3, 17, size=int(rng.integers(2, 5)))]
  Tensor.manual_seed(seed)
  layers = [nn.Linear(a, b) for a, b in zip(widths, widths[1:])]
  activations = [["relu", "gelu", "tanh", "sigmoid"][int(i)] for i in rng.integers(0, 4, size=len(layers))]
  def forward(x: Tensor) -> Tensor:
    for layer, act in zip(layers, activations): x = getattr(layer(x), act)()
    return x.softmax(-1)
  return widths, forward

@pytest.mark.parametrize("seed", range(6))
def test_replay_equals_eager_on_random_models(seed: int):
  widths, forward = random_model(seed)
  calls = []
  def counted(x: Tensor) -> Tensor:
    calls.append(1)
    return forward(x)
  jitted = TinyJit(counted)
  rng = np.random.default_rng(100 + seed)
  for step in range(5):
    batch = int(rng.integers(1, 4)) if step == 0 else 3   # shapes after the capture must match it
    data = rng.standard_normal((3 if step else batch, widths[0]), dtype=np.float32)
    got = jitted(Tensor(data)).numpy()
    np.testing.assert_array_equal(got, forward(Tensor(data)).numpy())   # the same kernels: bitwise equal
  assert len(calls) == 2 and jitted.captured is not None and len(jitted.captured.instructions) >= len(widths) - 1

@pytest.mark.parametrize("seed", range(4))
def test_planning_on_and_off_give_identical_results(seed: int):
  widths, forward = random_model(seed)
  data = [np.random.default_rng(seed * 10 + i).standard_normal((4, widths[0]), dtype=np.float32) for i in range(4)]
  results, graphs = {}, {}
  for plan in (0, 1):
    with Context(JIT_PLAN=plan):
      jitted = TinyJit(forward)
      results[plan] = [jitted(Tensor(d)).numpy() for d in data]
      graphs[plan] = jitted.captured
  for planned, unplanned in zip(results[1], results[0]): np.testing.assert_array_equal(planned, unplanned)
  check_no_live_overlap(graphs[1])
  planned, unplanned = graphs[1].memory_breakdown()["LLVM"], graphs[0].memory_breakdown()["LLVM"]
  assert planned[ACTIVATION] <= unplanned["activations unplanned"] + 256 * len(graphs[1].lifetimes)
  assert graphs[0].arena_plans == {} and unplanned[ACTIVATION] == unplanned["activations unplanned"]

def check_no_live_overlap(graph) -> None:
  """Activations live at the same time occupy disjoint bytes of their arena."""
  lifetimes = graph.lifetimes
  for a in lifetimes:
    for b in lifetimes:
      if a < b and lifetimes[a].overlaps(lifetimes[b]) and graph.slots[a].device == graph.slots[b].device:
        start_a, start_b = graph.slots[a].offset, graph.slots[b].offset
        assert start_a + graph.slots[a].nbytes <= start_b or start_b + graph.slots[b].nbytes <= start_a

def test_a_long_chain_reuses_activation_memory():
  x0 = Tensor(np.ones((64, 64), np.float32)).realize()
  def chain(x: Tensor) -> Tensor:
    for _ in range(8): x = (x @ x0 * 0.01).contiguous()
    return x
  jitted = TinyJit(chain)
  for _ in range(3): out = jitted(Tensor(np.ones((64, 64), np.float32))).numpy()
  np.testing.assert_allclose(out, chain(Tensor(np.ones((64, 64), np.float32))).numpy(), rtol=1e-6)
  parts = jitted.captured.memory_breakdown()["LLVM"]
  assert parts["activations unplanned"] == 7 * 64 * 64 * 4 and parts[ACTIVATION] == 2 * 64 * 64 * 4
  check_no_live_overlap(jitted.captured)

def make_classifier(seed: int, optimizer: str, batchnorm: bool):
  Tensor.manual_seed(seed)
  layers = [nn.Linear(6, 12), nn.Linear(12, 4)]
  norm = nn.BatchNorm(12) if batchnorm else None
  params = get_parameters(layers) + (get_parameters(norm) if norm else [])
  opt = SGD(params, lr=0.1, momentum=0.9) if optimizer == "sgd" else Adam(params, lr=0.01)
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      h = layers[0](x)
      if norm is not None: h = norm(h)
      loss = layers[1](h.relu()).sparse_categorical_crossentropy(y)
      loss.backward()
      Tensor.realize(loss, *opt.schedule_step())   # the loss reads the weights the step overwrites
    return loss
  return step, params

@pytest.mark.parametrize("optimizer,batchnorm", [("sgd", False), ("adam", False), ("adam", True)])
def test_training_step_with_jit_equals_without(optimizer: str, batchnorm: bool):
  """Forward, backward and the optimizer's in-place updates (weights, moments, BatchNorm statistics) replayed."""
  eager_step, eager_params = make_classifier(0, optimizer, batchnorm)
  jit_step, jit_params = make_classifier(0, optimizer, batchnorm)
  jitted = TinyJit(jit_step)
  rng = np.random.default_rng(1)
  for _ in range(6):
    x, y = rng.standard_normal((8, 6), dtype=np.float32), rng.integers(0, 4, 8).astype(np.int32)
    want = eager_step(Tensor(x), Tensor(y)).numpy()
    np.testing.assert_array_equal(jitted(Tensor(x), Tensor(y)).numpy(), want)
  for a, b in zip(eager_params, jit_params): np.testing.assert_array_equal(a.numpy(), b.numpy())
  kinds = {slot.kind for slot in jitted.captured.slots}
  assert {INPUT, STATE, ACTIVATION} <= kinds

def test_buffer_kinds():
  w = Tensor(np.arange(4, dtype=np.float32)).realize()        # read only: a weight
  total = Tensor.zeros(4).contiguous().realize()               # assigned: state
  def f(x: Tensor) -> Tensor:
    total.assign(total + x).realize()
    return (x * w + 1).contiguous() * 2                        # the contiguous value is an activation
  jitted = TinyJit(f)
  for i in range(3): out = jitted(Tensor(np.full(4, i, np.float32)))
  np.testing.assert_array_equal(total.numpy(), np.full(4, 3, np.float32))
  np.testing.assert_array_equal(out.numpy(), (2 * np.arange(4) + 1) * 2)
  graph = jitted.captured
  kind_of = {id(slot.buffer): slot.kind for slot in graph.slots if slot.kind != INPUT}
  assert kind_of[id(w.lazydata.base.buffer)] == WEIGHT and kind_of[id(total.lazydata.base.buffer)] == STATE
  assert kind_of[id(out.lazydata.base.buffer)] == STATE and list(kind_of.values()).count(ACTIVATION) == 1

def test_outputs_alias_the_jit_buffers():
  jitted = TinyJit(lambda x: x * 2)
  first = [jitted(Tensor(np.full(3, i, np.float32))) for i in range(3)]
  assert first[1] is first[2]
  kept = first[2].numpy()
  again = jitted(Tensor(np.full(3, 7, np.float32)))
  assert again is first[2] and np.array_equal(first[2].numpy(), np.full(3, 14, np.float32))
  np.testing.assert_array_equal(kept, np.full(3, 4, np.float32))   # a copy taken before stays

def test_rand_inside_gives_new_numbers_each_call():
  def noisy(x: Tensor) -> Tensor: return x + Tensor.rand(16)
  zeros = Tensor.zeros(16).contiguous().realize()
  Tensor.manual_seed(3)
  eager = [noisy(zeros).numpy() for _ in range(5)]
  Tensor.manual_seed(3)
  jitted = TinyJit(noisy)
  replayed = [jitted(zeros).numpy() for _ in range(5)]
  for a, b in zip(eager, replayed): np.testing.assert_array_equal(a, b)   # the same stream as without the JIT
  assert len({tuple(r) for r in replayed}) == 5

def test_reading_values_inside_a_capture_raises():
  @TinyJit
  def f(x: Tensor) -> Tensor: return x * (x.sum().item() if True else 1)
  f(Tensor.ones(3))
  with pytest.raises(JitError, match=r"\.numpy\(\), \.item\(\)"): f(Tensor.ones(3))

def test_the_same_tensor_twice_raises():
  jitted = TinyJit(lambda a, b: a + b)
  x = Tensor.ones(4).contiguous().realize()
  with pytest.raises(JitError, match="'a' and 'b' are the same tensor"): jitted(x, x)

def test_a_function_without_kernels_says_so():
  jitted = TinyJit(lambda x: 3)
  jitted(Tensor.ones(2))
  with pytest.raises(JitError, match="ran no kernel"): jitted(Tensor.ones(2))

def test_arguments_are_checked_against_the_capture():
  jitted = TinyJit(lambda x, scale: x * scale)
  for _ in range(3): jitted(Tensor.ones(2, 3), 2.0)
  with pytest.raises(JitError, match=r"'x' differs.*shape \(3, 2\)"): jitted(Tensor.ones(3, 2), 2.0)
  with pytest.raises(JitError, match="'x' differs.*dtype"): jitted(Tensor.ones(2, 3, dtype="float16"), 2.0)
  with pytest.raises(JitError, match="'x' differs.*view"): jitted(Tensor.ones(3, 2).contiguous().T, 2.0)
  with pytest.raises(JitError, match="'scale' is 3.0 in this call but was 2.0"): jitted(Tensor.ones(2, 3), 3.0)
  with pytest.raises(JitError, match="holds Tensors"): jitted([Tensor.ones(2, 3)], 2.0)

def test_feeding_an_output_back_raises():
  jitted = TinyJit(lambda x: x + 1)
  x = Tensor.zeros(4).contiguous()
  for _ in range(2): x = jitted(x) + 0
  out = jitted(x)
  with pytest.raises(JitError, match="buffer the compiled program writes"): jitted(out)

def test_reset_captures_again_and_methods_can_be_jitted():
  class Scaler:
    def __init__(self, k: float): self.k = Tensor([k]).realize()
    @TinyJit
    def __call__(self, x: Tensor) -> Tensor: return x * self.k
  scaler = Scaler(3.0)
  for i in range(3): np.testing.assert_array_equal(scaler(Tensor.full((2,), i)).numpy(), [3.0 * i] * 2)
  with pytest.raises(JitError, match="'self' is"): Scaler(5.0)(Tensor.full((2,), 1))   # another instance
  Scaler.__call__.reset()
  other = Scaler(5.0)
  for _ in range(3): np.testing.assert_array_equal(other(Tensor.full((4,), 1)).numpy(), [5.0] * 4)

def test_print_lists_one_instruction_per_line():
  jitted = TinyJit(lambda x: (x.exp() + 1).contiguous().sum())
  for _ in range(3): jitted(Tensor(np.ones((5, 5), np.float32)))
  graph = jitted.captured
  lines = str(graph).splitlines()
  assert len(graph.instructions) == 2 and len(lines) == 2 + 2   # header, LLVM's memory, one line per instruction
  for line, ins in zip(lines[2:], graph.instructions): assert ins.name in line and "global (" in line
  assert lines[2].endswith("activation#1@0+100 input:x#0@0+100") and lines[3].endswith("state#2@0+4 activation#1@0+100")

def test_estimate_memory_and_out_of_memory_before_any_launch(monkeypatch):
  w = Tensor(np.ones((32, 32), np.float32)).realize()
  total = Tensor.zeros(32).contiguous().realize()
  def f(x: Tensor) -> Tensor:
    total.assign(total + 1).realize()
    return (x @ w).relu().sum(0)
  jitted = TinyJit(f)
  jitted(Tensor(np.ones((8, 32), np.float32)))
  monkeypatch.setattr(type(Device["LLVM"]), "available_memory", lambda self: 100)
  with pytest.raises(OutOfMemoryError, match=r"LLVM: a TinyJit's compiled graph needs \d+ bytes .* only 100 bytes"):
    jitted(Tensor(np.ones((8, 32), np.float32)))
  assert isinstance(OutOfMemoryError("LLVM", 1, 0), MemoryError)
  np.testing.assert_array_equal(total.numpy(), np.ones(32, np.float32))   # the capture call launched nothing
  monkeypatch.undo()
  for _ in range(2): jitted(Tensor(np.ones((8, 32), np.float32)))
  estimate, parts = jitted.captured.estimate_memory(), jitted.captured.memory_breakdown()["LLVM"]
  assert parts[WEIGHT] == 32 * 32 * 4 and parts[INPUT] == 8 * 32 * 4
  assert estimate == {"LLVM": parts[WEIGHT] + parts[STATE] + parts[ACTIVATION] + parts[INPUT]}

def test_invalid_plan_switch():
  jitted = TinyJit(lambda x: x + 1)
  jitted(Tensor.ones(2))
  with pytest.raises(ValueError, match="JIT_PLAN=2 is not valid: expected 0 or 1"), Context(JIT_PLAN=2):
    jitted(Tensor.ones(2))

def test_graph_building_starts_no_device():
  code = ("import sys; from tgrad import Tensor; import numpy as np\n"
          "x = Tensor(np.ones((4, 1 << 16), np.float32), device='LLVM')\n"
          "y = (x.sum(1) + Tensor.rand(4, device='LLVM')).softmax(0)\n"
          # the device packages register themselves at import; none of their modules may load
          "print([m for m in sys.modules if m.startswith('tgrad.runtime.') and m.count('.') > 2])")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
  assert out.strip() == "[]"

@pytest.mark.gpu
@pytest.mark.parametrize("plan", [0, 1])
def test_cuda_replay_equals_eager(plan: int):
  """On the GPU: planned activations are views (address + offset) of one arena; replays equal eager runs."""
  with Context(DEVICE="CUDA"): widths, forward = random_model(7)
  rng = np.random.default_rng(7)
  with Context(JIT_PLAN=plan, DEVICE="CUDA"):
    jitted = TinyJit(lambda x: forward(x))
    for _ in range(4):
      data = rng.standard_normal((5, widths[0]), dtype=np.float32)
      got = jitted(Tensor(data, device="CUDA")).numpy()
      np.testing.assert_array_equal(got, forward(Tensor(data, device="CUDA")).numpy())
  assert jitted.captured.estimate_memory().keys() == {"CUDA"}
  if plan: check_no_live_overlap(jitted.captured)
