"""Side kernels: where a replayed program runs the kernels that read only its weights.

A kernel whose inputs are all weights (a packed weight dequantized into a half temporary for a prompt's matmul: nothing
the program computes goes into it) may run at any point before the first instruction that uses its output. Where it
runs matters on a device that runs a program's independent kernels side by side (a CUDA graph with branches): beside a
kernel that leaves most of the device idle (attention over a few heads: 32 blocks on an H100's 132 SMs) it is nearly
free, beside one that fills the device (a matmul, a norm over every row) it takes its whole time from the chain.

`place_side_kernels` moves each such kernel to start with the least busy kernel of the stretch before its first user:
it is put right after that anchor in program order and marked to start with the instruction before it. The JIT plans
its output's memory as live from the anchor on (nothing the anchor touches shares it), and the device's graph runner
gives it the anchor's dependencies as well as its own: it starts when the anchor does, after it in launch order (the
anchor's few blocks are dispatched first, the side kernel's fill the SMs left), not as soon as its own memory is free
beside whatever the chain runs then. How busy a kernel keeps its device is the graph runner's estimate
(`busy_fraction`: 1.0 fills it); a device whose runner gives none keeps the program order.

Measured on an H100 (the 512-token prefill of gemma-3-270m's Q4_K_M file, packed weights dequantized into half
temporaries; bench/prefill_parity.py, both models alternated): each layer's four dequantizing kernels waited for the
norm or matmul before their users and ran beside small kernels, 1.045× the float16 prefill; started beside each
layer's attention, 1.005× (docs/benchmarks.md). Placed before their anchor instead (its blocks dispatched after
theirs) the packed prefill took 1.711 ms, and started at the beginning of the graph (nothing held them back) 1.725 ms,
against 1.596 ms placed after it (bench/gemma_gguf_gpu.py).
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional, Sequence

# How far before its first user a side kernel may move, in instructions: about two transformer layers' kernels, so
# an anchor is found in the layer before; its output stays live from the anchor on, so the bound also bounds the
# memory that moving adds.
SIDE_WINDOW = 32
# An anchor keeps under half the device busy (its blocks fill less than half the SMs): the rest runs the side kernel.
SIDE_MAX_BUSY = 0.5

@dataclass(frozen=True)
class Step:
  """What placement needs of one instruction: its argument slots (outputs first), whether it is a side kernel (a
  kernel on one device whose inputs are all weights), and how busy it keeps its device (None: not a kernel the graph
  runner can run beside another, such as a copy or a collective; placement never moves a side kernel past one)."""
  args: tuple[int, ...]
  output_count: int
  device: str
  side: bool
  busy: Optional[float]

@dataclass(frozen=True)
class Placement:
  """The program order (indices into the instructions as they were) and the instructions moved to start with the
  instruction before them (their anchor, or another side kernel of the same anchor)."""
  order: tuple[int, ...]
  starts_with_previous: frozenset[int]

def _first_user(steps: Sequence[Step], at: int) -> Optional[int]:
  outputs = set(steps[at].args[:steps[at].output_count])
  return next((i for i in range(at + 1, len(steps)) if outputs.intersection(steps[i].args)), None)

def _anchor(steps: Sequence[Step], at: int) -> Optional[int]:
  """The instruction a side kernel at `at` should start with, or None to leave it where it is. Candidates lie before
  its first user, at most SIDE_WINDOW back, with no step the runner can't branch around between them and `at`, and
  (before `at`) none that uses the side kernel's output memory; the least busy one wins, the nearest the user on a
  tie."""
  user = _first_user(steps, at)
  if user is None: return None
  outputs = set(steps[at].args[:steps[at].output_count])
  end = next((i for i in range(at + 1, user) if steps[i].busy is None), user)
  start = max(0, user - SIDE_WINDOW)
  for i in range(at - 1, start - 1, -1):
    if steps[i].busy is None or outputs.intersection(steps[i].args):
      start = i + 1
      break
  best: Optional[int] = None
  for i in range(end - 1, start - 1, -1):
    step = steps[i]
    if i == at or step.side or step.device != steps[at].device or step.busy is None: continue
    if step.busy < SIDE_MAX_BUSY and (best is None or step.busy < steps[best].busy): best = i
  return best

def place_side_kernels(steps: Sequence[Step]) -> Placement:
  """Each side kernel right after its anchor (`_anchor`), side kernels sharing an anchor in their program order; every
  other instruction keeps its order."""
  anchors = {at: anchor for at, step in enumerate(steps) if step.side and (anchor := _anchor(steps, at)) is not None}
  after: dict[int, list[int]] = {}
  for at, anchor in anchors.items(): after.setdefault(anchor, []).append(at)
  order: list[int] = []
  for i in range(len(steps)):
    if i in anchors: continue
    order.append(i)
    order.extend(after.get(i, ()))
  return Placement(tuple(order), frozenset(anchors))
