"""What a measurement of an execution path was made on, and by which code: hardware fingerprints and tgrad's version.

`hardware_fingerprint(device)` → a flat dict of JSON strings and numbers, made by the device's backend (a GPU and its
driver; the CPU, its compiler's name for it and its features); `fingerprint_key(fp)` → a short stable hash;
`describe_difference(a, b)` → the fields that differ, in words. `tgrad_version()` → the package version plus a hash
of every source file that can change what a path computes or how fast. The benchmark database (db.py) keeps these with
each run so that selection uses only records made here, by this code.
"""
from __future__ import annotations
import functools, hashlib, json
from pathlib import Path
from typing import Any

FINGERPRINT_KEY_CHARS = 16   # hex digits of a fingerprint's sha256 kept as its key: 64 bits, collision-free in practice
VERSION_HASH_CHARS = 12      # hex digits of the source hash in tgrad_version()
# Files and folders of the tgrad package (relative, '/'-separated) whose source is NOT part of tgrad_version(): they
# store, build or describe graphs but never change how a given graph runs. Every other .py file is hashed, so a new
# file is covered until it is listed here on purpose.
VERSION_EXCLUDED = ("cache.py", "schedule_cache.py", "paths/db.py", "paths/fingerprint.py",
                    "runtime/cuda/fingerprint.py", "runtime/llvm/fingerprint.py", "models/", "nn/")
PACKAGE_ROOT = Path(__file__).resolve().parents[1]   # the tgrad folder

# Readable names of the fingerprint fields, for describe_difference. The GPU's fields come first: they differ first.
FIELD_NAMES = {"device": "device", "gpu_name": "GPU", "compute_capability": "compute capability",
               "multiprocessors": "multiprocessor count", "total_memory_bytes": "GPU memory",
               "driver_version": "CUDA driver", "cuda_version": "CUDA version", "nvrtc_version": "NVRTC",
               "cpu_model": "CPU", "machine": "machine", "llvm_cpu": "LLVM CPU name", "cpu_features": "CPU features",
               "cores": "core count", "llvmlite_version": "llvmlite"}

# ---- hardware

def hardware_fingerprint(device: str) -> dict:
  """The fingerprint of `device` (any spelling the device registry accepts), made by its backend (tgrad/backend.py):
  a GPU's may start the device (once per process); the CPU's touches nothing but llvmlite and /proc/cpuinfo, so a
  run on the CPU never starts a GPU. Remembered per device: the hardware does not change while a process runs."""
  from tgrad.device import canonical_device   # the registry: only its name table is needed here
  return dict(_fingerprint_of(canonical_device(device)))

@functools.cache
def _fingerprint_of(device: str) -> dict:
  from tgrad.backend import backend
  if (maker := backend(device).fingerprint) is None: raise ValueError(f"device {device!r} has no hardware fingerprint")
  return maker()

def fingerprint_key(fingerprint: dict) -> str:
  """A short hash of the fingerprint's canonical JSON: equal for equal fingerprints in every process."""
  text = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_KEY_CHARS]

def describe_difference(recorded: dict, here: dict) -> str:
  """What differs between a record's fingerprint and this machine's, e.g. 'other GPU: NVIDIA A100 vs NVIDIA H100';
  several differences are joined by '; '; '' when they are equal. CPU features are listed as the ones each side
  lacks."""
  names = list(FIELD_NAMES) + sorted((set(recorded) | set(here)) - set(FIELD_NAMES))
  differences = []
  for name in names:
    if recorded.get(name) == here.get(name): continue
    label = FIELD_NAMES.get(name, name)
    if name == "cpu_features": differences.append(f"other {label}: {_feature_difference(recorded, here)}")
    else: differences.append(f"other {label}: {_shown(recorded.get(name))} vs {_shown(here.get(name))}")
  return "; ".join(differences)

def _shown(value: Any) -> str: return "(none)" if value is None else str(value)

def _feature_difference(recorded: dict, here: dict) -> str:
  recorded_features = set(filter(None, str(recorded.get("cpu_features", "")).split(",")))
  here_features = set(filter(None, str(here.get("cpu_features", "")).split(",")))
  parts = []
  if (missing := sorted(recorded_features - here_features)): parts.append(f"this CPU lacks {','.join(missing)}")
  if (extra := sorted(here_features - recorded_features)): parts.append(f"the record's CPU lacks {','.join(extra)}")
  return ", ".join(parts)

# ---- code

@functools.cache
def tgrad_version() -> str:
  """'0.1.0+src.<hash>': the installed package version and a hash of the source of every tgrad module that can change
  what a path computes or how fast it runs (all but VERSION_EXCLUDED). Records made by other code are not selected,
  so an edit to a lowering, the scheduler, the code generator or a runtime makes its paths be measured again; a
  release number alone would miss every such edit between releases."""
  return f"{_package_version()}+src.{source_hash(PACKAGE_ROOT)}"

def _package_version() -> str:
  from importlib.metadata import PackageNotFoundError, version
  try: return version("tgrad")
  except PackageNotFoundError: return "unknown"   # run from a source tree that was never installed

def source_hash(root: Path, excluded: tuple[str, ...] = VERSION_EXCLUDED) -> str:
  """sha256 over the relative path and bytes of every .py file under `root` that `excluded` does not name (a file or,
  ending in '/', a folder), in sorted order: independent of the folder's location and of file times."""
  digest = hashlib.sha256()
  for file in sorted(root.rglob("*.py")):
    relative = file.relative_to(root).as_posix()
    if relative in excluded or any(relative.startswith(folder) for folder in excluded if folder.endswith("/")): continue
    digest.update(relative.encode() + b"\0" + file.read_bytes() + b"\0")
  return digest.hexdigest()[:VERSION_HASH_CHARS]
