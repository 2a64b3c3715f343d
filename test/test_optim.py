"""Optimizers against torch.optim (CPU): several steps from the same parameters on the same data, with tolerances;
and the update mechanics — in place (same Tensor, same buffer), one schedule per step, only tensors with a gradient,
hyperparameters read from buffers (no recompiles), and torch's argument errors.
"""
import numpy as np
import pytest
import torch
from tgrad import Tensor
import tgrad.nn as nn
import tgrad.realize
from tgrad.nn.optim import SGD, Adam, AdamW
from tgrad.nn.state import get_parameters, load_state_dict

STEPS = 4
PARAM_ATOL, PARAM_RTOL = 1e-5, 1e-4
RNG = np.random.default_rng(0)
INPUTS = RNG.uniform(-1, 1, (8, 5)).astype(np.float32)
TARGETS = RNG.uniform(-1, 1, (8, 3)).astype(np.float32)

class TinyMLP:
  def __init__(self): self.l1, self.l2 = nn.Linear(5, 6), nn.Linear(6, 3)
  def __call__(self, x: Tensor) -> Tensor: return self.l2(self.l1(x).relu())

def _models():
  torch.manual_seed(0)
  torch_model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
  model = TinyMLP()
  names = {"0.weight": "l1.weight", "0.bias": "l1.bias", "2.weight": "l2.weight", "2.bias": "l2.bias"}
  load_state_dict(model, {names[k]: Tensor(v.numpy()) for k, v in torch_model.state_dict().items()})
  return torch_model, model

OPTIMIZERS = [  # id, torch factory, tgrad factory
  ("sgd", lambda p: torch.optim.SGD(p, lr=0.1), lambda p: SGD(p, lr=0.1)),
  ("sgd_momentum_dampening_decay", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.3,
                                                             weight_decay=0.01),
   lambda p: SGD(p, lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01)),
  ("sgd_nesterov", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True),
   lambda p: SGD(p, lr=0.05, momentum=0.8, nesterov=True)),
  ("adam", lambda p: torch.optim.Adam(p, lr=0.01), lambda p: Adam(p, lr=0.01)),
  ("adam_l2_betas", lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
   lambda p: Adam(p, lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
  ("adamw", lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.05), lambda p: AdamW(p, lr=0.01, weight_decay=0.05)),
]

@pytest.mark.parametrize("name, torch_factory, tgrad_factory", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_steps_match_torch(name, torch_factory, tgrad_factory):
  torch_model, model = _models()
  torch_opt, opt = torch_factory(torch_model.parameters()), tgrad_factory(get_parameters(model))
  for step in range(STEPS):
    torch_loss = ((torch_model(torch.tensor(INPUTS)) - torch.tensor(TARGETS)) ** 2).mean()
    torch_opt.zero_grad()
    torch_loss.backward()
    torch_opt.step()
    opt.zero_grad()
    loss = (model(Tensor(INPUTS)) - Tensor(TARGETS)).square().mean()
    loss.backward()
    Tensor.realize(loss, *opt.schedule_step())
    np.testing.assert_allclose(loss.item(), torch_loss.item(), rtol=1e-5, err_msg=f"loss at step {step}")
    for got, want in zip(get_parameters(model), torch_model.parameters()):
      np.testing.assert_allclose(got.numpy(), want.detach().numpy(), atol=PARAM_ATOL, rtol=PARAM_RTOL,
                                 err_msg=f"parameter after step {step}")

def test_step_is_in_place_and_one_schedule(monkeypatch):
  _, model = _models()
  params = get_parameters(model)
  opt = Adam(params, lr=0.01)
  buffers_before = [p.lazydata.base.buffer for p in params]
  assert all(b is not None for b in buffers_before)   # the optimizer realized the parameters
  (model(Tensor(INPUTS)) - Tensor(TARGETS)).square().mean().backward()
  calls = []
  original = tgrad.realize.realize
  monkeypatch.setattr(tgrad.realize, "realize", lambda *lbs: (calls.append(len(lbs)), original(*lbs))[1])
  opt.step()
  assert len(calls) == 1, f"the step realized in {len(calls)} schedules"
  assert all(a is b for a, b in zip(get_parameters(model), params))   # the same Tensor objects
  assert [p.lazydata.base.buffer for p in params] == buffers_before   # written in place, into the same buffers

def test_only_tensors_with_a_gradient_are_updated():
  used, unused = Tensor([1.0, 2.0], requires_grad=True), Tensor([5.0], requires_grad=True)
  frozen = Tensor([7.0], requires_grad=False)
  opt = SGD([used, unused, frozen], lr=0.5, momentum=0.9)
  assert opt.params == [used, unused] and opt.buffers == [frozen]
  for _ in range(2):
    opt.zero_grad()
    (used * used).sum().backward()
    opt.step()
  assert unused.tolist() == [5.0] and frozen.tolist() == [7.0] and unused.grad is None
  np.testing.assert_allclose(used.numpy(), [1 - 0.5 * 2 - 0.5 * (0.9 * 2 + 0), 2 - 0.5 * 4 - 0.5 * (0.9 * 4 + 0)])

def test_undecided_requires_grad_is_switched_on():
  layer = nn.Linear(2, 2)
  assert layer.weight.requires_grad is None
  SGD(get_parameters(layer), lr=0.1)
  assert layer.weight.requires_grad is True

def test_learning_rate_lives_in_a_buffer_so_changing_it_compiles_nothing():
  w = Tensor([1.0, -1.0], requires_grad=True)
  opt = Adam([w], lr=0.1)
  def step():
    opt.zero_grad()
    (w * w).sum().backward()
    opt.step()
  step()
  opt.lr.assign(Tensor(0.01)).realize()   # writing a new constant into lr is a kernel of its own
  kernels = len(tgrad.realize._runner_cache)
  step()
  assert len(tgrad.realize._runner_cache) == kernels   # a new lr and a new step count, the same step kernels

def test_loss_realized_with_the_step_sees_the_old_parameters():
  w = Tensor([2.0], requires_grad=True)
  opt = SGD([w], lr=0.25)
  loss = (w * w).sum()
  loss.backward()
  Tensor.realize(loss, *opt.schedule_step())   # one schedule: the loss kernel runs before w is overwritten
  assert loss.item() == 4.0 and w.item() == 1.0

def test_batchnorm_running_stats_are_realized_by_the_step():
  norm = nn.BatchNorm(2)
  opt = SGD(get_parameters(norm), lr=0.1)
  assert norm.running_mean in opt.buffers
  with Tensor.train():
    norm(Tensor([[1.0, 2.0], [3.0, 6.0]])).sum().backward()
  opt.step()
  assert norm.running_mean.lazydata.base.buffer is not None and norm.running_mean.lazydata.is_base
  np.testing.assert_allclose(norm.running_mean.numpy(), [0.2, 0.4], rtol=1e-6)

def test_argument_errors_like_torch():
  w = Tensor([1.0], requires_grad=True)
  with pytest.raises(ValueError, match="Invalid learning rate"): SGD([w], lr=-1)
  with pytest.raises(ValueError, match="Nesterov momentum requires"): SGD([w], lr=1, nesterov=True)
  with pytest.raises(ValueError, match="Invalid momentum"): SGD([w], lr=1, momentum=-0.5)
  with pytest.raises(ValueError, match="Invalid beta parameter at index 0"): Adam([w], betas=(1.0, 0.9))
  with pytest.raises(ValueError, match="Invalid epsilon"): AdamW([w], eps=-1)
  with pytest.raises(ValueError, match="empty parameter list"): Adam([])
