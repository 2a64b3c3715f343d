"""bench/step_profile.py, the diagnostic of `bench/multi_device.py --profile`: the rendezvous model and the alignment
count on hand-made programs (exact values), and the profile of a jitted data-parallel step on LLVM:0 and LLVM:1."""
import os, sys
from types import SimpleNamespace
import numpy as np
import pytest
from tgrad import Tensor, TinyJit
import tgrad.nn as nn
from tgrad.nn.optim import SGD
from tgrad.nn.state import get_parameters

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from step_profile import misaligned_collectives, rendezvous_model, report_lines, step_profile  # noqa: E402

TWO = ("LLVM", "LLVM:1")

def instruction(name: str, *devices: str):
  return SimpleNamespace(name=name, device=devices[0], devices=devices, runner=SimpleNamespace(name=name))

def test_the_rendezvous_model_waits_for_the_last_device_and_takes_the_fastest_span():
  program = [instruction("k_n1", "A"), instruction("k_n2", "B"), instruction("all_reduce", "A", "B"),
             instruction("k_n3", "A")]
  times = [{"A": 1.0}, {"B": 3.0}, {"A": 2.5, "B": 0.5}, {"A": 0.25}]
  ends, waits = rendezvous_model(program, times)
  assert ends == {"A": 3.75, "B": 3.5} and waits == {"A": 2.0, "B": 0.0}

def test_collectives_reached_after_different_kernels_are_counted():
  aligned = [instruction("k_n1", "A"), instruction("k_n7", "B"), instruction("c", "A", "B")]
  assert misaligned_collectives(aligned) == 0   # the same kernel on both, compiled twice
  late = [instruction("count_n1", "A"), instruction("c", "A", "B"), instruction("forward_n2", "A"),
          instruction("c", "A", "B")]
  assert misaligned_collectives([instruction("forward_n3", "B")] + late) == 2

@pytest.mark.parametrize("seed", range(2))
def test_profile_of_a_data_parallel_step(seed):
  Tensor.manual_seed(seed)
  rng = np.random.default_rng(seed)
  layers = [nn.Linear(6, 10), nn.Linear(10, 4)]
  params = get_parameters(layers)
  for p in params: p.shard_(TWO)
  opt = SGD(params, lr=0.1)
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = layers[1](layers[0](x).relu()).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize(loss, *opt.schedule_step())
    return loss
  for _ in range(3):
    step(Tensor(rng.standard_normal((8, 6)).astype(np.float32)).shard(TWO, 0),
         Tensor(rng.integers(0, 4, 8).astype(np.int32)).shard(TWO, 0))
  before = [p.numpy() for p in params]
  profiles, whole = step_profile(step.captured, {"LLVM:0": 0.5, "LLVM:1": 0.5})
  assert [p.device for p in profiles] == list(TWO)
  assert not all(np.array_equal(p.numpy(), b) for p, b in zip(params, before))   # it ran one more step
  first, second = profiles
  # one all-reduce per parameter, the loss's sum and the labels' count; on CPU devices each is copies on the host
  assert first.collectives == second.collectives == {"CopyCollective": len(params) + 2}
  assert first.kernels == second.kernels > 0 and whole["misaligned"] == 0
  assert len(first.host_steps) == len(params) + 2 and second.host_steps == [] and first.graph_launches == 0
  for p in profiles:
    assert p.kernel_seconds > 0 and p.transfer_seconds > 0 and p.wait_seconds >= 0
    assert p.gap_seconds == pytest.approx(0.5 - p.kernel_seconds - p.transfer_seconds - p.wait_seconds)
  assert whole["model_step"] >= max(p.kernel_seconds + p.transfer_seconds for p in profiles)
  lines = report_lines(profiles, whole, 0.1, 0.0)
  assert len(lines) == 2 + len(TWO) + len(TWO) and "collectives reached after different kernels" in lines[3]
