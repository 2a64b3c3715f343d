"""Optimizers: SGD, Adam and AdamW update parameters in place, all in one schedule.

`step()` builds each parameter's update lazily, writes it into the parameter's own buffer with `Tensor.assign` (the
Tensor objects keep their identity, so models and state dicts stay valid), and realizes every updated tensor —
parameters, gradients and optimizer state — with a single `Tensor.realize`, so the scheduler plans all update
kernels together. Hyperparameters that change between steps (lr, Adam's βᵗ) live in device buffers, not in the
kernels, so a changing value never forces a recompile. Semantics follow torch.optim.
"""
from __future__ import annotations
from typing import Optional
from tgrad.dtype import dtypes
from tgrad.helpers import dedup
from tgrad.tensor import Tensor

def _scalar_state(value: float, device: str) -> Tensor:
  """A realized 0-d float32 buffer on the parameters' device: kernels read it instead of baking the value in."""
  return Tensor.full((), value, dtype=dtypes.float32, device=device, requires_grad=False).contiguous().realize()

class Optimizer:
  """Holds the parameters to train and the step logic. `params` may include tensors with requires_grad=False (say a
  BatchNorm's running statistics): they are not trained, but are realized with every step, so their lazy updates
  never pile up. Tensors with requires_grad None are switched to True. A step updates only tensors with a grad.
  Anything computed from the parameters (the loss, say) must be realized before or with the step
  (`Tensor.realize(loss, *opt.schedule_step())`): the step overwrites the buffers such a tensor would read."""
  def __init__(self, params: list[Tensor], lr: float):
    if lr < 0: raise ValueError(f"Invalid learning rate: {lr}")
    for t in params:
      if t.requires_grad is None: t.requires_grad = True
    self.params: list[Tensor] = dedup([t for t in params if t.requires_grad])
    self.buffers: list[Tensor] = dedup([t for t in params if not t.requires_grad])
    if not self.params: raise ValueError("optimizer got an empty parameter list")
    self.device = self.params[0].device
    if other := [t.device for t in self.params if t.device != self.device]:
      raise ValueError(f"optimizer parameters must share one device: got {self.device} and {other[0]}")
    self.lr = _scalar_state(lr, self.device)
    self.steps_taken = 0
    Tensor.realize(*self.params, *self.buffers)   # a realized parameter is then updated in its own buffer

  def zero_grad(self) -> None:
    for t in self.params: t.grad = None

  def step(self) -> None:
    """Update every parameter that has a gradient, in one schedule."""
    to_realize = self.schedule_step()
    Tensor.realize(*to_realize)

  def schedule_step(self) -> list[Tensor]:
    """Assign the updates lazily and return every tensor to realize (updated parameters, their gradients, optimizer
    state, buffers), for a caller that realizes them together with its own tensors."""
    trained = [(i, t) for i, t in enumerate(self.params) if t.grad is not None]
    for _, t in trained:
      if t.grad.shape != t.shape:
        raise RuntimeError(f"gradient of shape {t.grad.shape} for a parameter of shape {t.shape}")
    with Tensor.no_grad():
      state = self._update(trained) if trained else []
    self.steps_taken += 1
    return [t for _, t in trained] + [t.grad for _, t in trained] + state + self.buffers

  def _update(self, params: list[tuple[int, Tensor]]) -> list[Tensor]:
    """Assign the new values of `params` ((index in self.params, tensor), each with a grad); return the state tensors
    that were assigned."""
    raise NotImplementedError(f"{type(self).__name__} does not define _update")

  @staticmethod
  def _zeros_like(t: Tensor) -> Tensor:
    return Tensor.zeros(t.shape, dtype=t.dtype, device=t.device, requires_grad=False).contiguous().realize()

class SGD(Optimizer):
  """torch.optim.SGD: g = grad + weight_decay·p; with momentum, b = momentum·b + (1 − dampening)·g (b = g on the
  first step) and g = g + momentum·b (nesterov) or b; then p = p − lr·g."""
  def __init__(self, params: list[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0,
               nesterov: bool = False, dampening: float = 0.0):
    if momentum < 0: raise ValueError(f"Invalid momentum value: {momentum}")
    if weight_decay < 0: raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    if nesterov and (momentum <= 0 or dampening != 0):
      raise ValueError("Nesterov momentum requires a momentum and zero dampening")
    super().__init__(params, lr)
    self.momentum, self.weight_decay, self.nesterov, self.dampening = momentum, weight_decay, nesterov, dampening
    self.momentum_buffers = [self._zeros_like(t) for t in self.params] if momentum else []
    self.momentum_started = [False] * len(self.params)

  def _update(self, params: list[tuple[int, Tensor]]) -> list[Tensor]:
    assigned = []
    for index, t in params:
      grad = t.grad if self.weight_decay == 0 else t.grad + self.weight_decay * t.detach()
      if self.momentum:
        buffer, first = self.momentum_buffers[index], not self.momentum_started[index]
        self.momentum_started[index] = True
        buffer.assign(grad if first else buffer * self.momentum + grad * (1 - self.dampening))
        grad = grad + buffer * self.momentum if self.nesterov else buffer
        assigned.append(buffer)
      t.assign(t.detach() - self.lr * grad)
    return assigned

class Adam(Optimizer):
  """torch.optim.Adam: g = grad + weight_decay·p (L2); m = β1·m + (1 − β1)·g; v = β2·v + (1 − β2)·g²;
  p = p − lr·m̂ / (√v̂ + eps) with the bias corrections m̂ = m / (1 − β1ᵗ), v̂ = v / (1 − β2ᵗ).
  tinygrad's b1, b2 arguments; torch's betas=(b1, b2) is accepted too. One step count t serves every parameter
  (torch counts per parameter: they differ only for a parameter that had no gradient at some step)."""
  decoupled_weight_decay = False
  def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.0, betas: Optional[tuple[float, float]] = None):
    b1, b2 = betas if betas is not None else (b1, b2)
    for i, beta in enumerate((b1, b2)):
      if not 0 <= beta < 1: raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
    if eps < 0: raise ValueError(f"Invalid epsilon value: {eps}")
    if weight_decay < 0: raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    super().__init__(params, lr)
    self.b1, self.b2, self.eps, self.weight_decay = b1, b2, eps, weight_decay
    # β1ᵗ and β2ᵗ after t steps
    self.b1_power, self.b2_power = _scalar_state(1.0, self.device), _scalar_state(1.0, self.device)
    self.first_moments = [self._zeros_like(t) for t in self.params]
    self.second_moments = [self._zeros_like(t) for t in self.params]

  def _update(self, params: list[tuple[int, Tensor]]) -> list[Tensor]:
    self.b1_power.assign(self.b1_power * self.b1)
    self.b2_power.assign(self.b2_power * self.b2)
    assigned = [self.b1_power, self.b2_power]
    for index, t in params:
      m, v = self.first_moments[index], self.second_moments[index]
      value, grad = t.detach(), t.grad
      if self.weight_decay and self.decoupled_weight_decay: value = value * (1 - self.lr * self.weight_decay)
      elif self.weight_decay: grad = grad + self.weight_decay * value
      m.assign(m * self.b1 + grad * (1 - self.b1))
      v.assign(v * self.b2 + grad.square() * (1 - self.b2))
      m_hat, v_hat = m / (1 - self.b1_power), v / (1 - self.b2_power)
      t.assign(value - self.lr * m_hat / (v_hat.sqrt() + self.eps))
      assigned += [m, v]
    return assigned

class AdamW(Adam):
  """torch.optim.AdamW: Adam with decoupled weight decay, p ← p·(1 − lr·weight_decay) before the Adam update."""
  decoupled_weight_decay = True
  def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.01, betas: Optional[tuple[float, float]] = None):
    super().__init__(params, lr, b1, b2, eps, weight_decay, betas)

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]
