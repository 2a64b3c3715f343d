"""The device plug-in registry (tgrad/backend.py): a device is one package under tgrad/runtime/, nothing outside it
names it, registering one needs no other file, and importing tgrad loads no device runtime."""
import ast, io, subprocess, sys, tokenize
from pathlib import Path
import pytest
from tgrad.backend import (HOST_DEVICE, Backend, DeviceTraits, backend, devices_offering, known_devices,
                           language_devices, register_backend, unregister_backend)
from tgrad.device import DEVICE_TRAITS, canonical_device

PACKAGE = Path(__file__).resolve().parents[1] / "tgrad"
RUNTIME = PACKAGE / "runtime"
# the defaults allowed to name a device outside its package: the host device, once
ALLOWED = {("backend.py", "LLVM")}

def device_literals(source: str) -> list[tuple[int, str]]:
  """(line, value) of every string literal in `source` that names a device in any case ('cuda', 'LLVM:0'). Aliases
  are left out: 'CPU' and 'GPU' are also plain words (a fingerprint field's label)."""
  names = set(known_devices())
  found = []
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type != tokenize.STRING: continue
    try: value = ast.literal_eval(token.string)
    except (ValueError, SyntaxError): continue   # f-string pieces and the like
    if isinstance(value, str) and value.split(":")[0].upper() in names: found.append((token.start[0], value))
  return found

def test_no_module_outside_a_device_package_names_a_device():
  stray = []
  for file in sorted(PACKAGE.rglob("*.py")):
    if RUNTIME in file.parents: continue
    relative = file.relative_to(PACKAGE).as_posix()
    stray += [f"{relative}:{line}: {value!r}" for line, value in device_literals(file.read_text())
              if (relative, value) not in ALLOWED]
  assert not stray, "device names outside tgrad/runtime/ (ask tgrad.backend instead):\n" + "\n".join(stray)

def test_the_literal_finder_finds_names_in_code_and_not_in_prose():
  source = 'x = "CUDA"\ny = f"{z}"\n"""Docs about LLVM and CUDA."""\nw = "llvm:0"  # "LLVM" in a comment\n'
  assert device_literals(source) == [(1, "CUDA"), (4, "llvm:0")]

def test_every_device_is_a_package_that_registers_itself():
  packages = sorted(p.name.upper() for p in RUNTIME.iterdir() if (p / "__init__.py").exists())
  assert packages == sorted(known_devices()) and {"CUDA", "LLVM", "PYTHON"} <= set(packages)
  assert HOST_DEVICE in known_devices()
  assert language_devices() == {"cuda": "CUDA", "llvm": "LLVM", "python": "PYTHON"}
  assert DEVICE_TRAITS["gpu"].has_local and not DEVICE_TRAITS["cpu:1"].has_local
  assert "CUDA" in devices_offering("fast") and "LLVM" not in devices_offering("fast")

def test_importing_tgrad_loads_no_device_runtime():
  code = ("import sys, tgrad\n"
          "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pycuda', 'llvmlite') or "
          "(m.startswith('tgrad.runtime.') and m.count('.') > 2)))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=PACKAGE.parent).stdout
  assert out.strip() == "[]"

def test_registering_checks_names_and_forgetting_a_device_forgets_its_spellings():
  with pytest.raises(ValueError, match="upper case"): register_backend(Backend("toy", lambda: None))
  with pytest.raises(ValueError, match="CPU already names device LLVM"):
    register_backend(Backend("TOY", lambda: None, aliases=("cpu",)))
  assert "TOY" not in known_devices()
  register_backend(Backend("TOY", lambda: None, DeviceTraits(has_local=True, lowerings=frozenset({"fast"})),
                           aliases=("SANDBOX",), languages=("toy-c",)))
  try:
    assert canonical_device("sandbox:3") == "TOY:3" and canonical_device("sandbox:0") == "TOY"
    assert backend("TOY").aliases == ("SANDBOX",)
    assert language_devices()["toy-c"] == "TOY" and "TOY" in devices_offering("fast")
  finally: unregister_backend("TOY")
  for name in ("toy", "sandbox:3"):
    with pytest.raises(ValueError, match=f"unknown device '{name}'"): canonical_device(name)
  with pytest.raises(KeyError, match="no device 'TOY' is registered"): backend("TOY")
