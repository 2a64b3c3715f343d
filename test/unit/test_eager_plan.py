"""The eager plan (tgrad/realize.py): a schedule-cache hit lowered before launches its kernels straight on the hit's
Buffers. It must compute exactly what the full path (ScheduleItems, ExecItems, run) computes, bit for bit (the same
kernels run), and must not be taken where something records or watches the launches: a TinyJit capture, the
profiler, DEBUG output. Whether it was taken is seen from `lower_schedule`, which the planned path never calls."""
import numpy as np
import pytest
from tgrad import Tensor, TinyJit, profiler
from tgrad import realize as realize_module
from tgrad import schedule_cache
from tgrad.helpers import Context

SEED = 20261127
SHAPES = [(16,), (3, 5), (1,), (), (7, 1), (2, 3, 4)]

@pytest.fixture
def lowerings(monkeypatch):
  """A list that counts the calls of lower_schedule (the full path's; the planned path makes none)."""
  calls: list[int] = []
  lower = realize_module.lower_schedule
  def counted(items):
    calls.append(len(items))
    return lower(items)
  monkeypatch.setattr(realize_module, "lower_schedule", counted)
  return calls

@pytest.fixture
def fresh_templates():
  """No template (nor plan) from before the test, and none it made left after it."""
  schedule_cache.clear()
  yield
  schedule_cache.clear()

def _no_plans(monkeypatch) -> None:
  """Every realize from here on takes the full path: the plans kept are forgotten and no new one is made."""
  for template in schedule_cache._templates.values(): template.plan = None
  schedule_cache.eager_launches.clear()   # the one-kernel plans kept under eager keys too
  monkeypatch.setattr(realize_module, "_plan_of",
                      lambda template, items, settings: (settings, None, False, realize_module._runner_cache))

def _random_op(rng: np.random.Generator, shape: tuple):
  """(a tensor function of two tensors of `shape`, its numpy twin): an elementwise op, with a Python scalar, a view
  or a reduction, picked by rng."""
  scalar = float(np.float32(rng.uniform(-2, 2)))
  ops = [
    (lambda a, b: a + b, lambda a, b: a + b),
    (lambda a, b: a * b - a, lambda a, b: a * b - a),
    (lambda a, b: a * scalar, lambda a, b: a * np.float32(scalar)),
    (lambda a, b: a.maximum(b), np.maximum),
    (lambda a, b: (a < b).where(a, b), lambda a, b: np.where(a < b, a, b)),
    (lambda a, b: a.exp() + 1, lambda a, b: np.exp(a) + 1),
    (lambda a, b: a.sum(), lambda a, b: a.sum()),
    (lambda a, b: a.reshape(-1)[::2] + scalar, lambda a, b: a.reshape(-1)[::2] + np.float32(scalar)),
  ]
  if len(shape) >= 2: ops.append((lambda a, b: a.T - b.T, lambda a, b: a.T - b.T))
  return ops[rng.integers(len(ops))]

def _program(seed: int) -> list:
  """A seeded list of (operands, tensor function, numpy function)."""
  rng = np.random.default_rng(seed)
  program = []
  for _ in range(24):
    shape = SHAPES[rng.integers(len(SHAPES))]
    a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    program.append(((a, b), *_random_op(rng, shape)))
  return program

def _run(program: list, lowerings: list[int], repeats: int = 3) -> list[np.ndarray]:
  """Every op of the program `repeats` times on fresh graphs (the later times hit the schedule cache), its values;
  `lowerings` counts the ops' lowerings only (not the operands' copies from the host)."""
  operands = [(Tensor(a, device="LLVM").realize(), Tensor(b, device="LLVM").realize()) for (a, b), _, _ in program]
  lowerings.clear()
  return [fn(a, b).realize().numpy() for (a, b), (_, fn, _) in zip(operands, program) for _ in range(repeats)]

def test_the_plan_computes_what_the_full_path_does(monkeypatch, lowerings, fresh_templates):
  program = _program(SEED)
  planned = _run(program, lowerings)
  assert len(lowerings) <= len(program), "only an op's first realize should lower: the repeats take the plan"
  for got, ((a, b), _, numpy_fn) in zip(planned[::3], program):
    np.testing.assert_allclose(got, numpy_fn(a, b), rtol=1e-5, atol=1e-5)
  _no_plans(monkeypatch)
  full = _run(program, lowerings)
  assert len(lowerings) >= len(full), "with plans off, every realize lowers"
  for got, want in zip(planned, full): np.testing.assert_array_equal(got, want)   # the same kernels: bit for bit

def test_a_scalar_parameter_is_read_on_every_planned_hit(lowerings):
  """`a + s` with a lifted Python scalar shares one schedule for every s: the plan reads each call's value."""
  a = Tensor(np.arange(5, dtype=np.float32), device="LLVM").realize()
  for s in (1.5, 2.5, -3.0): (a + s).numpy()
  lowerings.clear()
  for s in (0.25, 7.5, -2.5):
    np.testing.assert_array_equal((a + s).numpy(), np.arange(5, dtype=np.float32) + np.float32(s))
  assert not lowerings, "scalar-only changes should hit the plan"

def _warm(a: Tensor, b: Tensor) -> None:
  for _ in range(3): (a + b).realize()

def _operands():
  rng = np.random.default_rng(SEED)
  return (Tensor(rng.standard_normal(9).astype(np.float32), device="LLVM").realize(),
          Tensor(rng.standard_normal(9).astype(np.float32), device="LLVM").realize())

def test_the_plan_is_not_taken_at_debug(lowerings, capsys):
  a, b = _operands()
  _warm(a, b)
  lowerings.clear()
  with Context(DEBUG=1): out = (a + b).realize()
  assert lowerings == [1]
  assert "realized 1 schedule items" in capsys.readouterr().out
  np.testing.assert_allclose(out.numpy(), a.numpy() + b.numpy(), rtol=1e-6)

def test_the_plan_is_not_taken_while_profiling(lowerings):
  a, b = _operands()
  _warm(a, b)
  lowerings.clear()
  with profiler.profile() as trace: out = (a + b).realize()
  assert lowerings == [1]
  assert any(event.get("name") == "launch" for event in trace.events), "the profiler saw no launch"
  np.testing.assert_allclose(out.numpy(), a.numpy() + b.numpy(), rtol=1e-6)

def test_the_plan_is_not_taken_in_a_capture(lowerings):
  a, b = _operands()
  _warm(a, b)
  @TinyJit
  def add(x: Tensor, y: Tensor) -> Tensor: return (x + y).realize()
  add(a, b)   # call 1 runs eagerly (the plan may serve it)
  lowerings.clear()
  out = add(a, b)   # call 2 captures: realize records ExecItems
  assert sum(lowerings) == 1, "the captured op should be lowered into the capture"
  np.testing.assert_allclose(out.numpy(), a.numpy() + b.numpy(), rtol=1e-6)
  c = Tensor(np.full(9, 2.0, dtype=np.float32), device="LLVM").realize()
  np.testing.assert_allclose(add(a, c).numpy(), a.numpy() + 2, rtol=1e-6)   # a replay

def test_a_write_is_never_planned(lowerings):
  """An ASSIGN may need old values kept first (docs/semantics.md): every `assign` takes the full path, and a value
  built before the write keeps the old data."""
  a, b = _operands()
  start = a.numpy()
  for _ in range(3): a.assign(a + 1).realize()
  lowerings.clear()
  pending = a + b
  a.assign(a + 1).realize()
  assert lowerings, "the in-place write should lower"
  np.testing.assert_allclose(pending.numpy(), start + 3 + b.numpy(), rtol=1e-6)
  np.testing.assert_allclose(a.numpy(), start + 4, rtol=1e-6)

def test_a_bounds_check_still_raises_on_a_planned_schedule():
  table = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="LLVM").realize()
  def index(values): return (Tensor(np.asarray(values, dtype=np.int32), device="LLVM").realize() + 0)
  for _ in range(3): np.testing.assert_array_equal(table[index([0, 2])].numpy(), np.arange(12).reshape(3, 4)[[0, 2]])
  with pytest.raises(IndexError, match="index 5 is out of bounds"): table[index([0, 5])].numpy()

def test_a_replaced_runner_cache_voids_the_plans(monkeypatch, lowerings):
  """A plan holds the runners of the cache it was made from: with a fresh runner cache the op lowers (and compiles)
  again, as it did before plans existed."""
  a, b = _operands()
  _warm(a, b)
  monkeypatch.setattr(realize_module, "_runner_cache", {})
  lowerings.clear()
  np.testing.assert_allclose((a + b).realize().numpy(), a.numpy() + b.numpy(), rtol=1e-6)
  assert lowerings == [1] and len(realize_module._runner_cache) == 1

def test_a_kernel_on_several_cores_is_planned_too(lowerings):
  """A big elementwise op runs on every core (a THREAD launch, where the machine has several): its planned launch
  covers all of them."""
  rng = np.random.default_rng(SEED)
  a_np, b_np = (rng.standard_normal((512, 512)).astype(np.float32) for _ in range(2))
  a, b = Tensor(a_np, device="LLVM").realize(), Tensor(b_np, device="LLVM").realize()
  (a * b + a).numpy()
  lowerings.clear()
  for _ in range(2): np.testing.assert_allclose((a * b + a).numpy(), a_np * b_np + a_np, rtol=1e-5, atol=1e-6)
  assert not lowerings
