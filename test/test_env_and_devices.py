"""Clear errors at the edges: every environment variable tgrad reads is checked, and a bad value names the variable,
the value and what is allowed; a device that can't start says what to install or that no GPU is visible."""
import os, subprocess, sys, textwrap
import pytest
from tgrad.helpers import Context, SettingError, _settings_from_environment, MAX_DEBUG
from tgrad.device import Device, DeviceUnavailable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def run_python(code: str, env_updates: dict[str, str], pythonpath: str = "") -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "BEAM", "NOOPT", "DEVICE", "CACHELEVEL",
                                                            "IGNORE_BEAM_CACHE", "THREADS", "BEAM_BUDGET")}
  env.update(env_updates)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, REPO, env.get("PYTHONPATH", "")) if p)
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)

BAD_VALUES = [("DEBUG", "abc", "from 0 to 5"), ("DEBUG", str(MAX_DEBUG + 1), "from 0 to 5"), ("DEBUG", "-1", "0 to 5"),
              ("BEAM", "abc", ">= 0"), ("BEAM", "-2", ">= 0"), ("BEAM", "1.5", ">= 0"), ("NOOPT", "2", "0 or 1"),
              ("NOOPT", "yes", "0 or 1"), ("CACHELEVEL", "3", "0 or 1"), ("IGNORE_BEAM_CACHE", "x", "0 or 1"),
              ("THREADS", "-1", ">= 0"), ("THREADS", "many", ">= 0"), ("BEAM_BUDGET", "0", ">= 1"),
              ("BEAM_BUDGET", "2.5", ">= 1")]

@pytest.mark.parametrize("name,value,allowed", BAD_VALUES)
def test_bad_environment_value_names_variable_value_and_allowed(monkeypatch, name, value, allowed):
  monkeypatch.setenv(name, value)
  with pytest.raises(SettingError) as error: _settings_from_environment()
  message = str(error.value)
  assert f"environment variable {name}=" in message and value in message and allowed in message

def test_good_environment_values_parse(monkeypatch):
  for name, value in (("DEBUG", " 3 "), ("BEAM", "4"), ("NOOPT", "1"), ("CACHELEVEL", "0"), ("THREADS", "2"),
                      ("IGNORE_BEAM_CACHE", "1"), ("DEVICE", "cpu"), ("BEAM_BUDGET", "10")):
    monkeypatch.setenv(name, value)
  monkeypatch.setenv("DEBUG", " 3 ")
  settings = _settings_from_environment()
  assert (settings.DEBUG, settings.BEAM, settings.NOOPT, settings.CACHELEVEL, settings.THREADS,
          settings.IGNORE_BEAM_CACHE, settings.DEVICE, settings.BEAM_BUDGET) == (3, 4, 1, 0, 2, 1, "cpu", 10)
  monkeypatch.setenv("BEAM", "")   # set but empty: the default
  assert _settings_from_environment().BEAM == 0

def test_bad_value_fails_at_import_with_a_clear_last_line():
  result = run_python("import tgrad", {"BEAM": "abc"})
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == ("tgrad.helpers.SettingError: environment variable BEAM='abc' is "
                                                     "not valid: expected a whole number >= 0 (the beam width; 0 uses "
                                                     "the heuristics)")

def test_context_overrides_are_checked():
  with pytest.raises(SettingError, match="Context BEAM=-1 is not valid"): Context(BEAM=-1)
  with pytest.raises(SettingError, match="Context NOOPT='on' is not valid: expected 0 or 1"): Context(NOOPT="on")
  with pytest.raises(SettingError, match="unknown setting 'BEMA'"): Context(BEMA=2)
  with Context(DEBUG="2"): assert Context.DEBUG == 2

def test_unknown_device_names_the_variable():
  with Context(DEVICE="NOPE"):
    with pytest.raises(ValueError, match=r"DEVICE='NOPE' is not a device; allowed: CUDA, LLVM, .*GPU, CPU") as error:
      Device.default()
  assert "or unset for the first usable of CUDA, LLVM" in str(error.value)
  with Context(DEVICE="cpu"): assert Device.default() == "LLVM"

def test_cuda_without_pycuda_says_what_to_install():
  code = textwrap.dedent("""
    import sys
    sys.modules["pycuda"] = sys.modules["pycuda.driver"] = None   # as if pycuda were not installed
    from tgrad.device import Device
    print("available", Device.available("CUDA"))
    from tgrad import Tensor
    Tensor([1.0, 2.0]).numpy()
  """)
  result = run_python(code, {"DEVICE": "CUDA"})
  assert "available False" in result.stdout
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == ("tgrad.device.DeviceUnavailable: device CUDA needs the Python "
                                                     "package pycuda, which is not installed: pip install -e '.[cuda]'")

def test_cuda_without_a_visible_gpu_says_so(tmp_path):
  """pycuda installed but the driver sees no GPU (a stand-in pycuda whose cuInit fails as the real one does)."""
  stub = tmp_path / "pycuda"
  stub.mkdir()
  (stub / "__init__.py").write_text("")
  (stub / "driver.py").write_text(textwrap.dedent("""
    class Error(Exception): pass
    class LogicError(Error): pass
    class MemoryError(Error): pass
    def init(): raise LogicError("cuInit failed: no CUDA-capable device is detected")
  """))
  code = "from tgrad.device import Device\nprint('available', Device.available('CUDA'))\nDevice['CUDA']"
  result = run_python(code, {}, pythonpath=str(tmp_path))
  assert "available False" in result.stdout
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("tgrad.device.DeviceUnavailable: device CUDA can't start: no GPU is visible"), last
  assert "DEVICE=LLVM" in last and "no CUDA-capable device is detected" in last

def test_device_unavailable_is_a_runtime_error():
  assert issubclass(DeviceUnavailable, RuntimeError)
  assert Device.available("LLVM") and not Device.available("NOPE")
