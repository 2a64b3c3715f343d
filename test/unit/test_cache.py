"""Tests for tgrad/cache.py: round trips of binaries, opts and timings, across processes, with CACHELEVEL=0, on a
corrupt or locked file, under concurrent writers, and through the `python -m tgrad.cache` command line.
"""
import json, os, sqlite3, subprocess, sys, warnings
from pathlib import Path
import pytest
import tgrad.cache as cache_module
from tgrad.cache import BINARIES, OPTS, TIMINGS, CacheWarning, get_cache
from tgrad.helpers import Context

REPO_ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_SECONDS = 60
OPTS_KEY = {"ast": "abc123", "device": "LLVM", "arch": "znver5", "renderer": "fast-math", "actions": "v1", "beam": "2"}

@pytest.fixture
def cache_file(tmp_path, monkeypatch) -> Path:
  path = tmp_path / "cache.db"
  monkeypatch.setenv("TGRAD_CACHE", str(path))
  monkeypatch.setattr(cache_module, "_warned", False)
  return path

def run_python(code: str, cache_path: Path, *args: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "TGRAD_CACHE": str(cache_path), "PYTHONPATH": str(REPO_ROOT)}
  command = [sys.executable, *(["-c", code] if code else []), *args]
  return subprocess.run(command, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_SECONDS)

def test_binary_round_trip(cache_file):
  cache = get_cache()
  cache.put_binary("kernel void f() {}", "sm_90 -O3", b"\x00\x01ELF\xff")
  assert cache.get_binary("kernel void f() {}", "sm_90 -O3") == b"\x00\x01ELF\xff"
  assert cache.get_binary("kernel void f() {}", "sm_89 -O3") is None
  assert cache.get_binary("kernel void g() {}", "sm_90 -O3") is None
  assert cache.get_binary("kernel void f() {}sm_90", " -O3") is None  # source and key do not run together
  assert cache_file.exists()

def test_opts_round_trip_ignores_key_order(cache_file):
  cache = get_cache()
  opts = [["UPCAST", 0, 4], ["LOCAL", 1, 16]]
  cache.put_opts(OPTS_KEY, opts)
  assert cache.get_opts(dict(reversed(list(OPTS_KEY.items())))) == opts
  assert cache.get_opts({**OPTS_KEY, "beam": "4"}) is None
  cache.put_opts(OPTS_KEY, [])
  assert cache.get_opts(OPTS_KEY) == []

def test_bad_argument_types_raise():
  cache = get_cache()
  with pytest.raises(TypeError, match="list"): cache.get_opts(["ast", "abc"])
  with pytest.raises(TypeError, match="strings"): cache.get_opts({1: "abc"})
  with pytest.raises(TypeError, match="bytes"): cache.put_binary("src", "key", "not bytes")

def test_timings_append_in_order(cache_file):
  cache = get_cache()
  cache.add_timing("kernel_a", [["UPCAST", 0, 4]], "LLVM", "znver5", [1.5e-5, 1.25e-5])
  cache.add_timing("kernel_a", [], "LLVM", "znver5", [3e-5])
  cache.add_timing("kernel_b", [], "CUDA", "sm_90", [2e-6])
  rows = cache.get_timings("kernel_a")
  assert [row["times"] for row in rows] == [[1.5e-5, 1.25e-5], [3e-5]]
  assert rows[0]["opts"] == [["UPCAST", 0, 4]] and rows[0]["device"] == "LLVM" and rows[0]["arch"] == "znver5"
  assert rows[0]["timestamp"] <= rows[1]["timestamp"]
  assert cache.get_timings("kernel_c") == []

def test_stats_export_and_clear(cache_file):
  cache = get_cache()
  cache.put_binary("src", "key", b"12345")
  cache.put_opts(OPTS_KEY, [["GROUP", 0, 8]])
  cache.add_timing("kernel_a", [], "LLVM", "znver5", [1e-3])
  stats = cache.stats()
  assert stats["path"] == str(cache_file) and stats["size_bytes"] > 0 and stats["error"] is None
  assert stats["rows"] == {BINARIES: 1, OPTS: 1, TIMINGS: 1}
  exported = json.loads(json.dumps(cache.export_json()))
  assert [b["size"] for b in exported["binaries"]] == [5]
  assert exported["opts"][0]["key_fields"] == OPTS_KEY and exported["opts"][0]["opts"] == [["GROUP", 0, 8]]
  assert exported["timings"][0]["times"] == [1e-3]
  cache.clear()
  assert cache.stats()["rows"] == {BINARIES: 0, OPTS: 0, TIMINGS: 0}
  assert cache.get_binary("src", "key") is None

def test_get_cache_follows_tgrad_cache(cache_file, tmp_path, monkeypatch):
  first = get_cache()
  first.put_binary("src", "key", b"first")
  assert get_cache() is first
  monkeypatch.setenv("TGRAD_CACHE", str(tmp_path / "other.db"))
  second = get_cache()
  assert second is not first and second.path == str(tmp_path / "other.db")
  assert second.get_binary("src", "key") is None

def test_round_trip_across_processes(cache_file):
  writer = ("from tgrad.cache import get_cache\n"
            "cache = get_cache()\n"
            "cache.put_binary('src', 'key', bytes(range(256)))\n"
            f"cache.put_opts({OPTS_KEY!r}, [['UNROLL', 0, 4]])\n"
            "cache.add_timing('kernel_a', [], 'LLVM', 'znver5', [0.25])\n")
  result = run_python(writer, cache_file)
  assert result.returncode == 0, result.stderr
  cache = get_cache()
  assert cache.get_binary("src", "key") == bytes(range(256))
  assert cache.get_opts(OPTS_KEY) == [["UNROLL", 0, 4]]
  assert [row["times"] for row in cache.get_timings("kernel_a")] == [[0.25]]
  cache.put_binary("src2", "key", b"from the parent")
  reader = "from tgrad.cache import get_cache\nprint(get_cache().get_binary('src2', 'key'))"
  assert run_python(reader, cache_file).stdout.strip() == "b'from the parent'"

def test_cachelevel_zero_turns_the_cache_off(cache_file):
  cache = get_cache()
  with Context(CACHELEVEL=0):
    cache.put_binary("src", "key", b"binary")
    cache.put_opts(OPTS_KEY, [["UPCAST", 0, 4]])
    cache.add_timing("kernel_a", [], "LLVM", "znver5", [1.0])
    assert cache.get_binary("src", "key") is None and cache.get_opts(OPTS_KEY) is None
  assert not cache_file.exists()  # nothing was even opened
  cache.put_binary("src", "key", b"binary")
  cache.add_timing("kernel_a", [], "LLVM", "znver5", [1.0])
  with Context(CACHELEVEL=0):
    assert cache.get_binary("src", "key") is None and cache.get_timings("kernel_a") == []
  assert cache.get_binary("src", "key") == b"binary" and cache.get_opts(OPTS_KEY) is None

def test_corrupt_file_warns_once_and_runs_without_cache(cache_file):
  cache_file.write_bytes(b"this is not an sqlite database\x00\xff" * 200)
  cache = get_cache()
  with pytest.warns(CacheWarning, match="cache.db"):
    assert cache.get_binary("src", "key") is None
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # a second warning would raise here
    cache.put_binary("src", "key", b"binary")
    assert cache.get_binary("src", "key") is None
    cache.put_opts(OPTS_KEY, [])
    assert cache.get_opts(OPTS_KEY) is None
    cache.add_timing("kernel_a", [], "LLVM", "znver5", [1.0])
    assert cache.get_timings("kernel_a") == []
    stats = cache.stats()
    assert "DatabaseError" in stats["error"] and stats["rows"] == {BINARIES: 0, OPTS: 0, TIMINGS: 0}

def test_locked_file_warns_and_runs_without_cache(cache_file, monkeypatch):
  monkeypatch.setattr(cache_module, "BUSY_TIMEOUT_SECONDS", 0.05)
  cache = get_cache()
  cache.put_binary("src", "key", b"binary")
  holder = sqlite3.connect(cache_file, isolation_level=None)
  holder.execute("BEGIN EXCLUSIVE")
  holder.execute(f"DELETE FROM {BINARIES}")
  try:
    with pytest.warns(CacheWarning, match="locked"):
      cache.put_binary("src2", "key", b"binary2")
    assert cache.get_binary("src", "key") is None  # turned off: misses even what is in the file
  finally:
    holder.execute("ROLLBACK")
    holder.close()

def test_concurrent_writers(cache_file):
  writers, rows_each = 4, 50
  code = ("import sys\nfrom tgrad.cache import get_cache\ncache, writer = get_cache(), sys.argv[1]\n"
          f"for i in range({rows_each}):\n"
          "  cache.put_binary(f'src {writer} {i}', 'key', bytes(1000))\n"
          "  cache.add_timing(f'kernel {writer}', [i], 'LLVM', 'znver5', [i * 1e-6])\n"
          "assert cache.error is None, cache.error\n")
  env = {**os.environ, "TGRAD_CACHE": str(cache_file), "PYTHONPATH": str(REPO_ROOT)}
  processes = [subprocess.Popen([sys.executable, "-c", code, str(w)], env=env, stderr=subprocess.PIPE, text=True)
               for w in range(writers)]
  errors = [p.communicate(timeout=SUBPROCESS_TIMEOUT_SECONDS)[1] for p in processes]
  assert [p.returncode for p in processes] == [0] * writers, errors
  assert not any("CacheWarning" in e for e in errors), errors
  stats = get_cache().stats()
  assert stats["rows"][BINARIES] == writers * rows_each and stats["rows"][TIMINGS] == writers * rows_each
  assert [row["opts"] for row in get_cache().get_timings("kernel 3")] == [[i] for i in range(rows_each)]

def test_command_line_info_export_clear(cache_file, tmp_path):
  get_cache().put_binary("src", "key", b"123")
  get_cache().add_timing("kernel_a", [], "LLVM", "znver5", [0.5])
  info = run_python("", cache_file, "-m", "tgrad.cache")
  assert info.returncode == 0, info.stderr
  assert str(cache_file) in info.stdout and f"{BINARIES:<15} 1 rows" in info.stdout
  exported = json.loads(run_python("", cache_file, "-m", "tgrad.cache", "export").stdout)
  assert [b["size"] for b in exported["binaries"]] == [3] and exported["timings"][0]["times"] == [0.5]
  export_path = tmp_path / "export.json"
  assert run_python("", cache_file, "-m", "tgrad.cache", "export", str(export_path)).returncode == 0
  assert json.loads(export_path.read_text()) == exported
  cleared = run_python("", cache_file, "-m", "tgrad.cache", "clear")
  assert cleared.returncode == 0 and f"{TIMINGS:<15} 0 rows" in cleared.stdout
  assert get_cache().stats()["rows"][TIMINGS] == 0
