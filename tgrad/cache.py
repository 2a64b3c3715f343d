"""The persistent cache: compiled binaries, opts chosen by search, and every measured timing, in one sqlite file.

Input: plain keys (source text and a target key, or a dict of strings); output: bytes or JSON values, None on a miss.
The file is ~/.cache/tgrad/cache.db (TGRAD_CACHE overrides); CACHELEVEL=0 makes gets miss and puts do nothing.
Values are JSON text or raw bytes, never pickle, so a cache file cannot run code. A damaged, unreadable or locked
file warns once per process and the run goes on without a cache. `python -m tgrad.cache [info|clear|export [FILE]]`.
`SqliteStore` is that file handling alone; the benchmark database of execution paths (tgrad/paths/db.py) keeps its
own tables in the same file through it.
"""
from __future__ import annotations
import argparse, hashlib, json, os, re, sqlite3, sys, threading, time, warnings
from typing import Any, Callable, Generic, Optional, TypeVar
from tgrad.helpers import Context, cache_dir

T = TypeVar("T")

SCHEMA_VERSION = 1          # bump when a table's columns or a key's meaning change; the old tables are then ignored
BUSY_TIMEOUT_SECONDS = 5.0  # how long one process waits for another's write before this cache gives up
KEY_SEPARATOR = "\0"        # between source and target key, so ("ab", "c") and ("a", "bc") hash differently

BINARIES, OPTS, TIMINGS = f"binaries_v{SCHEMA_VERSION}", f"opts_v{SCHEMA_VERSION}", f"timings_v{SCHEMA_VERSION}"
TABLE_COLUMNS = {
  BINARIES: "key TEXT PRIMARY KEY, size INTEGER NOT NULL, binary BLOB NOT NULL, created REAL NOT NULL",
  OPTS: "key TEXT PRIMARY KEY, key_fields TEXT NOT NULL, opts TEXT NOT NULL, created REAL NOT NULL",
  TIMINGS: "id INTEGER PRIMARY KEY AUTOINCREMENT, kernel_key TEXT NOT NULL, opts TEXT NOT NULL, device TEXT NOT NULL, "
           "arch TEXT NOT NULL, times TEXT NOT NULL, created REAL NOT NULL",
}
CACHE_TABLE_NAME = re.compile(r"^(binaries|opts|timings)_v\d+$")  # tables of this or any other schema version

class CacheWarning(RuntimeWarning):
  """The cache file could not be used; the run goes on without a cache."""

_warned = False  # one warning per process, however many cache files fail
_inherited_connections: list[sqlite3.Connection] = []  # see KernelCache._connection

def cache_path() -> str:
  """The cache file for this moment: $TGRAD_CACHE if set, else ~/.cache/tgrad/cache.db."""
  path = os.environ.get("TGRAD_CACHE") or os.path.join(cache_dir(), "tgrad", "cache.db")
  return os.path.abspath(os.path.expanduser(path))

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
  the statements that index them; KernelCache here, PathsDB (tgrad/paths/db.py) in the same file."""
  TABLES: dict[str, str] = {}
  INDEXES: tuple[str, ...] = ()
  TABLE_NAME = re.compile(r"$^")   # names of this store's tables in any schema version (clear drops the others)
  WHAT = "cache"   # what the warning calls this store

  def __init__(self, path: str):
    self.path = path
    self.error: Optional[str] = None  # why this store was turned off, None while it works
    self._conn: Optional[sqlite3.Connection] = None
    self._conn_pid = 0
    self._lock = threading.Lock()

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
          if self.TABLE_NAME.match(table) and table not in self.TABLES: conn.execute(f"DROP TABLE {table}")
      try:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
      except sqlite3.OperationalError: pass  # another process is reading: the rows are gone, the space is reused later
    self._run(delete_everything, None)

  def close(self) -> None:
    with self._lock:
      if self._conn is not None and self._conn_pid == os.getpid(): self._conn.close()
      self._conn = None

  # *** the one place that touches sqlite ***

  def _run(self, work: Callable[[sqlite3.Connection], T], on_failure: T) -> T:
    """Run `work` on the connection; a failing file turns the store off with one warning and returns `on_failure`."""
    if self.error is not None: return on_failure
    with self._lock:
      try:
        return work(self._connection())
      except (sqlite3.Error, OSError) as error:
        self._turn_off(error)
        return on_failure

  def _connection(self) -> sqlite3.Connection:
    if self._conn is not None and self._conn_pid == os.getpid(): return self._conn
    # a connection inherited through fork belongs to the parent: closing it here could checkpoint or remove the
    # parent's write-ahead log, so it is kept, unused, for the life of this process
    if self._conn is not None: _inherited_connections.append(self._conn)
    self._conn = None
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
        for statement in self.INDEXES: conn.execute(statement)
    except BaseException:
      conn.close()
      raise
    self._conn, self._conn_pid = conn, os.getpid()
    return conn

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

class write_transaction:
  """`with write_transaction(conn):` one write transaction, taken at once (BEGIN IMMEDIATE) so that concurrent
  writers queue on the busy timeout instead of failing halfway; committed at the end, rolled back if the block
  raises."""
  def __init__(self, conn: sqlite3.Connection): self.conn = conn
  def __enter__(self): self.conn.execute("BEGIN IMMEDIATE")
  def __exit__(self, kind, *exc):
    if kind is None: self.conn.execute("COMMIT")
    elif self.conn.in_transaction: self.conn.execute("ROLLBACK")

class KernelCache(SqliteStore):
  """Compiled binaries, opts chosen by search and measured kernel timings. `stats`, `clear` and `export_json` are
  maintenance calls and ignore CACHELEVEL."""
  TABLES = TABLE_COLUMNS
  TABLE_NAME = CACHE_TABLE_NAME
  INDEXES = (f"CREATE INDEX IF NOT EXISTS {TIMINGS}_by_kernel ON {TIMINGS} (kernel_key)",)

  # *** kernel binaries: key = sha256(source + target key) ***

  def get_binary(self, src: str, target_key: str) -> Optional[bytes]:
    if not Context.CACHELEVEL: return None
    rows = self._run(lambda c: c.execute(f"SELECT binary FROM {BINARIES} WHERE key = ?",
                                         (binary_key(src, target_key),)).fetchall(), [])
    return bytes(rows[0][0]) if rows else None

  def put_binary(self, src: str, target_key: str, binary: bytes) -> None:
    if not isinstance(binary, (bytes, bytearray, memoryview)):
      raise TypeError(f"binary must be bytes, got {type(binary).__name__}")
    if not Context.CACHELEVEL: return
    row = (binary_key(src, target_key), len(binary), bytes(binary), time.time())
    self._run(lambda c: c.execute(f"INSERT OR REPLACE INTO {BINARIES} VALUES (?, ?, ?, ?)", row), None)

  # *** opts chosen by search: key = sha256 of the canonical JSON of a dict of strings (search.search_cache_key: the
  # AST, device, processor, compiler, renderer, settings, action space, beam width and codegen.CODEGEN_VERSION) ***

  def get_opts(self, key: dict) -> Optional[list]:
    if not Context.CACHELEVEL: return None
    hashed = opts_key(key)
    rows = self._run(lambda c: c.execute(f"SELECT opts FROM {OPTS} WHERE key = ?", (hashed,)).fetchall(), [])
    return json.loads(rows[0][0]) if rows else None

  def put_opts(self, key: dict, opts: list) -> None:
    if not isinstance(opts, (list, tuple)): raise TypeError(f"opts must be a list, got {type(opts).__name__}")
    row = (opts_key(key), _canonical_json(key), json.dumps(list(opts)), time.time())
    if not Context.CACHELEVEL: return
    self._run(lambda c: c.execute(f"INSERT OR REPLACE INTO {OPTS} VALUES (?, ?, ?, ?)", row), None)

  # *** measured timings: append-only rows ***

  def add_timing(self, kernel_key: str, opts: list, device: str, arch: str, times: list[float]) -> None:
    row = (kernel_key, json.dumps(list(opts)), device, arch, json.dumps([float(t) for t in times]), time.time())
    if not Context.CACHELEVEL: return
    self._run(lambda c: c.execute(f"INSERT INTO {TIMINGS} (kernel_key, opts, device, arch, times, created) "
                                  "VALUES (?, ?, ?, ?, ?, ?)", row), None)

  def get_timings(self, kernel_key: str) -> list[dict]:
    """Timings recorded for `kernel_key`, oldest first: dicts of kernel_key, opts, device, arch, times, timestamp."""
    if not Context.CACHELEVEL: return []
    rows = self._run(lambda c: c.execute(f"SELECT kernel_key, opts, device, arch, times, created FROM {TIMINGS} "
                                         "WHERE kernel_key = ? ORDER BY id", (kernel_key,)).fetchall(), [])
    return [_timing_row(row) for row in rows]

  # *** maintenance ***

  def stats(self) -> dict:
    """The path, the size of the file and its write-ahead log in bytes, and the row count of each table."""
    return {"path": self.path, "schema_version": SCHEMA_VERSION, "size_bytes": self.size_bytes(),
            "rows": self.row_counts(), "error": self.error}

  def export_json(self) -> dict:
    """Every row as JSON-ready values; binaries appear as their size, not their bytes."""
    def read_everything(conn: sqlite3.Connection) -> dict:
      binaries = [{"key": key, "size": size, "timestamp": created}
                  for key, size, created in conn.execute(f"SELECT key, size, created FROM {BINARIES} ORDER BY created")]
      opts = [{"key": key, "key_fields": json.loads(fields), "opts": json.loads(chosen), "timestamp": created}
              for key, fields, chosen, created in conn.execute(f"SELECT * FROM {OPTS} ORDER BY created")]
      timings = [_timing_row(row) for row in conn.execute(f"SELECT kernel_key, opts, device, arch, times, created "
                                                          f"FROM {TIMINGS} ORDER BY id")]
      return {"binaries": binaries, "opts": opts, "timings": timings}
    tables = self._run(read_everything, {"binaries": [], "opts": [], "timings": []})
    return {"path": self.path, "schema_version": SCHEMA_VERSION, "error": self.error, **tables}

def _timing_row(row: tuple) -> dict:
  kernel_key, opts, device, arch, times, created = row
  return {"kernel_key": kernel_key, "opts": json.loads(opts), "device": device, "arch": arch,
          "times": json.loads(times), "timestamp": created}

S = TypeVar("S", bound=SqliteStore)

class ProcessWide(Generic[S]):
  """One store of a kind per process, for the current TGRAD_CACHE path: `.get()` returns it, and a changed path
  closes it and opens a fresh one (the kernel cache and the benchmark database each keep one)."""
  def __init__(self, make: Callable[[str], S]):
    self._make, self._instance, self._lock = make, None, threading.Lock()
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
