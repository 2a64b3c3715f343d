"""tgrad.nn.file_snapshot and safe_load on it: a loaded file may be rewritten, truncated (in place and by safe_save) or
deleted and the tensors keep their values; a change during a read raises FileChangedError naming the file. The cases
that used to die of SIGBUS run in a subprocess, so a crash fails the test instead of killing pytest."""
import os, signal, subprocess, sys, textwrap
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.nn.file_snapshot import FileSnapshot, FileChangedError, atomic_write
from tgrad.nn.state import safe_load, safe_save

SUBPROCESS_TIMEOUT_SECONDS = 120
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OLD_VALUES = np.arange(4096, dtype=np.float32)   # 16 KiB: several pages, so a truncation unmaps real pages

def _save(path, values) -> None: safe_save({"w": Tensor(values)}, str(path))

def _run_python(code: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                        timeout=SUBPROCESS_TIMEOUT_SECONDS, env={**os.environ, "DEVICE": "LLVM"})

def test_rewrite_with_new_values_keeps_the_old_ones(tmp_path):
  path = tmp_path / "w.safetensors"
  _save(path, OLD_VALUES)
  w = safe_load(str(path))["w"]
  _save(path, OLD_VALUES + 1000)
  np.testing.assert_array_equal(w.numpy(), OLD_VALUES)
  np.testing.assert_array_equal(safe_load(str(path))["w"].numpy(), OLD_VALUES + 1000)   # a new load sees the new file

@pytest.mark.parametrize("how", ["safe_save", "os.truncate", "delete"])
def test_shorter_file_or_deletion_keeps_values_and_never_crashes(tmp_path, how):
  """The old memory-mapped loader died of SIGBUS here (the pages behind the map were gone): run it in a child."""
  path = tmp_path / "w.safetensors"
  _save(path, OLD_VALUES)
  change = {"safe_save": "safe_save({'w': Tensor(np.zeros(2, np.float32))}, path)",
            "os.truncate": "os.truncate(path, 64)", "delete": "os.remove(path)"}[how]
  result = _run_python(f"""
    import os, numpy as np
    from tgrad import Tensor
    from tgrad.nn.state import safe_load, safe_save
    path = {str(path)!r}
    w = safe_load(path)["w"]
    {change}
    print(float(w.numpy().sum()))
  """)
  assert result.returncode == 0, f"child exited with {result.returncode} " \
    f"({signal.Signals(-result.returncode).name if result.returncode < 0 else 'error'}): {result.stderr[-2000:]}"
  assert float(result.stdout.split()[-1]) == float(OLD_VALUES.sum())

def test_safe_save_replaces_the_file_atomically(tmp_path):
  path = tmp_path / "w.safetensors"
  _save(path, OLD_VALUES)
  inode = os.stat(path).st_ino
  with open(path, "rb") as old_reader:
    _save(path, OLD_VALUES[:8])
    assert os.stat(path).st_ino != inode                       # a new file took the name ...
    assert len(old_reader.read()) > OLD_VALUES.nbytes          # ... and the old one is whole for whoever holds it
  assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]   # no temporary file left behind

def test_failed_atomic_write_leaves_the_file_alone(tmp_path):
  path = tmp_path / "w.safetensors"
  path.write_bytes(b"old")
  with pytest.raises(RuntimeError, match="interrupted"):
    with atomic_write(str(path)) as f:
      f.write(b"partial")
      raise RuntimeError("interrupted")
  assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]

def test_atomic_write_gives_the_usual_permissions(tmp_path):
  umask = os.umask(0o022)
  try:
    with atomic_write(str(tmp_path / "new.bin")) as f: f.write(b"x")
  finally: os.umask(umask)
  assert os.stat(tmp_path / "new.bin").st_mode & 0o777 == 0o644

def test_read_checks_the_identity_and_the_length(tmp_path):
  path = tmp_path / "data.bin"
  path.write_bytes(bytes(range(256)) * 4)
  with FileSnapshot(str(path)) as snapshot:
    assert snapshot.size == 1024
    assert snapshot.read(250, 10).tolist() == list(range(250, 256)) + [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"data\.bin: read of 10 bytes at offset 1020"):
      snapshot.read(1020, 10)
    os.truncate(path, 100)   # shorter than recorded: the read stops early, never a signal
    with pytest.raises(FileChangedError, match=r"data\.bin: the file ended at byte 100"):
      snapshot.read(0, 1024)
  with FileSnapshot(str(path)) as snapshot:
    with open(path, "ab") as f: f.write(b"more")   # a write in place moves the size and modification time
    with pytest.raises(FileChangedError, match=r"data\.bin: the file changed while it was being read"):
      snapshot.read(0, 10)

def test_replaced_file_reads_the_opened_one(tmp_path):
  """os.replace gives the name to a new file; an open snapshot keeps reading the one it opened, unchanged."""
  path = tmp_path / "data.bin"
  path.write_bytes(b"A" * 64)
  with FileSnapshot(str(path)) as snapshot:
    with atomic_write(str(path)) as f: f.write(b"B" * 8)
    assert snapshot.read(0, 64).tobytes() == b"A" * 64

def test_missing_file_raises_file_not_found(tmp_path):
  with pytest.raises(FileNotFoundError): safe_load(str(tmp_path / "absent.safetensors"))
