"""The collective step (ops.COLLECTIVE, schedule rule 4, realize.collective_runner, jit.device_runs) on CPU devices
LLVM:0..2: a sharded reduce, a matmul contracting the split axis and data-parallel training go through one step over
every device's buffers, equal to numpy and to one device within float32 reassociation; TinyJit records and replays
the step; a kind's own collectives library (NCCL on CUDA, a host stand-in here) is what lowering picks when the kind
has one. The same on two GPUs at the end (skipped without them)."""
import re
import numpy as np
import pytest
from tgrad import Tensor, TinyJit
import tgrad.nn as nn
from tgrad.jit import Instruction, device_runs
from tgrad.multi.collectives import all_reduce_nodes
from tgrad.multi.runners import CopyCollective, LibraryCollective
from tgrad.nn.optim import SGD
from tgrad.nn.state import get_parameters
from tgrad.dtype import dtypes
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops, UOp
from tgrad.realize import lower_schedule
from tgrad.schedule import _Step, _collectives_after_their_inputs

TWO = ("LLVM", "LLVM:1")
THREE = ("LLVM", "LLVM:1", "LLVM:2")
RTOL, ATOL = 1e-5, 1e-5   # float32 partial sums per device round differently from one sum

def rand(rng: np.random.Generator, *shape: int) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)

def shards_of(t: Tensor) -> list[np.ndarray]: return [Tensor(s, requires_grad=False).numpy() for s in t.lazydata.shards]

def collective_items(t: Tensor) -> list:
  return [item for item in t.schedule() if item.ast.op is Ops.COLLECTIVE]

@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("devices", [TWO, THREE])
def test_reduces_over_the_split_axis_are_one_collective_step(seed, devices):
  rng = np.random.default_rng(seed)
  n = len(devices)
  rows, cols = n * int(rng.integers(1, 7)), int(rng.integers(1, 9))
  a = rand(rng, rows, cols)
  x = Tensor(a).shard(devices, 0)
  for name, reduced, want in (("sum", x.sum(0), a.sum(0)), ("max", x.max(0), a.max(0)),
                              ("prod", (x * 0.1 + 1).prod(0), (a * 0.1 + 1).prod(0)),
                              ("mean all", x.mean(), a.mean())):
    [step] = collective_items(reduced)
    assert step.output_count == n and [b.device for b in step.outputs] == list(devices), name
    assert [b.device for b in step.inputs] == list(devices) and step.ast.arg.kind == "all_reduce"
    parts = shards_of(reduced)
    for part in parts[1:]: np.testing.assert_array_equal(part.view(np.uint32), parts[0].view(np.uint32))
    np.testing.assert_allclose(parts[0], want, rtol=RTOL, atol=ATOL, err_msg=name)

@pytest.mark.parametrize("seed", range(3))
def test_a_matmul_contracting_the_split_axis_all_reduces_its_partial_products(seed):
  rng = np.random.default_rng(10 + seed)
  inner = 3 * int(rng.integers(1, 6))
  a, w = rand(rng, int(rng.integers(1, 8)), inner), rand(rng, inner, int(rng.integers(1, 8)))
  y = Tensor(a).shard(THREE, 1) @ Tensor(w).shard(THREE, 0)
  assert len(collective_items(y)) == 1 and y.lazydata.axis is None
  np.testing.assert_allclose(y.numpy(), a @ w, rtol=RTOL, atol=ATOL)

def test_realizing_one_device_realizes_every_sibling_once():
  rng = np.random.default_rng(3)
  a = rand(rng, 4, 5)
  total = Tensor(a).shard(TWO, 0).sum(0)
  first, second = total.lazydata.shards
  items = Tensor(first, requires_grad=False).schedule()
  assert sum(item.ast.op is Ops.COLLECTIVE for item in items) == 1
  np.testing.assert_allclose(Tensor(first, requires_grad=False).numpy(), a.sum(0), rtol=RTOL)
  assert second.base.realized is not None   # computed by the same step: nothing left to run for it
  assert Tensor(second, requires_grad=False).schedule() == []
  np.testing.assert_array_equal(Tensor(second, requires_grad=False).numpy(), Tensor(first, requires_grad=False).numpy())

def test_a_sibling_no_one_holds_gets_a_scratch_output():
  rng = np.random.default_rng(4)
  parts = [rand(rng, 7) for _ in THREE]
  shards = [Tensor(p, device=d).realize().lazydata for p, d in zip(parts, THREE)]
  nodes = all_reduce_nodes(Ops.MAX, shards)
  kept = nodes[1]
  del nodes
  got = Tensor(kept, requires_grad=False)
  [step] = [item for item in got.schedule() if item.ast.op is Ops.COLLECTIVE]
  assert step.output_count == 3
  np.testing.assert_array_equal(got.numpy(), np.maximum(np.maximum(parts[0], parts[1]), parts[2]))

def test_copies_fold_in_device_order():
  """The copy runner's fold kernel reads the shards in rank order: (s0 + s1) + s2 bit for bit."""
  rng = np.random.default_rng(5)
  parts = [rand(rng, 33) * 10 ** float(k) for k in range(3)]
  shards = [Tensor(p, device=d).realize().lazydata for p, d in zip(parts, THREE)]
  nodes = all_reduce_nodes(Ops.ADD, shards)
  [item] = [i for i in Tensor(nodes[2], requires_grad=False).schedule() if i.ast.op is Ops.COLLECTIVE]
  [lowered] = lower_schedule([item])
  assert isinstance(lowered.runner, CopyCollective)
  lowered.run()
  want = (parts[0] + parts[1]) + parts[2]
  for out in item.outputs: np.testing.assert_array_equal(out.copyout().view(np.float32), want)

# ---- training

def mlp_step(devices, rng_seed: int, steps: int, jit: bool, batch: int = 12):
  Tensor.manual_seed(21)
  rng = np.random.default_rng(rng_seed)
  layers = [nn.Linear(7, 16), nn.Linear(16, 5)]
  params = get_parameters(layers)
  if devices:
    for p in params: p.shard_(devices)
  opt = SGD(params, lr=0.1, momentum=0.9)
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = layers[1](layers[0](x).relu()).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize(loss, *opt.schedule_step())
    return loss
  stepper = TinyJit(step) if jit else step
  losses = []
  for _ in range(steps):
    x, y = Tensor(rand(rng, batch, 7)), Tensor(rng.integers(0, 5, batch).astype(np.int32))
    if devices: x, y = x.shard(devices, 0), y.shard(devices, 0)
    losses.append(stepper(x, y).item())
  return losses, params, stepper

def kernels_between_collectives(instructions) -> dict[str, list[list[str]]]:
  """Per device, the names of its kernels (without the compile counter) before each collective and after the last."""
  segments: dict[str, list[list[str]]] = {}
  for ins in instructions:
    for device in ins.devices: segments.setdefault(device, [[]])
    if len(ins.devices) > 1:
      for device in ins.devices: segments[device].append([])
    else: segments[ins.device][-1].append(re.sub(r"_n\d+$", "", ins.name))
  return segments

@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("devices", [TWO, THREE])
def test_jitted_data_parallel_steps_replay_the_collective_and_match_one_device(seed, devices):
  one_losses, one_params, _ = mlp_step(None, seed, 5, jit=False)
  losses, params, stepper = mlp_step(devices, seed, 5, jit=True)
  graph = stepper.captured
  # every device runs the same kernels before each collective: none waits at one for another's unneeded work
  segments = kernels_between_collectives(graph.instructions)
  assert len(segments) == len(devices) and all(s == segments[devices[0]] for s in segments.values())
  collectives = [ins for ins in graph.instructions if isinstance(ins.runner, CopyCollective)]
  # one all-reduce per parameter gradient, the loss's sum and the count of labels it averages over
  assert sorted(graph.slots[ins.args[0]].size for ins in collectives) == sorted([p.numel() for p in params] + [1, 1])
  assert all(ins.devices == tuple(devices) and ins.output_count == len(devices) for ins in collectives)
  np.testing.assert_allclose(losses, one_losses, rtol=1e-5)
  for p, want in zip(params, one_params):
    first, *others = shards_of(p)
    for other in others: np.testing.assert_array_equal(first, other)
    np.testing.assert_allclose(first, want.numpy(), rtol=1e-4, atol=1e-6)

def cnn_step(devices, steps: int, jit: bool, batch: int = 8):
  """A small BatchNorm CNN (bench/multi_device.py's shape): conv, batch norm, relu, max pool, conv, linear."""
  Tensor.manual_seed(5)
  rng = np.random.default_rng(5)
  conv1, norm, conv2, head = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3), nn.Linear(16, 3)
  params = get_parameters([conv1, norm, conv2, head])
  if devices:
    for p in params: p.shard_(devices)
  opt = SGD(params, lr=0.05)
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    h = norm(conv1(x)).relu().max_pool2d(2)
    loss = head(conv2(h).relu().flatten(1)).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize(loss, *opt.schedule_step())
    return loss
  stepper = TinyJit(step) if jit else step
  losses = []
  with Tensor.train():
    for _ in range(steps):
      x, y = Tensor(rand(rng, batch, 2, 8, 8)), Tensor(rng.integers(0, 3, batch).astype(np.int32))
      if devices: x, y = x.shard(devices, 0), y.shard(devices, 0)
      losses.append(stepper(x, y).item())
  return losses, params, stepper

def test_a_jitted_data_parallel_cnn_step_is_aligned_copies_nothing_and_matches_one_device():
  one_losses, one_params, _ = cnn_step(None, 4, jit=False)
  losses, params, stepper = cnn_step(TWO, 4, jit=True)
  instructions = stepper.captured.instructions
  # the gradients' and the batch statistics' all-reduces are the only instructions over both devices: no gather,
  # broadcast or copy of the batch or the weights is on the step's path
  spanning = [ins for ins in instructions if len(ins.devices) > 1]
  assert spanning and all(isinstance(ins.runner, CopyCollective) for ins in spanning)
  assert all(len(ins.devices) > 1 or ins.runner.name not in ("copy", "copyin") for ins in instructions)
  segments = kernels_between_collectives(instructions)
  assert segments[TWO[0]] == segments[TWO[1]]
  np.testing.assert_allclose(losses, one_losses, rtol=1e-5)
  for p, want in zip(params, one_params):
    first, second = shards_of(p)
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, want.numpy(), rtol=1e-4, atol=1e-5)

def test_a_collective_runs_right_after_what_it_needs():
  """Rule 4's order: work that came before a collective in the graph without being needed by it moves after it."""
  def value(device: str) -> LazyBuffer: return LazyBuffer.loadop(Ops.EMPTY, (4,), dtypes.float32, device)
  def kernel(out, *inputs): return _Step(UOp(Ops.SINK, dtypes.void), (out,), inputs)
  a, b = TWO
  partial_b, unneeded_b, partial_a, total_a, total_b, after_a = (value(d) for d in (b, b, a, a, b, a))
  steps = [kernel(partial_b), kernel(unneeded_b, partial_b), kernel(partial_a),
           _Step(UOp(Ops.COLLECTIVE, dtypes.float32), (total_a, total_b), (partial_a, partial_b)),
           kernel(after_a, total_a)]
  ordered = _collectives_after_their_inputs(steps)
  assert [steps.index(step) for step in ordered] == [0, 2, 3, 1, 4]
  assert _collectives_after_their_inputs(steps[:3]) == steps[:3]   # no collective: unchanged

# ---- a kind's own collectives library

def test_lowering_uses_the_kinds_collectives_library(host_library):
  rng = np.random.default_rng(6)
  a = rand(rng, 6, 4)
  total = Tensor(a).shard(TWO, 0).max(0)
  np.testing.assert_array_equal(total.numpy(), a.max(0))
  [library] = host_library
  assert [d.name for d in library.devices] == list(TWO) and library.calls[0][:2] == ("all_reduce", "max")
  assert library.calls[0][3] == 4

def test_device_runs_put_a_per_device_collective_in_every_devices_run(monkeypatch):
  class Embedding:
    embeds_collectives = True
  monkeypatch.setattr("tgrad.jit.graph_runner_class", lambda device: Embedding)
  kernel = type("K", (), {"program": object(), "name": "k"})()
  collective = type("C", (), {"per_device": True, "name": "all_reduce"})()
  copy = type("Copy", (), {"name": "copy"})()
  def ins(runner, *devices): return Instruction(runner, (), devices[0], devices=devices)
  program = [ins(kernel, "A"), ins(kernel, "B"), ins(kernel, "A"), ins(collective, "A", "B"), ins(kernel, "B"),
             ins(kernel, "A"), ins(copy, "B", "A"), ins(kernel, "A")]
  def positions(runs): return [(device, [next(k for k, p in enumerate(program) if p is i) for i in run])
                                for device, run in runs]
  assert positions(device_runs(program)) == [("A", [0, 2, 3, 5]), ("B", [1, 3, 4]), ("B", [6]), ("A", [7])]
  monkeypatch.setattr("tgrad.jit.graph_runner_class", lambda device: object)   # a runner that can't embed it
  assert positions(device_runs(program)) == \
    [("A", [0, 2]), ("B", [1]), ("A", [3]), ("B", [4]), ("A", [5]), ("B", [6]), ("A", [7])]

def test_library_collective_records_one_capture_for_every_devices_part(host_library):
  rng = np.random.default_rng(7)
  shards = [Tensor(rand(rng, 5), device=d).realize().lazydata for d in TWO]
  nodes = all_reduce_nodes(Ops.ADD, shards)
  [item] = [i for i in Tensor(nodes[0], requires_grad=False).schedule() if i.ast.op is Ops.COLLECTIVE]
  [lowered] = lower_schedule([item])
  runner = lowered.runner
  assert isinstance(runner, LibraryCollective) and not runner.per_device   # the stand-in can't record
  recordings = []
  class Recording:
    def child(self, rank): return ("part", rank)
  runner.collectives.capture = lambda record: recordings.append(record) or Recording()
  runner.per_device = True
  assert runner.cuda_child_graph("LLVM:1", item.bufs) == ("part", 1)
  assert runner.cuda_child_graph("LLVM", item.bufs) == ("part", 0)
  assert len(recordings) == 1   # both parts come from one recording of the group

def test_a_data_parallel_step_through_a_library_is_one_run_per_device(host_library, monkeypatch):
  """Every all-reduce of a jitted data-parallel step is the library's, and once its parts join the devices' graphs
  (NCCL's in CUDA graphs) the step is one run per device: nothing crosses devices on the host between runs."""
  one_losses, one_params, _ = mlp_step(None, 3, 4, jit=False)
  losses, params, stepper = mlp_step(TWO, 3, 4, jit=True)
  instructions = stepper.captured.instructions
  collectives = [ins.runner for ins in instructions if len(ins.devices) > 1]
  assert len(collectives) == len(params) + 2 and all(isinstance(r, LibraryCollective) for r in collectives)
  np.testing.assert_allclose(losses, one_losses, rtol=1e-5)
  for p, want in zip(params, one_params):
    np.testing.assert_allclose(shards_of(p)[1], want.numpy(), rtol=1e-4, atol=1e-6)
  class Embedding:
    embeds_collectives = True
  monkeypatch.setattr("tgrad.jit.graph_runner_class", lambda device: Embedding)
  for runner in collectives: monkeypatch.setattr(runner, "per_device", True, raising=False)
  runs = device_runs(instructions)
  assert sorted(device for device, _ in runs) == sorted(TWO)
  assert all([ins.runner for ins in run if len(ins.devices) > 1] == collectives for _, run in runs)

# ---- on two GPUs (skipped with fewer)

@pytest.mark.gpu
def test_sharded_reduce_on_two_gpus_goes_through_nccl(two_gpus):
  gpus = two_gpus
  a = np.random.default_rng(8).standard_normal((64, 33)).astype(np.float32)
  total = Tensor(a, device=gpus[0]).shard(gpus, 0).sum(0)
  [item] = [i for i in total.schedule() if i.ast.op is Ops.COLLECTIVE]
  [lowered] = lower_schedule([item])
  assert isinstance(lowered.runner, LibraryCollective) and lowered.runner.per_device
  np.testing.assert_allclose(total.numpy(), a.sum(0), rtol=1e-5, atol=1e-5)

@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [1, 0])
def test_jitted_data_parallel_training_on_two_gpus_matches_one(graphs, two_gpus):
  from tgrad.helpers import Context
  gpus = two_gpus
  with Context(CUDA_GRAPH=graphs):
    one_losses, one_params, _ = mlp_step(None, 0, 5, jit=False)
    losses, params, stepper = mlp_step(gpus, 0, 5, jit=True)
  assert sum(isinstance(ins.runner, LibraryCollective) for ins in stepper.captured.instructions) == len(params) + 2
  if graphs: assert len(stepper.captured.runners) == 2   # one graph runner per GPU: the whole step is two graphs
  np.testing.assert_allclose(losses, one_losses, rtol=1e-5)
  for p, want in zip(params, one_params):
    first, *others = shards_of(p)
    for other in others: np.testing.assert_array_equal(first, other)
    np.testing.assert_allclose(first, want.numpy(), rtol=1e-4, atol=1e-6)

def test_every_device_run_is_prepared_before_any_device_launches():
  """Once one device's part of a collective is launched it waits for its peers, so a replay makes every device's run
  ready (graphs built) before it launches the first: nothing the host does may stand between the launches."""
  rng = np.random.default_rng(7)
  step = TinyJit(lambda x: (x * 2).sum(0).realize())
  for _ in range(3): step(Tensor(rand(rng, 4, 3)).shard(TWO, 0))
  graph = step.captured
  events: list[str] = []
  class Recorded:
    def __init__(self, runner, name): self.runner, self.name = runner, name
    def bind(self, changed): self.runner.bind(changed)
    def rebind_variables(self, instructions): self.runner.rebind_variables(instructions)
    def prepare(self): events.append(f"prepare {self.name}"); self.runner.prepare()
    def __call__(self): events.append(f"launch {self.name}"); self.runner()
  graph.runners = [Recorded(runner, str(i)) for i, runner in enumerate(graph.runners)]
  a = rand(rng, 4, 3)
  out = step(Tensor(a).shard(TWO, 0))
  assert len(graph.runners) >= 2
  first_launch = next(i for i, e in enumerate(events) if e.startswith("launch"))
  assert all(e.startswith("prepare") for e in events[:first_launch]) and first_launch == len(graph.runners)
  np.testing.assert_allclose(out.numpy(), (a * 2).sum(0), rtol=RTOL, atol=ATOL)
