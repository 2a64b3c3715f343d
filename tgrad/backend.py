"""The device plug-in registry: one `Backend` per kind of device, declared by its package under tgrad/runtime/.

A Backend is everything the rest of tgrad may ask about a device: its name and aliases, its traits (known without
starting it), and how to get the rest when needed: `start()` → the running device (a tgrad.device.Compiled: its
allocator, compiler, renderer and program loader), `is_usable()`, its hardware fingerprint, the JIT's graph runner
for its instructions, the custom-kernel source languages its compiler takes, and its collectives (sharded tensors,
tgrad/multi/). A device name is a kind and an index: 'LLVM:1' is the second device of kind LLVM; the bare kind ('LLVM')
is index 0 and its canonical spelling. `device_kind` and `device_index` split a name; everything that asks about a kind
of device (traits, fingerprint, graph runner, lowerings) asks with `backend(name)`, which ignores the index. Each
package tgrad/runtime/<device>/ registers its Backend when imported (`import tgrad.runtime` imports them all); a test
or a user may register more.
Other modules ask `backend(name)`, `known_devices()`, `language_devices()` or `devices_offering(lowering)`, so no
module outside a device's package names the device. Nothing here imports a runtime: importing tgrad loads no driver.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

# A device name is '<KIND>' (index 0) or '<KIND>:<index>'
INDEX_SEPARATOR = ":"

def device_kind(name: str) -> str:
  """The kind of device a name names: 'CUDA:1' → 'CUDA', 'LLVM' → 'LLVM' (the spelling is not checked)."""
  return name.split(INDEX_SEPARATOR, 1)[0]

def device_index(name: str) -> int:
  """The index of a canonical device name: 'CUDA:1' → 1, 'LLVM' → 0."""
  _, separator, index = name.partition(INDEX_SEPARATOR)
  return int(index) if separator else 0

def device_name(kind: str, index: int) -> str:
  """The canonical name of device `index` of `kind`: the bare kind for index 0 ('LLVM'), else 'LLVM:1'."""
  return kind if index == 0 else f"{kind}{INDEX_SEPARATOR}{index}"

# The only device name outside tgrad/runtime/ (a default): the CPU device, where float64 references and host-side
# alternatives run, and the default device when no preferred one (Backend.default_priority) is usable.
HOST_DEVICE = "LLVM"

@dataclass(frozen=True)
class DeviceTraits:
  """What graph building may know about a kind of device without starting it (its renderer says the same)."""
  has_local: bool = False                   # thread blocks with local ids (GPU); False: one program per CPU core
  lowerings: frozenset[str] = frozenset()   # device-specific composite lowerings its renderer implements ("fast")

def _plain_loop() -> None:
  """The graph runner of a device that has none of its own: the JIT's plain loop over prepared launches."""
  return None

@dataclass(frozen=True)
class Backend:
  """One kind of device, as its package declares it. The callables import the device's runtime when called."""
  name: str                              # upper case: what DEVICE= and Tensor(device=) take (any case, with ':N')
  start: Callable[..., Any]              # start(index) → device `index` of this kind (a tgrad.device.Compiled);
                                         # index 0 is started as start(), so a backend of one device takes no
                                         # argument; an ImportError names a missing package
  traits: DeviceTraits = DeviceTraits()
  aliases: tuple[str, ...] = ()          # other names for it ('CPU', 'GPU')
  is_usable: Optional[Callable[[], bool]] = None   # whether it can start, without starting it; None: try start()
  fingerprint: Optional[Callable[[], dict]] = None  # the hardware a measurement is made on (paths/fingerprint.py)
  graph_runner: Callable[[], Optional[Callable]] = _plain_loop   # the JIT's runner class for its instructions
  languages: tuple[str, ...] = ()        # SourceKernel languages its compiler takes (tgrad/custom.py)
  install: str = "pip install -e ."      # what installs the Python packages it needs
  start_failure: str = "its runtime failed to start"   # what a failure to start usually means, for the error
  default_priority: int = 0              # > 0: the default device when usable (the highest first), over HOST_DEVICE
  collectives: Optional[Callable[[list], Any]] = None   # collectives(started devices) → its collectives library
                                                        # over them (nccl.NCCLCollectives' interface), or None;
                                                        # None: a collective step runs as copies and a kernel

class DeviceRegistry:
  """The registered Backends by name, and every spelling that names one. Listeners (the started-device and name
  caches of tgrad.device) are told of every change."""
  def __init__(self):
    self.backends: dict[str, Backend] = {}
    self.names: dict[str, str] = {}   # upper-case name or alias → backend name
    self.listeners: list[Callable[[], None]] = []
  def register(self, new: Backend) -> Backend:
    if not new.name or new.name != new.name.upper() or ":" in new.name:
      raise ValueError(f"a device name is upper case without ':', got {new.name!r}")
    spellings = (new.name, *(alias.upper() for alias in new.aliases))
    taken = [s for s in spellings if self.names.get(s, new.name) != new.name]
    if taken: raise ValueError(f"device {new.name}: {', '.join(taken)} already names device {self.names[taken[0]]}")
    self.unregister(new.name)
    self.backends[new.name] = new
    self.names.update(dict.fromkeys(spellings, new.name))
    self._changed()
    return new
  def unregister(self, name: str) -> None:
    if self.backends.pop(name, None) is None: return
    self.names = {spelling: owner for spelling, owner in self.names.items() if owner != name}
    self._changed()
  def _changed(self) -> None:
    for listener in self.listeners: listener()

REGISTRY = DeviceRegistry()

def register_backend(new: Backend) -> Backend:
  """Add a kind of device (replacing one of the same name); ValueError if a name or alias is another device's."""
  return REGISTRY.register(new)

def unregister_backend(name: str) -> None:
  """Forget a kind of device (a test's); devices of it already started stay alive where they are referenced."""
  REGISTRY.unregister(name)

def on_registry_change(listener: Callable[[], None]) -> None:
  """Call `listener()` after every register or unregister (for caches keyed by device name)."""
  REGISTRY.listeners.append(listener)

def backend_name(spelling: str) -> Optional[str]:
  """The backend a name or alias of any case names ('cpu' → 'LLVM'), else None."""
  return REGISTRY.names.get(spelling.upper())

def backend(name: str) -> Backend:
  """The Backend of a canonical device name of any index ('CUDA', 'CUDA:1'); KeyError names the known ones."""
  try: return REGISTRY.backends[device_kind(name)]
  except KeyError: raise KeyError(f"no device {name!r} is registered; known: {', '.join(known_devices())}") from None

def known_devices() -> tuple[str, ...]:
  """The registered device names, in registration order."""
  return tuple(REGISTRY.backends)

def device_spellings() -> tuple[str, ...]:
  """Every name DEVICE= accepts: the devices, then their aliases."""
  return known_devices() + tuple(s for s, owner in REGISTRY.names.items() if s != owner)

def preferred_devices() -> list[str]:
  """The devices to try as the default, before HOST_DEVICE: those with a default_priority, the highest first."""
  ranked = sorted((b for b in REGISTRY.backends.values() if b.default_priority > 0), key=lambda b: -b.default_priority)
  return [b.name for b in ranked]

def language_devices() -> dict[str, str]:
  """Each custom-kernel source language → the device whose compiler takes it ({'cuda': 'CUDA', ...})."""
  return {language: b.name for b in REGISTRY.backends.values() for language in b.languages}

class DevicesOffering:
  """The devices whose traits list a lowering, asked at each `in` (a device registered later is included)."""
  def __init__(self, lowering: str): self.lowering = lowering
  def __contains__(self, device: object) -> bool:
    found = REGISTRY.backends.get(device_kind(device)) if isinstance(device, str) else None
    return found is not None and self.lowering in found.traits.lowerings
  def __iter__(self) -> Iterator[str]: return iter([name for name in known_devices() if name in self])
  def __repr__(self) -> str: return f"DevicesOffering({self.lowering!r})"

def devices_offering(lowering: str) -> DevicesOffering:
  """The devices on which a device-specific composite lowering ("fast", "tf32") is valid."""
  return DevicesOffering(lowering)

class DevicesOtherThan:
  """Every registered kind of device but one, asked at each `in` with a device name of any index (for alternatives
  that move work to that kind)."""
  def __init__(self, excluded: str): self.excluded = excluded
  def __contains__(self, device: object) -> bool:
    return isinstance(device, str) and device_kind(device) != self.excluded and device_kind(device) in REGISTRY.backends
  def __iter__(self) -> Iterator[str]: return iter([name for name in known_devices() if name in self])
  def __repr__(self) -> str: return f"DevicesOtherThan({self.excluded!r})"
