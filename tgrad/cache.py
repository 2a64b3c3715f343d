"""The persistent cache: compiled binaries, opts chosen by search, and every measured timing, in one sqlite file.

Input: plain keys (source text and a target key, or a dict of strings); output: bytes or JSON values, None on a miss.
The file is ~/.cache/tgrad/cache.db (TGRAD_CACHE overrides); CACHELEVEL=0 makes gets miss and puts do nothing.
Every row carries an HMAC-SHA256 of its table, key and value under a per-user secret kept outside the file
(~/.config/tgrad/cache-secret, TGRAD_CACHE_SECRET overrides): a row that fails the check (written by anyone without
the secret, swapped, truncated) is deleted with a warning and rebuilt, never loaded, so the file alone cannot make
tgrad run code; a file written under another secret reads as empty. Binaries are bounded by CACHE_MAX_BYTES, least
recently used evicted first. A damaged, unreadable or locked file warns once per process and the run goes on without a
cache. `python -m tgrad.cache [info|clear|export [FILE]]`. `SqliteStore` is that file handling alone; the benchmark
database of execution paths (tgrad/paths/db.py) keeps its own tables in the same file through it.
"""
from __future__ import annotations
import argparse, atexit, errno, hashlib, hmac, json, math, os, re, secrets, sqlite3, stat, sys, threading, time
import warnings, weakref
from typing import Any, Callable, Generic, Optional, TypeVar
from tgrad.helpers import Context, cache_dir

T = TypeVar("T")

SCHEMA_VERSION = 2          # bump when a table's columns or a key's meaning change; the old tables are then ignored
                            # (2: every row authenticated by an HMAC, binaries carry last_used for LRU eviction)
BUSY_TIMEOUT_SECONDS = 5.0  # how long one process waits for another's write before sqlite gives up ...
LOCKED_ATTEMPTS = 4         # ... and how many such waits one operation makes before the store turns itself off
KEY_SEPARATOR = "\0"        # between source and target key, so ("ab", "c") and ("a", "bc") hash differently

BINARIES, OPTS, TIMINGS = f"binaries_v{SCHEMA_VERSION}", f"opts_v{SCHEMA_VERSION}", f"timings_v{SCHEMA_VERSION}"
BINARY_BYTES = f"binary_bytes_v{SCHEMA_VERSION}"   # one row: the total length of every binary, kept by triggers
TABLE_COLUMNS = {
  BINARIES: "key TEXT PRIMARY KEY, size INTEGER NOT NULL, binary BLOB NOT NULL, created REAL NOT NULL, "
            "last_used REAL NOT NULL, mac BLOB NOT NULL",
  OPTS: "key TEXT PRIMARY KEY, key_fields TEXT NOT NULL, opts TEXT NOT NULL, created REAL NOT NULL, mac BLOB NOT NULL",
  TIMINGS: "id INTEGER PRIMARY KEY AUTOINCREMENT, kernel_key TEXT NOT NULL, opts TEXT NOT NULL, device TEXT NOT NULL, "
           "arch TEXT NOT NULL, times TEXT NOT NULL, created REAL NOT NULL, mac BLOB NOT NULL",
}
CACHE_TABLE_NAME = re.compile(r"^(binaries|binary_bytes|opts|timings)_v\d+$")  # tables of this or any schema version

# Bounds of the tables that grow with every compile or search. Binaries by CACHE_MAX_BYTES (a setting, default 1 GiB:
# a day of BEAM searching wrote 22,556 binaries, ~1.3 GiB); once over it, the least recently used go until the total
# is at most EVICT_TO_FRACTION of it, so a full cache evicts in batches rather than on every put. Opts rows (~1 KB)
# and timing rows (~200 bytes) are kept by count, the oldest written go first.
EVICT_TO_FRACTION = 0.9
OPTS_MAX_ROWS = 100_000
TIMINGS_MAX_ROWS = 200_000
# A hit is recorded (last_used) once per binary per process, in batches of this many, or with the next put, or at
# exit: a hit itself never waits for a write.
TOUCH_BATCH = 64

# The secret every row's HMAC is keyed with: 32 random bytes in a file of the user's own (mode 0600), outside the cache
# file so that a cache copied or planted by someone else fails every check.
SECRET_BYTES = 32
SECRET_FILE_MODE = 0o600
SECRET_WAIT_SECONDS = 10.0   # where the secret is written in place: how long a reader waits for its writer to finish
SECRET_POLL_SECONDS = 0.01
SECRET_CHECKS = "secret_checks"   # table: per data table, the HMAC of a fixed text under the secret that wrote it
SECRET_CHECK_TEXT = b"tgrad cache secret check"

class CacheWarning(RuntimeWarning):
  """The cache file (or some of its rows) could not be used; the run goes on without them."""

class CacheSecretError(OSError):
  """The secret that authenticates the cache can't be read or created safely; the cache is turned off."""

_warned = False          # one warning per process, however many cache files fail
_warned_foreign = False  # one warning per process for files written under another secret
_inherited_connections: list[sqlite3.Connection] = []  # see SqliteStore._connection
_secrets: dict[str, bytes] = {}   # secret file path → its bytes, read once per process

def cache_path() -> str:
  """The cache file for this moment: $TGRAD_CACHE if set, else ~/.cache/tgrad/cache.db."""
  path = os.environ.get("TGRAD_CACHE") or os.path.join(cache_dir(), "tgrad", "cache.db")
  return os.path.abspath(os.path.expanduser(path))

def secret_path() -> str:
  """The secret file for this moment: $TGRAD_CACHE_SECRET if set, else $XDG_CONFIG_HOME (~/.config)/tgrad/cache-secret.
  It does not follow TGRAD_CACHE: a cache file from elsewhere is checked against this user's secret."""
  path = os.environ.get("TGRAD_CACHE_SECRET") or \
    os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "tgrad", "cache-secret")
  return os.path.abspath(os.path.expanduser(path))

def cache_secret(path: Optional[str] = None) -> bytes:
  """The per-user secret, created on first use: SECRET_BYTES random bytes in a file of mode 0600, published whole by a
  hard link (so concurrent first users agree on one, see _publish_new_secret). A file of another owner, readable by
  others or of the wrong size raises CacheSecretError."""
  path = path or secret_path()
  if (known := _secrets.get(path)) is not None: return known
  os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
  if not os.path.lexists(path) and not _publish_new_secret(path): _create_secret_in_place(path)
  _secrets[path] = secret = _read_secret(path)
  return secret

def _publish_new_secret(path: str) -> bool:
  """Write a new secret to a private temporary file, sync it, and hard-link it to `path`: readers see either no file or
  the whole secret (a slow disk can't show them a short one), and of concurrent first users the first link wins
  (the others read that one). False where the file system has no hard links."""
  temporary = f"{path}.{os.getpid()}.{secrets.token_hex(8)}.new"
  fd = os.open(temporary, _NEW_FILE_FLAGS, SECRET_FILE_MODE)
  try:
    _fill_with_secret(fd)
    os.link(temporary, path)
  except FileExistsError: pass   # another process (or an earlier run) made it: read theirs
  except OSError as error:
    if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK): raise
    return False
  finally:
    try: os.unlink(temporary)
    except FileNotFoundError: pass
  return True

def _create_secret_in_place(path: str) -> None:
  """Where hard links are missing: create `path` with O_EXCL and write it; a concurrent reader may see it short and
  waits for it (see _read_secret)."""
  try: fd = os.open(path, _NEW_FILE_FLAGS, SECRET_FILE_MODE)
  except FileExistsError: return   # another process (or an earlier run) made it: read theirs
  _fill_with_secret(fd)

_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)   # a new file, not a link

def _fill_with_secret(fd: int) -> None:
  """Write SECRET_BYTES random bytes to the new file `fd`, sync them and close it."""
  try:
    os.write(fd, secrets.token_bytes(SECRET_BYTES))
    os.fsync(fd)
  finally: os.close(fd)

def _read_secret(path: str) -> bytes:
  deadline = time.monotonic() + SECRET_WAIT_SECONDS
  while True:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
      info = os.fstat(fd)
      if info.st_uid != os.getuid():
        raise CacheSecretError(f"cache secret {path} belongs to uid {info.st_uid}, not to this user ({os.getuid()})")
      if info.st_mode & 0o077:
        raise CacheSecretError(f"cache secret {path} has mode {stat.filemode(info.st_mode)}: others may read it; "
                               f"`chmod 600 {path}` or delete it (the cache is then rebuilt)")
      secret = os.read(fd, SECRET_BYTES + 1)
    finally: os.close(fd)
    if len(secret) == SECRET_BYTES: return secret
    if len(secret) > SECRET_BYTES or time.monotonic() > deadline:   # a short file: its writer may still be writing
      raise CacheSecretError(f"cache secret {path} holds {len(secret)} bytes, not {SECRET_BYTES}; delete it (the "
                             "cache is then rebuilt)")
    time.sleep(SECRET_POLL_SECONDS)

def row_mac(secret: bytes, table: str, *values: Any) -> bytes:
  """HMAC-SHA256 of a table name and a row's values (str, bytes, numbers, None), each framed by its kind and length so
  that no two rows read alike. NaN and None read alike: sqlite stores NaN as NULL."""
  mac = hmac.new(secret, table.encode(), hashlib.sha256)
  for value in values:
    if isinstance(value, (bytes, bytearray, memoryview)): kind, data = b"b", bytes(value)
    elif isinstance(value, str): kind, data = b"s", value.encode()
    elif value is None or (isinstance(value, float) and math.isnan(value)): kind, data = b"n", b""
    elif isinstance(value, (int, float)) and not isinstance(value, bool): kind, data = b"f", repr(float(value)).encode()
    else: raise TypeError(f"row_mac takes str, bytes, numbers or None, got {type(value).__name__}")
    mac.update(kind + len(data).to_bytes(8, "little") + data)
  return mac.digest()

def binary_key(src: str, target_key: str) -> str: return _sha256(src + KEY_SEPARATOR + target_key)

def opts_key(key: dict) -> str:
  """Hash of a dict of strings (ast key, device, arch, renderer flags, ...), independent of insertion order."""
  if not isinstance(key, dict): raise TypeError(f"opts key must be a dict of strings, got {type(key).__name__}")
  if (bad := [k for k in key if not isinstance(k, str)]): raise TypeError(f"opts key names must be strings, got {bad}")
  return _sha256(_canonical_json(key))

def _sha256(text: str) -> str: return hashlib.sha256(text.encode()).hexdigest()
def _canonical_json(value: Any) -> str: return json.dumps(value, sort_keys=True, separators=(",", ":"))

class SqliteStore:
  """Tables of one sqlite file, opened on first use. Safe across threads, forked children and concurrent processes.
  The first sqlite or OS error warns (once per process) and turns this instance off: from then on `_run` returns its
  `on_failure` value, so reads find nothing and writes are dropped. A subclass names its tables (name → columns) and
  the statements run after them (indexes, triggers); KernelCache here, PathsDB (tgrad/paths/db.py) in the same file.
  Rows are authenticated with `_mac` when written and `_verified` when read (a failing row is `_drop`ped); a table
  whose rows were written under another secret is emptied when the store opens, with one warning per process."""
  TABLES: dict[str, str] = {}
  SCHEMA: tuple[str, ...] = ()
  HELPER_TABLES: tuple[str, ...] = ()   # tables SCHEMA makes that clear() keeps (their rows are kept by triggers)
  TABLE_NAME = re.compile(r"$^")   # names of this store's tables in any schema version (clear drops the others)
  WHAT = "cache"   # what the warning calls this store

  def __init__(self, path: str):
    self.path = path
    self.error: Optional[str] = None  # why this store was turned off, None while it works
    self.dropped = 0   # rows deleted because they failed authentication or could not be used
    self._conn: Optional[sqlite3.Connection] = None
    self._conn_pid = 0
    self._secret = b""
    self._lock = threading.Lock()
    _new_lock_in_forked_child(self)

  def size_bytes(self) -> int:
    return sum(os.path.getsize(p) for p in (self.path, self.path + "-wal") if os.path.exists(p))

  def row_counts(self) -> dict[str, int]:
    """The number of rows of each of this store's tables (zeros once the store is off)."""
    def count_rows(conn: sqlite3.Connection) -> dict[str, int]:
      return {table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] for table in self.TABLES}
    return self._run(count_rows, {table: 0 for table in self.TABLES})

  def clear(self) -> None:
    """Delete every row of this store's tables, drop its tables of other schema versions, and give the space back to
    the file system."""
    def delete_everything(conn: sqlite3.Connection) -> None:
      names = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
      with write_transaction(conn):
        for table in self.TABLES: conn.execute(f"DELETE FROM {table}")
        for table in names:
          if self.TABLE_NAME.match(table) and table not in self.TABLES and table not in self.HELPER_TABLES:
            conn.execute(f"DROP TABLE {table}")
      try:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
      except sqlite3.OperationalError: pass  # another process is reading: the rows are gone, the space is reused later
    self._run(delete_everything, None)

  def close(self) -> None:
    self.flush_touches()
    with self._lock:
      if self._conn is not None and self._conn_pid == os.getpid(): self._conn.close()
      self._conn = None

  def flush_touches(self) -> None: pass   # KernelCache writes the hits it recorded

  # *** authentication ***

  def _mac(self, table: str, *values: Any) -> bytes: return row_mac(self._secret, table, *values)

  def _verified(self, mac: Any, table: str, *values: Any) -> bool:
    return isinstance(mac, bytes) and hmac.compare_digest(mac, self._mac(table, *values))

  def _drop(self, conn: sqlite3.Connection, table: str, where: str, arguments: tuple, what: str, reason: str) -> None:
    """Delete the rows of `table` matching `where` (they failed a check) and warn; the caller rebuilds them."""
    conn.execute(f"DELETE FROM {table} WHERE {where}", arguments)
    self.dropped += 1
    warnings.warn(f"tgrad {self.WHAT} {self.path}: dropped {what} ({reason}); it is rebuilt", CacheWarning,
                  stacklevel=5)

  # *** the one place that touches sqlite ***

  def _run(self, work: Callable[[sqlite3.Connection], T], on_failure: T) -> T:
    """Run `work` on the connection; a failing file turns the store off with one warning and returns `on_failure`.
    A file locked by other processes past the busy timeout (a loaded machine) is tried again, LOCKED_ATTEMPTS times in
    all, before it counts as failing."""
    if self.error is not None: return on_failure
    with self._lock:
      for attempt in range(1, LOCKED_ATTEMPTS + 1):
        try:
          return work(self._connection())
        except sqlite3.OperationalError as error:
          failure: BaseException = error
          if attempt < LOCKED_ATTEMPTS and _is_locked(error): continue
        except (sqlite3.Error, OSError) as error:
          failure = error
        break
      self._turn_off(failure)
      return on_failure

  def _connection(self) -> sqlite3.Connection:
    if self._conn is not None and self._conn_pid == os.getpid(): return self._conn
    # a connection inherited through fork belongs to the parent: closing it here could checkpoint or remove the
    # parent's write-ahead log, so it is kept, unused, for the life of this process
    if self._conn is not None: _inherited_connections.append(self._conn)
    self._conn = None
    self._secret = cache_secret()
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False)
    try:
      conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
      conn.execute("PRAGMA journal_mode = WAL")  # readers never block the writer: several processes share the file
      # commits without an fsync each (the WAL is synced at checkpoints): a writer holds the lock for less time, and a
      # power loss can drop only the last commits of a cache
      conn.execute("PRAGMA synchronous = NORMAL")
      # the schema in one write transaction taken at once: a CREATE ... IF NOT EXISTS alone reads the schema first and
      # then upgrades to a write, which SQLite refuses at once ("database is locked", no busy wait) when another
      # process wrote in between — four processes opening a new file at once hit it
      with write_transaction(conn):
        for table, columns in self.TABLES.items(): conn.execute(f"CREATE TABLE IF NOT EXISTS {table} ({columns})")
        for statement in self.SCHEMA: conn.execute(statement)
        foreign = self._claim_tables(conn)
    except BaseException:
      conn.close()
      raise
    self._conn, self._conn_pid = conn, os.getpid()
    if foreign: _warn_foreign(self, foreign)
    return conn

  def _claim_tables(self, conn: sqlite3.Connection) -> list[str]:
    """Record this secret as the one each table is written under; a table written under another secret (a cache file
    from another user or machine) is emptied. Returns the tables emptied."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {SECRET_CHECKS} (table_name TEXT PRIMARY KEY, mac BLOB NOT NULL)")
    mine, foreign = self._mac(SECRET_CHECKS, SECRET_CHECK_TEXT), []
    for table in self.TABLES:
      row = conn.execute(f"SELECT mac FROM {SECRET_CHECKS} WHERE table_name = ?", (table,)).fetchone()
      if row is not None and isinstance(row[0], bytes) and hmac.compare_digest(row[0], mine): continue
      if row is not None or conn.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is not None:
        conn.execute(f"DELETE FROM {table}")
        foreign.append(table)
      conn.execute(f"INSERT OR REPLACE INTO {SECRET_CHECKS} VALUES (?, ?)", (table, mine))
    return foreign

  def _turn_off(self, error: BaseException) -> None:
    global _warned
    self.error = f"{type(error).__name__}: {error}"
    if self._conn is not None and self._conn_pid == os.getpid():
      try: self._conn.close()
      except sqlite3.Error: pass  # the file is already unusable; nothing more to release
    self._conn = None
    if not _warned:
      _warned = True
      warnings.warn(f"tgrad {self.WHAT} {self.path} is unusable ({self.error}); running without a {self.WHAT}",
                    CacheWarning, stacklevel=4)

def _warn_foreign(store: SqliteStore, tables: list[str]) -> None:
  global _warned_foreign
  if _warned_foreign: return
  _warned_foreign = True
  warnings.warn(f"tgrad {store.WHAT} {store.path} was written under another secret than {secret_path()} (a cache from "
                f"another user or machine?): its rows of {', '.join(tables)} were discarded and are rebuilt",
                CacheWarning, stacklevel=5)

def _is_locked(error: sqlite3.OperationalError) -> bool:
  """Whether sqlite gave up waiting for another process's lock (SQLITE_BUSY / SQLITE_LOCKED), which passes."""
  code = getattr(error, "sqlite_errorcode", None)
  if code is not None: return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
  return "locked" in str(error) or "busy" in str(error)

class write_transaction:
  """`with write_transaction(conn):` one write transaction, taken at once (BEGIN IMMEDIATE) so that concurrent
  writers queue on the busy timeout instead of failing halfway; committed at the end, rolled back if the block
  raises."""
  def __init__(self, conn: sqlite3.Connection): self.conn = conn
  def __enter__(self): self.conn.execute("BEGIN IMMEDIATE")
  def __exit__(self, kind, *exc):
    if kind is None: self.conn.execute("COMMIT")
    elif self.conn.in_transaction: self.conn.execute("ROLLBACK")

_kernel_caches: weakref.WeakSet[KernelCache] = weakref.WeakSet()   # their recorded hits are written at exit

@atexit.register
def _flush_touches_at_exit() -> None:
  for cache in list(_kernel_caches): cache.flush_touches()

class KernelCache(SqliteStore):
  """Compiled binaries, opts chosen by search and measured kernel timings. `stats`, `clear` and `export_json` are
  maintenance calls and ignore CACHELEVEL."""
  TABLES = TABLE_COLUMNS
  TABLE_NAME = CACHE_TABLE_NAME
  HELPER_TABLES = (BINARY_BYTES,)
  SCHEMA = (f"CREATE INDEX IF NOT EXISTS {TIMINGS}_by_kernel ON {TIMINGS} (kernel_key)",
            f"CREATE INDEX IF NOT EXISTS {BINARIES}_by_last_use ON {BINARIES} (last_used)",
            # the total length of the binaries, kept exact by triggers so a put never sums the table
            f"CREATE TABLE IF NOT EXISTS {BINARY_BYTES} (id INTEGER PRIMARY KEY CHECK (id = 0), "
            "total INTEGER NOT NULL)",
            f"INSERT OR IGNORE INTO {BINARY_BYTES} SELECT 0, COALESCE(SUM(length(binary)), 0) FROM {BINARIES}",
            f"CREATE TRIGGER IF NOT EXISTS {BINARIES}_added AFTER INSERT ON {BINARIES} BEGIN "
            f"UPDATE {BINARY_BYTES} SET total = total + length(NEW.binary); END",
            f"CREATE TRIGGER IF NOT EXISTS {BINARIES}_removed AFTER DELETE ON {BINARIES} BEGIN "
            f"UPDATE {BINARY_BYTES} SET total = total - length(OLD.binary); END",
            f"CREATE TRIGGER IF NOT EXISTS {BINARIES}_changed AFTER UPDATE OF binary ON {BINARIES} BEGIN "
            f"UPDATE {BINARY_BYTES} SET total = total - length(OLD.binary) + length(NEW.binary); END")

  def __init__(self, path: str):
    super().__init__(path)
    self.evicted = 0   # binaries this instance evicted to stay within CACHE_MAX_BYTES
    self._touched: set[str] = set()   # binary keys whose use this process recorded (or will, see _pending_touches)
    self._pending_touches: dict[str, float] = {}   # binary key → time of its first use here, not yet written
    _kernel_caches.add(self)

  # *** kernel binaries: key = sha256(source + target key); MAC over (table, key, binary) ***

  def get_binary(self, src: str, target_key: str) -> Optional[bytes]:
    """The cached binary, or None. One that fails authentication is deleted with a CacheWarning (a miss)."""
    if not Context.CACHELEVEL: return None
    key = binary_key(src, target_key)
    def read(conn: sqlite3.Connection) -> Optional[bytes]:
      row = conn.execute(f"SELECT binary, mac FROM {BINARIES} WHERE key = ?", (key,)).fetchone()
      if row is None: return None
      binary = bytes(row[0]) if isinstance(row[0], bytes) else None
      if binary is None or not self._verified(row[1], BINARIES, key, binary):
        self._drop(conn, BINARIES, "key = ?", (key,), f"binary {key[:16]}", "failed authentication")
        return None
      return binary
    binary = self._run(read, None)
    if binary is not None and key not in self._touched: self._touch(key)
    return binary

  def drop_binary(self, src: str, target_key: str, reason: str) -> None:
    """Delete a cached binary that authenticated but can't be used (its loader rejected it), with a CacheWarning."""
    key = binary_key(src, target_key)
    self._run(lambda c: self._drop(c, BINARIES, "key = ?", (key,), f"binary {key[:16]}", reason), None)

  def put_binary(self, src: str, target_key: str, binary: bytes) -> None:
    """Store a binary; if the binaries then pass CACHE_MAX_BYTES, evict the least recently used (see _evict)."""
    if not isinstance(binary, (bytes, bytearray, memoryview)):
      raise TypeError(f"binary must be bytes, got {type(binary).__name__}")
    if not Context.CACHELEVEL: return
    key, binary, now = binary_key(src, target_key), bytes(binary), time.time()
    def write(conn: sqlite3.Connection) -> None:
      with write_transaction(conn):
        self._write_touches(conn)
        conn.execute(f"INSERT INTO {BINARIES} VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                     "size = excluded.size, binary = excluded.binary, created = excluded.created, "
                     "last_used = excluded.last_used, mac = excluded.mac",
                     (key, len(binary), binary, now, now, self._mac(BINARIES, key, binary)))
        self._evict(conn, Context.CACHE_MAX_BYTES, keep=key)
    self._run(write, None)

  def binary_bytes(self) -> int:
    """The total length of the cached binaries (what CACHE_MAX_BYTES bounds)."""
    return self._run(lambda c: c.execute(f"SELECT total FROM {BINARY_BYTES}").fetchone()[0], 0)

  def _evict(self, conn: sqlite3.Connection, max_bytes: int, keep: str) -> None:
    """Past `max_bytes`, delete the least recently used binaries (never `keep`, the one just written) until the total
    is at most EVICT_TO_FRACTION of it."""
    total = conn.execute(f"SELECT total FROM {BINARY_BYTES}").fetchone()[0]
    if total <= max_bytes: return
    target, victims = int(max_bytes * EVICT_TO_FRACTION), []
    for key, size in conn.execute(f"SELECT key, length(binary) FROM {BINARIES} WHERE key != ? ORDER BY last_used",
                                  (keep,)):
      if total <= target: break
      victims.append((key,))
      total -= size
    conn.executemany(f"DELETE FROM {BINARIES} WHERE key = ?", victims)
    self.evicted += len(victims)

  def _touch(self, key: str) -> None:
    """Record a hit: once per binary per process, written in batches (a hit never waits for a write)."""
    self._touched.add(key)
    self._pending_touches[key] = time.time()
    if len(self._pending_touches) >= TOUCH_BATCH: self.flush_touches()

  def flush_touches(self) -> None:
    """Write the recorded hits' last_used now (every TOUCH_BATCH hits, on close and at exit); a store that is not open
    in this process writes nothing (hits of a closed store or a parent's are lost, which only ages those binaries)."""
    if not self._pending_touches or self._conn is None or self._conn_pid != os.getpid(): return
    def write(conn: sqlite3.Connection) -> None:
      with write_transaction(conn): self._write_touches(conn)
    self._run(write, None)

  def _write_touches(self, conn: sqlite3.Connection) -> None:
    touches, self._pending_touches = self._pending_touches, {}
    conn.executemany(f"UPDATE {BINARIES} SET last_used = MAX(last_used, ?) WHERE key = ?",
                     [(used, key) for key, used in touches.items()])

  # *** opts chosen by search: key = sha256 of the canonical JSON of a dict of strings (search.search_cache_key: the
  # AST, device, processor, compiler, renderer, settings, action space, beam width and codegen.CODEGEN_VERSION);
  # MAC over (table, key, opts JSON) ***

  def get_opts(self, key: dict) -> Optional[list]:
    """The cached opts as a JSON list, or None. A row that fails authentication or is not a JSON list is deleted with a
    CacheWarning (a miss); the caller checks the entries (drop_opts if they are not opts)."""
    if not Context.CACHELEVEL: return None
    hashed = opts_key(key)
    def read(conn: sqlite3.Connection) -> Optional[list]:
      row = conn.execute(f"SELECT opts, mac FROM {OPTS} WHERE key = ?", (hashed,)).fetchone()
      if row is None: return None
      if not isinstance(row[0], str) or not self._verified(row[1], OPTS, hashed, row[0]):
        self._drop(conn, OPTS, "key = ?", (hashed,), f"opts {hashed[:16]}", "failed authentication")
        return None
      try: opts = json.loads(row[0])
      except ValueError as error: opts = error
      if not isinstance(opts, list):
        self._drop(conn, OPTS, "key = ?", (hashed,), f"opts {hashed[:16]}", f"not a JSON list: {opts!r:.80}")
        return None
      return opts
    return self._run(read, None)

  def drop_opts(self, key: dict, reason: str) -> None:
    """Delete cached opts that authenticated but can't be used, with a CacheWarning."""
    hashed = opts_key(key)
    self._run(lambda c: self._drop(c, OPTS, "key = ?", (hashed,), f"opts {hashed[:16]}", reason), None)

  def put_opts(self, key: dict, opts: list) -> None:
    if not isinstance(opts, (list, tuple)): raise TypeError(f"opts must be a list, got {type(opts).__name__}")
    hashed, text = opts_key(key), json.dumps(list(opts))
    if not Context.CACHELEVEL: return
    row = (hashed, _canonical_json(key), text, time.time())
    def write(conn: sqlite3.Connection) -> None:
      with write_transaction(conn):
        conn.execute(f"INSERT OR REPLACE INTO {OPTS} VALUES (?, ?, ?, ?, ?)", (*row, self._mac(OPTS, hashed, text)))
        conn.execute(f"DELETE FROM {OPTS} WHERE rowid <= (SELECT MAX(rowid) FROM {OPTS}) - ?", (OPTS_MAX_ROWS,))
    self._run(write, None)

  # *** measured timings: append-only rows, MAC over (table, every column but id and created) ***

  def add_timing(self, kernel_key: str, opts: list, device: str, arch: str, times: list[float]) -> None:
    row = (kernel_key, json.dumps(list(opts)), device, arch, json.dumps([float(t) for t in times]))
    if not Context.CACHELEVEL: return
    def write(conn: sqlite3.Connection) -> None:
      with write_transaction(conn):
        conn.execute(f"INSERT INTO {TIMINGS} (kernel_key, opts, device, arch, times, created, mac) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?)", (*row, time.time(), self._mac(TIMINGS, *row)))
        conn.execute(f"DELETE FROM {TIMINGS} WHERE id <= (SELECT MAX(id) FROM {TIMINGS}) - ?", (TIMINGS_MAX_ROWS,))
    self._run(write, None)

  def get_timings(self, kernel_key: str) -> list[dict]:
    """Timings recorded for `kernel_key`, oldest first: dicts of kernel_key, opts, device, arch, times, timestamp.
    Rows that fail authentication or don't parse are deleted with a CacheWarning."""
    if not Context.CACHELEVEL: return []
    def read(conn: sqlite3.Connection) -> list[dict]:
      good = []
      for row_id, *row, created, mac in conn.execute(f"SELECT id, kernel_key, opts, device, arch, times, created, mac "
                                                     f"FROM {TIMINGS} WHERE kernel_key = ? ORDER BY id",
                                                     (kernel_key,)).fetchall():
        try:
          if not self._verified(mac, TIMINGS, *row): raise ValueError("failed authentication")
          good.append(_timing_row((*row, created)))
        except (TypeError, ValueError) as error:
          self._drop(conn, TIMINGS, "id = ?", (row_id,), f"timing row {row_id}", str(error))
      return good
    return self._run(read, [])

  # *** maintenance ***

  def stats(self) -> dict:
    """The path, the size of the file and its write-ahead log in bytes, the row count of each table and the total
    length of the binaries against its bound."""
    return {"path": self.path, "schema_version": SCHEMA_VERSION, "size_bytes": self.size_bytes(),
            "rows": self.row_counts(), "binary_bytes": self.binary_bytes(), "max_binary_bytes": Context.CACHE_MAX_BYTES,
            "secret": secret_path(), "error": self.error}

  def export_json(self) -> dict:
    """Every row as JSON-ready values; binaries appear as their size, not their bytes. Rows are shown as stored,
    unauthenticated: text that isn't JSON appears as the text."""
    def read_everything(conn: sqlite3.Connection) -> dict:
      binaries = [{"key": key, "size": size, "timestamp": created, "last_used": last_used}
                  for key, size, created, last_used in
                  conn.execute(f"SELECT key, length(binary), created, last_used FROM {BINARIES} ORDER BY created")]
      opts = [{"key": key, "key_fields": _json_or_text(fields), "opts": _json_or_text(chosen), "timestamp": created}
              for key, fields, chosen, created in conn.execute(f"SELECT key, key_fields, opts, created FROM {OPTS} "
                                                               "ORDER BY created")]
      timings = [{"kernel_key": kernel_key, "opts": _json_or_text(opts), "device": device, "arch": arch,
                  "times": _json_or_text(times), "timestamp": created}
                 for kernel_key, opts, device, arch, times, created in
                 conn.execute(f"SELECT kernel_key, opts, device, arch, times, created FROM {TIMINGS} ORDER BY id")]
      return {"binaries": binaries, "opts": opts, "timings": timings}
    tables = self._run(read_everything, {"binaries": [], "opts": [], "timings": []})
    return {"path": self.path, "schema_version": SCHEMA_VERSION, "error": self.error, **tables}

def _json_or_text(text: Any) -> Any:
  try: return json.loads(text)
  except (TypeError, ValueError): return text

def _timing_row(row: tuple) -> dict:
  """A timing row as a dict; TypeError or ValueError when its JSON is not a list of opts and a list of numbers."""
  kernel_key, opts, device, arch, times, created = row
  opts, times = json.loads(opts), json.loads(times)
  if not isinstance(opts, list) or not isinstance(times, list) or \
     not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in times):
    raise TypeError(f"timing row holds opts {opts!r:.60} and times {times!r:.60}, not two lists")
  return {"kernel_key": kernel_key, "opts": opts, "device": device, "arch": arch, "times": times,
          "timestamp": created}

def _new_lock_in_forked_child(owner: Any) -> None:
  """A forked child gets a fresh `owner._lock`: one that another thread of the parent held at the fork would stay held
  in the child for ever (the thread that would release it does not exist there)."""
  ref = weakref.ref(owner)
  def renew() -> None:
    if (alive := ref()) is not None: alive._lock = threading.Lock()
  os.register_at_fork(after_in_child=renew)

S = TypeVar("S", bound=SqliteStore)

class ProcessWide(Generic[S]):
  """One store of a kind per process, for the current TGRAD_CACHE path: `.get()` returns it, and a changed path
  closes it and opens a fresh one (the kernel cache and the benchmark database each keep one)."""
  def __init__(self, make: Callable[[str], S]):
    self._make, self._instance, self._lock = make, None, threading.Lock()
    _new_lock_in_forked_child(self)
  def get(self) -> S:
    path = cache_path()
    with self._lock:
      if self._instance is None or self._instance.path != path:
        if self._instance is not None: self._instance.close()
        self._instance = self._make(path)
      return self._instance

_cache = ProcessWide(KernelCache)

def get_cache() -> KernelCache:
  """The process-wide cache for the current TGRAD_CACHE path; a changed path gets a fresh instance."""
  return _cache.get()

# *** command line: python -m tgrad.cache [info|clear|export [FILE]] ***

def _print_info(cache: KernelCache) -> None:
  stats = cache.stats()
  print(f"path            {stats['path']}")
  print(f"size            {stats['size_bytes']} bytes")
  print(f"schema version  {stats['schema_version']}")
  for table, count in stats["rows"].items(): print(f"{table:<15} {count} rows")
  print(f"binaries        {stats['binary_bytes']} of at most {stats['max_binary_bytes']} bytes (CACHE_MAX_BYTES)")
  print(f"secret          {stats['secret']}")
  if stats["error"]: print(f"error           {stats['error']}")

def main(argv: Optional[list[str]] = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m tgrad.cache", description="Inspect or clear tgrad's kernel cache.")
  commands = parser.add_subparsers(dest="command")
  commands.add_parser("info", help="path, size and row counts (the default)")
  commands.add_parser("clear", help="delete every row")
  export = commands.add_parser("export", help="every row as JSON; binaries as their size")
  export.add_argument("file", nargs="?", help="write here instead of stdout")
  args = parser.parse_args(argv)
  cache = get_cache()
  if args.command in (None, "info"): _print_info(cache)
  elif args.command == "clear":
    cache.clear()
    _print_info(cache)
  elif args.command == "export":
    text = json.dumps(cache.export_json(), indent=1)
    if args.file is None: print(text)
    else:
      with open(args.file, "w") as out: out.write(text + "\n")
  return 1 if cache.error else 0

if __name__ == "__main__":
  sys.exit(main())
