"""Tests for the authenticated, bounded cache (tgrad/cache.py): rows written without the secret (an attacker's object
file, swapped, flipped, emptied or truncated binaries, edited opts rows), authenticated rows that are still unusable
(a malformed object, opts that are not opts), a cache file of another secret, concurrent writers, the secret file
itself, and least-recently-used eviction. Real LLVM kernels run through the cache in fresh processes.
"""
import json, multiprocessing, os, re, shutil, sqlite3, subprocess, sys, threading, time, warnings
from pathlib import Path
import numpy as np
import pytest
import tgrad.cache as cache_module
from tgrad.cache import BINARIES, OPTS, CacheWarning, get_cache, row_mac
from tgrad.helpers import Context

REPO_ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_SECONDS = 120
SLOW_DISK_SECONDS = 0.5   # how long the patched write of a slow disk takes
# the child computes x + 1 and x * 2 (two LLVM kernels) and prints both as JSON
ADD_AND_DOUBLE = """
import json, numpy as np
from tgrad.tensor import Tensor
x = Tensor(np.array([1., 2., 3., 4.], dtype=np.float32)).realize()
print(json.dumps([(x + 1).numpy().tolist(), (x * 2).numpy().tolist()]))
"""
EXPECTED = [[2.0, 3.0, 4.0, 5.0], [2.0, 4.0, 6.0, 8.0]]
# with BEAM=1 the row sums are searched and the opts cached
BEAM_SUM = """
import json, numpy as np
from tgrad.tensor import Tensor
print(json.dumps(Tensor(np.arange(64, dtype=np.float32).reshape(8, 8)).sum(axis=1).numpy().tolist()))
"""
BEAM_EXPECTED = np.arange(64, dtype=np.float32).reshape(8, 8).sum(axis=1).tolist()

def run_child(code: str, folder: Path, secret: Path, **env: str) -> tuple[object, str]:
  """Run `code` in a fresh process on the cache in `folder`; (its printed JSON, its stderr)."""
  environment = {**os.environ, "TGRAD_CACHE": str(folder / "cache.db"), "TGRAD_CACHE_SECRET": str(secret),
                 "PYTHONPATH": str(REPO_ROOT), "DEVICE": "LLVM", **env}
  done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                        timeout=SUBPROCESS_TIMEOUT_SECONDS)
  assert done.returncode == 0, f"child failed ({done.returncode}): {done.stderr[-3000:]}"
  return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr

def rows(folder: Path, query: str, arguments: tuple = ()) -> list[tuple]:
  conn = sqlite3.connect(folder / "cache.db", isolation_level=None)
  try: return conn.execute(query, arguments).fetchall()
  finally: conn.close()

def all_rows_verify(folder: Path, secret: Path) -> bool:
  key = secret.read_bytes()
  binaries = rows(folder, f"SELECT key, binary, mac FROM {BINARIES}")
  opts = rows(folder, f"SELECT key, opts, mac FROM {OPTS}")
  return all(row_mac(key, BINARIES, k, b) == mac for k, b, mac in binaries) and \
    all(row_mac(key, OPTS, k, o) == mac for k, o, mac in opts)

@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> tuple[Path, Path]:
  """A cache (folder, secret) holding the two kernels of ADD_AND_DOUBLE, made once by a child process."""
  folder = tmp_path_factory.mktemp("warm")
  result, stderr = run_child(ADD_AND_DOUBLE, folder, folder / "secret")
  assert result == EXPECTED and "CacheWarning" not in stderr
  assert len(rows(folder, f"SELECT key FROM {BINARIES}")) == 2
  return folder, folder / "secret"

@pytest.fixture
def cache_copy(warm_cache, tmp_path) -> tuple[Path, Path]:
  """A private copy of warm_cache (file and secret) for one test to damage."""
  folder, secret = warm_cache
  for name in ("cache.db", "secret"): shutil.copy2(folder / name, tmp_path / name)
  os.chmod(tmp_path / "secret", 0o600)
  return tmp_path, tmp_path / "secret"

def attacker_object(names: list[str], marker: Path) -> bytes:
  """An object file whose functions, named like the cached kernels, run `touch marker` through system()."""
  from tgrad.runtime.llvm.runtime import LLVMCompiler
  command = f"touch {marker}".encode() + b"\0"
  escaped = "".join("\\%02X" % b for b in command)
  ir = [f'@cmd = private constant [{len(command)} x i8] c"{escaped}"',
        "declare i32 @system(ptr)"]
  ir += [f"define void @{name}(ptr %a, ptr %b, i32 %core) {{\n  %r = call i32 @system(ptr @cmd)\n  ret void\n}}"
         for name in names]
  return LLVMCompiler().compile("\n".join(ir) + "\n")

def kernel_names(folder: Path) -> list[str]:
  """The functions the cached objects define (read from their ELF symbol tables)."""
  from tgrad.runtime.llvm.runtime import ELF_HEADER, ELF_SECTION, ELF_SYMBOL, SHT_SYMTAB
  STT_FUNC = 2
  names = set()
  for (binary,) in rows(folder, f"SELECT binary FROM {BINARIES}"):
    header = ELF_HEADER.unpack_from(binary)
    table = [ELF_SECTION.unpack_from(binary, header[6] + i * ELF_SECTION.size) for i in range(header[12])]
    for section in (t for t in table if t[1] == SHT_SYMTAB):
      strings = table[section[6]][4]
      for start in range(section[4], section[4] + section[5], ELF_SYMBOL.size):
        name_at, info, _, shndx, _, _ = ELF_SYMBOL.unpack_from(binary, start)
        if info & 0xf == STT_FUNC and shndx: names.add(bytes(binary[strings + name_at:]).split(b"\0")[0].decode())
  return sorted(names)

def test_attacker_object_is_never_loaded(cache_copy, tmp_path):
  folder, secret = cache_copy
  marker = tmp_path / "attacker-was-here"
  from tgrad.runtime.llvm.runtime import LLVMProgram
  from tgrad.device import Device
  names = kernel_names(folder)
  assert names   # both kernels are E_4-like names: the attacker defines each
  evil = attacker_object(names, marker)
  # the control: loaded and called, the object does run the command
  program = LLVMProgram(names[0], evil)
  buffer = Device["LLVM"].allocator.alloc(16)
  program(buffer, buffer)
  assert marker.exists()
  marker.unlink()
  rows(folder, f"UPDATE {BINARIES} SET binary = ?", (evil,))   # the attacker has the file, not the secret
  result, stderr = run_child(ADD_AND_DOUBLE, folder, secret)
  assert result == EXPECTED and not marker.exists()
  assert stderr.count("failed authentication") == 2 and "CacheWarning" in stderr
  assert all(bytes(b) != evil for (b,) in rows(folder, f"SELECT binary FROM {BINARIES}")) and all_rows_verify(folder,
                                                                                                             secret)

@pytest.mark.parametrize("damage", ["swap", "flip", "empty", "truncate"])
def test_damaged_binaries_are_dropped_and_rebuilt(cache_copy, damage):
  folder, secret = cache_copy
  (key_a, binary_a), (key_b, binary_b) = rows(folder, f"SELECT key, binary FROM {BINARIES} ORDER BY key")
  damaged = {"swap": {key_a: binary_b, key_b: binary_a},
             "flip": {key_a: bytes(binary_a[:200]) + bytes([binary_a[200] ^ 0x10]) + bytes(binary_a[201:])},
             "empty": {key_a: b""},
             "truncate": {key_b: bytes(binary_b[:len(binary_b) // 2])}}[damage]
  for key, binary in damaged.items(): rows(folder, f"UPDATE {BINARIES} SET binary = ? WHERE key = ?", (binary, key))
  result, stderr = run_child(ADD_AND_DOUBLE, folder, secret)
  assert result == EXPECTED   # after a swap, x + 1 still adds and x * 2 still doubles
  assert stderr.count("failed authentication") == len(damaged)
  after = dict(rows(folder, f"SELECT key, binary FROM {BINARIES}"))
  assert all(after[key] != binary for key, binary in damaged.items()) and all_rows_verify(folder, secret)

def test_authenticated_but_malformed_object_is_rejected_by_the_loader(cache_copy):
  folder, secret = cache_copy
  (key, binary), _ = rows(folder, f"SELECT key, binary FROM {BINARIES} ORDER BY key")
  malformed = bytes(binary[:64]) + b"\0" * (len(binary) - 64)   # a valid header over nothing: section table of zeros
  rows(folder, f"UPDATE {BINARIES} SET binary = ?, mac = ? WHERE key = ?",
       (malformed, row_mac(secret.read_bytes(), BINARIES, key, malformed), key))
  result, stderr = run_child(ADD_AND_DOUBLE, folder, secret)
  assert result == EXPECTED and "rejected by the LLVM loader" in stderr and "CacheWarning" in stderr
  assert dict(rows(folder, f"SELECT key, binary FROM {BINARIES}"))[key] == binary

def test_cache_of_another_secret_reads_as_empty(cache_copy, tmp_path):
  folder, _ = cache_copy
  result, stderr = run_child(ADD_AND_DOUBLE, folder, tmp_path / "other-user-secret")
  assert result == EXPECTED and stderr.count("another secret") == 1 and "failed authentication" not in stderr
  assert all_rows_verify(folder, tmp_path / "other-user-secret") and len(rows(folder, f"SELECT * FROM {BINARIES}")) == 2

@pytest.fixture(scope="module")
def beam_cache(tmp_path_factory) -> Path:
  folder = tmp_path_factory.mktemp("beam")
  result, stderr = run_child(BEAM_SUM, folder, folder / "secret", BEAM="1")
  assert result == BEAM_EXPECTED and "CacheWarning" not in stderr
  assert len(rows(folder, f"SELECT key FROM {OPTS}")) == 1
  return folder

@pytest.mark.parametrize("opts, signed, warning", [
  ('[["UPCAST", 0, 8]', False, "failed authentication"),     # edited without the secret
  ('[["UPCAST", 0, 8]', True, "not a JSON list"),            # invalid JSON
  ('{"UPCAST": [0, 8]}', True, "not a JSON list"),           # wrong structure
  ('[["UPCAST", "0", 8]]', True, "is not \\[op name"),        # wrong types
  ('[["NO_SUCH_OP", 0, 8]]', True, "is not \\[op name"),
  ('[["UPCAST", 0]]', True, "is not \\[op name"),
])
def test_bad_opts_rows_are_dropped_and_searched_again(beam_cache, tmp_path, opts, signed, warning):
  for name in ("cache.db", "secret"): shutil.copy2(beam_cache / name, tmp_path / name)
  secret = tmp_path / "secret"
  (key,), = rows(tmp_path, f"SELECT key FROM {OPTS}")
  mac = row_mac(secret.read_bytes(), OPTS, key, opts) if signed else b"\0" * 32
  rows(tmp_path, f"UPDATE {OPTS} SET opts = ?, mac = ?", (opts, mac))
  result, stderr = run_child(BEAM_SUM, tmp_path, secret, BEAM="1")
  assert result == BEAM_EXPECTED and "CacheWarning" in stderr
  assert re.search(warning, stderr), stderr[-2000:]
  (stored,), = rows(tmp_path, f"SELECT opts FROM {OPTS} WHERE key = ?", (key,))
  assert stored != opts and isinstance(json.loads(stored), list) and all_rows_verify(tmp_path, secret)

# ---- in-process: the API, the secret file, eviction and concurrent writers

@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
  monkeypatch.setenv("TGRAD_CACHE", str(tmp_path / "cache.db"))
  monkeypatch.setenv("TGRAD_CACHE_SECRET", str(tmp_path / "secret"))
  for flag in ("_warned", "_warned_foreign"): monkeypatch.setattr(cache_module, flag, False)
  monkeypatch.setattr(cache_module, "_secrets", {})
  return tmp_path

def test_secret_file_is_private_and_outside_the_cache(fresh_cache):
  cache = get_cache()
  cache.put_binary("src", "key", b"bytes")
  secret = fresh_cache / "secret"
  assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_bytes()) == cache_module.SECRET_BYTES
  assert secret.read_bytes() not in (fresh_cache / "cache.db").read_bytes()

def test_secret_readable_by_others_turns_the_cache_off(fresh_cache):
  (fresh_cache / "secret").write_bytes(os.urandom(cache_module.SECRET_BYTES))
  os.chmod(fresh_cache / "secret", 0o644)
  with pytest.warns(CacheWarning, match="others may read it"):
    get_cache().put_binary("src", "key", b"bytes")
  assert get_cache().get_binary("src", "key") is None and "CacheSecretError" in get_cache().error

def _read_secret_in_child(path: str, out) -> None:
  out.put(cache_module.cache_secret(path))

def test_concurrent_first_users_agree_on_one_secret(tmp_path):
  path, context = str(tmp_path / "new" / "secret"), multiprocessing.get_context("fork")
  out = context.Queue()
  children = [context.Process(target=_read_secret_in_child, args=(path, out)) for _ in range(4)]
  for child in children: child.start()
  secrets_read = [out.get(timeout=SUBPROCESS_TIMEOUT_SECONDS) for _ in children]
  for child in children: child.join()
  assert len(set(secrets_read)) == 1 and secrets_read[0] == Path(path).read_bytes()

_write = os.write

def _slow_write(fd: int, data: bytes) -> int:
  time.sleep(SLOW_DISK_SECONDS)
  return _write(fd, data)

def test_a_slow_disk_never_shows_a_short_secret(tmp_path, monkeypatch):
  # the first user's write outlasts a reader's patience: readers still see no file or the whole secret
  monkeypatch.setattr(cache_module, "SECRET_WAIT_SECONDS", SLOW_DISK_SECONDS / 10)
  monkeypatch.setattr(os, "write", _slow_write)
  test_concurrent_first_users_agree_on_one_secret(tmp_path)
  assert [p.name for p in (tmp_path / "new").iterdir()] == ["secret"]   # no temporary file is left behind

def test_a_lock_held_past_the_busy_timeout_is_waited_out(fresh_cache, monkeypatch):
  monkeypatch.setattr(cache_module, "BUSY_TIMEOUT_SECONDS", 0.1)
  cache = get_cache()
  cache.put_binary("first", "key", b"1")
  other = sqlite3.connect(cache.path, isolation_level=None, check_same_thread=False)
  other.execute("BEGIN IMMEDIATE")   # another process's write, longer than one busy timeout
  releaser = threading.Timer(0.25, lambda: other.execute("COMMIT"))
  releaser.start()
  try: cache.put_binary("second", "key", b"2")
  finally: releaser.join()
  other.close()
  assert cache.error is None and cache.get_binary("second", "key") == b"2"

def test_a_lock_that_never_passes_turns_the_store_off(fresh_cache, monkeypatch):
  monkeypatch.setattr(cache_module, "BUSY_TIMEOUT_SECONDS", 0.05)
  cache = get_cache()
  cache.put_binary("first", "key", b"1")
  other = sqlite3.connect(cache.path, isolation_level=None)
  other.execute("BEGIN IMMEDIATE")
  try:
    with pytest.warns(CacheWarning, match="locked"): cache.put_binary("second", "key", b"2")
  finally: other.close()
  assert "locked" in cache.error and cache.get_binary("first", "key") is None

def _write_and_read(index: int) -> list[bool]:
  cache = get_cache()
  found = []
  for i in range(20):
    cache.put_binary(f"src {index} {i}", "key", bytes([index]) * (100 + i))
    cache.put_opts({"ast": f"{index} {i}"}, [["UPCAST", 0, index]])
    found.append(cache.get_binary(f"src {index} {i}", "key") == bytes([index]) * (100 + i))
  return found

def test_concurrent_writers_authenticate(fresh_cache):
  with multiprocessing.get_context("fork").Pool(4) as pool: results = pool.map(_write_and_read, range(4))
  assert all(all(found) for found in results)
  with warnings.catch_warnings():
    warnings.simplefilter("error")   # every row written by the four processes authenticates here
    cache = get_cache()
    assert all(cache.get_binary(f"src {p} {i}", "key") == bytes([p]) * (100 + i) for p in range(4) for i in range(20))
    assert all(cache.get_opts({"ast": f"{p} {i}"}) == [["UPCAST", 0, p]] for p in range(4) for i in range(20))
  assert cache.dropped == 0 and cache.stats()["rows"][BINARIES] == 80

def test_least_recently_used_binaries_are_evicted(fresh_cache):
  cache, size, bound = get_cache(), 300, 1000
  with Context(CACHE_MAX_BYTES=bound):
    for name in "abc": cache.put_binary(name, "key", name.encode() * size)
    assert cache.binary_bytes() == 3 * size and cache.evicted == 0
    assert cache.get_binary("a", "key") == b"a" * size   # a is now the most recently used: b goes first
    cache.put_binary("d", "key", b"d" * size)            # 1200 > 1000: evict down to 900
    assert cache.evicted == 1 and cache.get_binary("b", "key") is None
    assert [cache.get_binary(n, "key") is not None for n in "acd"] == [True, True, True]
    assert cache.binary_bytes() == 3 * size <= bound
    cache.put_binary("huge", "key", b"h" * (2 * bound))   # bigger than the bound alone: everything else goes
    assert cache.binary_bytes() == 2 * bound and cache.stats()["rows"][BINARIES] == 1
  assert rows(fresh_cache, f"SELECT SUM(length(binary)) FROM {BINARIES}") == [(2 * bound,)]

def test_hits_are_written_in_batches(fresh_cache):
  cache = get_cache()
  cache.put_binary("a", "key", b"a")
  (before,), = rows(fresh_cache, f"SELECT last_used FROM {BINARIES}")
  cache._touched.clear()   # as in a new process: the next hit is recorded
  assert cache.get_binary("a", "key") == b"a" and len(cache._pending_touches) == 1
  assert rows(fresh_cache, f"SELECT last_used FROM {BINARIES}") == [(before,)]   # the hit wrote nothing yet
  cache.flush_touches()
  (after,), = rows(fresh_cache, f"SELECT last_used FROM {BINARIES}")
  assert after > before and not cache._pending_touches
