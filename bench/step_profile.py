"""Where a jitted step's time goes on each device: the diagnostic behind `bench/multi_device.py --profile`.

Input: a TinyJit's CompiledGraph (its captured step, already replayed as a graph) and the graph replay's seconds per
step on each device. Output: a StepProfile per device. Its parts:
  structure   kernels, collectives (by runner: LibraryCollective is NCCL's on CUDA, CopyCollective copies and a fold
              kernel), host steps (instructions the host runs between a device's runs: copies between devices, a
              collective that is not in the device's graph), graph launches per replay, and the collectives before
              which the devices ran different kernels (a device then waits at the rendezvous for another's work);
  timings     one replay instruction by instruction, each timed on every device it spans (CUDA events on GPUs, the
              host clock elsewhere): a device's kernels add up to `kernels`; a collective's transfer is its fastest
              device's span (the others waited for that one);
  model       the graph replay as it would be from those times: each device runs its instructions back to back in
              program order and every collective starts when its last device arrives: `waits` per device;
  gaps        what is left of the measured graph step: graph step = kernels + transfers + waits + gaps (launch gaps,
              host stalls, dependencies between streams: whatever the model does not have).
The model assumes devices that run at once, as GPUs do; CPU devices share the host and run one after another, so there
its waits and gaps only check that the profile runs. A kernel timed alone includes its launch latency when the device
had nothing queued (tiny kernels: a few µs each); collectives run eagerly here, not from the graph.
"""
from __future__ import annotations
import re
from dataclasses import dataclass, field
from typing import Any, Sequence
from tgrad.device import Device, canonical_device

COMPILE_COUNTER = re.compile(r"_n\d+$")   # the compile counter ending a kernel's name (the same kernel on two devices)
BIGGEST_KERNELS = 4                        # kernels listed per device, the slowest first

def is_kernel(instruction: Any) -> bool: return hasattr(instruction.runner, "program") or \
  type(instruction.runner).__name__ == "CompiledKernel"

def kernel_name(instruction: Any) -> str: return COMPILE_COUNTER.sub("", instruction.name)

@dataclass
class StepProfile:
  """One device's part of a step, seconds per step (see the module docstring)."""
  device: str
  graph_step: float = 0.0
  kernels: int = 0
  kernel_seconds: float = 0.0
  collectives: dict[str, int] = field(default_factory=dict)   # runner class name → how many
  transfer_seconds: float = 0.0
  wait_seconds: float = 0.0
  runs: int = 0                 # graph runners of this device (one run of instructions each)
  graph_launches: int = 0       # CUDA graphs launched per replay (0 where the runner launches kernel by kernel)
  host_steps: list[str] = field(default_factory=list)
  biggest: list[tuple[str, float]] = field(default_factory=list)
  @property
  def gap_seconds(self) -> float:
    return self.graph_step - self.kernel_seconds - self.transfer_seconds - self.wait_seconds

def timed_replay(graph: Any) -> list[dict[str, float]]:
  """Each instruction's seconds on every device it spans, from one replay of the program instruction by instruction
  (the marks are all queued first, then read)."""
  marks = []
  for ins in graph.instructions:
    starts = {d: Device[d].profile_mark() for d in ins.devices}
    ins.runner([graph.slots[s].buffer for s in ins.args], False, ins.var_vals)
    marks.append((starts, {d: Device[d].profile_mark() for d in ins.devices}))
  return [{d: Device[d].profile_elapsed(start[d], end[d]) for d in start} for start, end in marks]

def rendezvous_model(instructions: Sequence[Any], seconds: Sequence[dict[str, float]]
                     ) -> tuple[dict[str, float], dict[str, float]]:
  """(when each device's part ends, how long it waited at collectives) if each device ran its instructions back to
  back in program order and every instruction over several devices started when the last of them arrived and then
  took its fastest device's span."""
  clock: dict[str, float] = {}
  waits: dict[str, float] = {}
  for ins, times in zip(instructions, seconds):
    for d in ins.devices: clock.setdefault(d, 0.0), waits.setdefault(d, 0.0)
    if len(ins.devices) == 1:
      clock[ins.devices[0]] += times[ins.devices[0]]
      continue
    arrival = max(clock[d] for d in ins.devices)
    for d in ins.devices:
      waits[d] += arrival - clock[d]
      clock[d] = arrival + min(times.values())
  return clock, waits

def misaligned_collectives(instructions: Sequence[Any]) -> int:
  """How many instructions over several devices the devices reach after different kernels (since the one before)."""
  since: dict[str, list[str]] = {}
  count = 0
  for ins in instructions:
    if len(ins.devices) == 1:
      since.setdefault(ins.device, []).append(kernel_name(ins))
      continue
    ran = [since.get(d, []) for d in ins.devices]
    count += any(r != ran[0] for r in ran)
    for d in ins.devices: since[d] = []
  return count

def step_profile(graph: Any, graph_step: dict[str, float]) -> tuple[list[StepProfile], dict[str, Any]]:
  """The per-device profiles of a captured step (graph_step: the graph replay's seconds per step on each device, in
  the order to report them) and the whole step's numbers: `model_step` (the rendezvous model's slowest device) and
  `misaligned` (collectives reached after different kernels)."""
  instructions = graph.instructions
  graph_step = {canonical_device(d): seconds for d, seconds in graph_step.items()}
  devices = list(graph_step)
  profiles = {d: StepProfile(d, graph_step=seconds) for d, seconds in graph_step.items()}
  seconds = timed_replay(graph)
  ends, waits = rendezvous_model(instructions, seconds)
  kernel_times: dict[str, list[tuple[str, float]]] = {d: [] for d in devices}
  for ins, times in zip(instructions, seconds):
    if len(ins.devices) == 1 and is_kernel(ins):
      profile = profiles[ins.device]
      profile.kernels += 1
      profile.kernel_seconds += times[ins.device]
      kernel_times[ins.device].append((kernel_name(ins), times[ins.device]))
    elif len(ins.devices) > 1:
      for d in ins.devices:
        kind = type(ins.runner).__name__
        profiles[d].collectives[kind] = profiles[d].collectives.get(kind, 0) + 1
        profiles[d].transfer_seconds += min(times.values())
  for runner in graph.runners:
    profile = profiles[runner.device]
    profile.runs += 1
    steps = getattr(runner, "steps", None)   # a CUDA graph runner's CUDA graphs and host calls, once built
    if steps is not None: profile.graph_launches += sum(callable(getattr(step, "launch", None)) for step in steps)
    if len(run := runner.instructions) == 1 and not is_kernel(run[0]) and \
       not getattr(run[0].runner, "per_device", False):
      profile.host_steps.append(run[0].name)
  for d, profile in profiles.items():
    profile.wait_seconds = waits[d]
    profile.biggest = sorted(kernel_times[d], key=lambda kt: -kt[1])[:BIGGEST_KERNELS]
  return list(profiles.values()), {"model_step": max(ends.values()), "misaligned": misaligned_collectives(instructions)}

def report_lines(profiles: Sequence[StepProfile], whole: dict[str, Any], host_queue: float, host_waits: float
                 ) -> list[str]:
  """The profile as printed lines, times in ms per step."""
  ms = 1e3
  lines = [f"    {'device':8s} {'graph step':>10s} {'kernels':>14s} {'collectives':>22s} {'transfer':>9s} "
           f"{'waits':>7s} {'gaps':>7s} {'runs':>5s} {'graphs':>6s}  host steps"]
  for p in profiles:
    kinds = ", ".join(f"{n} {k.replace('Collective', '').lower()}" for k, n in p.collectives.items()) or "none"
    lines.append(f"    {p.device:8s} {p.graph_step * ms:10.2f} {p.kernel_seconds * ms:8.2f} ({p.kernels:3d}) "
                 f"{kinds:>22s} {p.transfer_seconds * ms:9.2f} {p.wait_seconds * ms:7.2f} {p.gap_seconds * ms:7.2f} "
                 f"{p.runs:5d} {p.graph_launches:6d}  {len(p.host_steps)}"
                 + (f" ({', '.join(sorted(set(p.host_steps)))})" if p.host_steps else ""))
  lines.append(f"    rendezvous model {whole['model_step'] * ms:.2f} ms; collectives reached after different kernels "
               f"on different devices: {whole['misaligned']}; host: {host_queue * ms:.2f} ms to queue a step, "
               f"{host_waits:.1f} waits for a device per step")
  for p in profiles:
    lines.append(f"    slowest kernels on {p.device}: " +
                 ", ".join(f"{name} {seconds * ms:.2f}" for name, seconds in p.biggest))
  return lines
