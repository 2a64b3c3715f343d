"""The benchmark database of execution paths, and the selection of the fastest path within a tolerance.

Input: `Measurement`s, one run of one path of one graph each (every timing; the worst relative and absolute error
against a float64 reference; the hardware fingerprint, tgrad's version and the code-changing settings it ran under).
Output: the runs of a graph, their `PathSummary`s, and a `Selection`: the fastest verified path whose error is within
the tolerance, with the reason every other path lost. The rows live in versioned tables of the kernel cache's sqlite
file (tgrad/cache.py): JSON text and numbers, never pickle, each row authenticated by the cache's HMAC (a row that
fails it is deleted with a warning, so the file alone can't choose which code runs); a damaged or locked file warns
once and the run goes on with no records. Schema, selection rule, default tolerances and sanity bounds: docs/paths.md.
"""
from __future__ import annotations
import json, math, re, sqlite3, statistics, time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union
from tgrad.cache import ProcessWide, SqliteStore, cache_path, write_transaction
from tgrad.dtype import DType, dtypes
from tgrad.helpers import Context
from tgrad.paths.fingerprint import describe_difference, fingerprint_key

DB_SCHEMA_VERSION = 2   # bump when a column or the meaning of a value changes; tables of other versions are ignored
                        # (2: every row carries an HMAC, see SqliteStore)
GRAPHS, HARDWARE, RUNS = (f"paths_graphs_v{DB_SCHEMA_VERSION}", f"paths_hardware_v{DB_SCHEMA_VERSION}",
                          f"paths_runs_v{DB_SCHEMA_VERSION}")
TABLE_COLUMNS = {
  GRAPHS: "graph_key TEXT PRIMARY KEY, graph_desc TEXT NOT NULL, created REAL NOT NULL, mac BLOB NOT NULL",
  HARDWARE: "fingerprint_key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, mac BLOB NOT NULL",
  RUNS: "id INTEGER PRIMARY KEY AUTOINCREMENT, graph_key TEXT NOT NULL, path_id TEXT NOT NULL, "
        "path_desc TEXT NOT NULL, device TEXT NOT NULL, parts TEXT NOT NULL, fingerprint_key TEXT NOT NULL, "
        "tgrad_version TEXT NOT NULL, "
        "settings TEXT NOT NULL, times TEXT NOT NULL, max_rel_error REAL, max_abs_error REAL, "
        "input_distribution TEXT NOT NULL, status TEXT NOT NULL, error TEXT NOT NULL, measured_at REAL NOT NULL, "
        "choices TEXT NOT NULL, opts TEXT NOT NULL, mac BLOB NOT NULL",
}
PATHS_TABLE_NAME = re.compile(r"^paths_(graphs|hardware|runs)_v\d+$")   # tables of this or any other schema version
RUN_COLUMNS = ("id", "graph_key", "path_id", "path_desc", "device", "parts", "fingerprint_key", "tgrad_version",
               "settings", "times", "max_rel_error", "max_abs_error", "input_distribution", "status", "error",
               "measured_at", "choices", "opts")
# A negative answer of has_records is asked again after this long: another process (a profiler) may be adding rows.
# A positive answer is kept until clear(): rows are only ever added.
HAS_RECORDS_RECHECK_SECONDS = 1.0
STATUSES = ("ok", "failed")

def _canonical_json(value: Any) -> str: return json.dumps(value, sort_keys=True, separators=(",", ":"))

# ---- one run of one path

@dataclass(frozen=True, kw_only=True)
class Measurement:
  """One run of one execution path of one graph. The dicts are JSON values: they are stored as JSON and come back
  as JSON (tuples as lists, dict keys as strings), so a Measurement is made in that form and survives the round
  trip equal. `parts` defaults to (device,). `measured_at` 0 means 'now' when the run is added."""
  graph_key: str            # canonical graph key (sha256 hex, the same in every process)
  graph_desc: dict          # shapes, dtypes and composite names of the graph
  path_id: str              # stable id of the path
  path_desc: str            # readable description of the path
  device: str               # device of the whole path ("CUDA", "LLVM")
  parts: tuple[str, ...] = ()   # the device of each part of a cross-device path
  fingerprint: dict         # tgrad.paths.fingerprint.hardware_fingerprint(device)
  tgrad_version: str        # tgrad.paths.fingerprint.tgrad_version()
  settings: dict            # tgrad.helpers.code_settings(): the settings that change generated code
  times: tuple[float, ...]  # every timing of the run, seconds
  max_rel_error: float      # worst relative error of any output element against the float64 reference
  max_abs_error: float
  input_distribution: str   # e.g. "normal(0,1) seed 0"
  status: str               # "ok", or "failed": beyond the dtype's sanity bound or crashed (see `error`)
  error: str = ""
  measured_at: float = 0.0  # unix time
  choices: tuple[str, ...] = ()   # the path itself: the lowering of each composite region, in the graph's region order
  opts: str = "heuristic"         # the path's kernel opts: "heuristic" or "beam2"

  def __post_init__(self):
    for name in ("graph_key", "path_id", "device"):
      if not isinstance(getattr(self, name), str) or not getattr(self, name):
        raise ValueError(f"Measurement.{name} must be a non-empty string, got {getattr(self, name)!r}")
    if self.status not in STATUSES:
      raise ValueError(f"Measurement.status must be one of {STATUSES}, got {self.status!r}")
    for name in ("graph_desc", "fingerprint", "settings"):
      value = getattr(self, name)
      if not isinstance(value, dict): raise TypeError(f"Measurement.{name} must be a dict, got {type(value).__name__}")
      try: object.__setattr__(self, name, json.loads(json.dumps(value)))
      except (TypeError, ValueError) as error:
        raise TypeError(f"Measurement.{name} is not JSON-able: {error}") from None
    times = tuple(float(t) for t in self.times)
    if any(not (math.isfinite(t) and t >= 0) for t in times):
      raise ValueError(f"Measurement.times must be finite seconds >= 0, got {times}")
    if self.status == "ok" and not times: raise ValueError("a Measurement with status 'ok' needs at least one timing")
    object.__setattr__(self, "times", times)
    object.__setattr__(self, "parts", tuple(self.parts) or (self.device,))
    object.__setattr__(self, "choices", tuple(str(c) for c in self.choices))
    for name in ("max_rel_error", "max_abs_error", "measured_at"):
      object.__setattr__(self, name, float(getattr(self, name)))

def _run_row(m: Measurement, measured_at: float) -> tuple:
  return (m.graph_key, m.path_id, m.path_desc, m.device, json.dumps(list(m.parts)), fingerprint_key(m.fingerprint),
          m.tgrad_version, _canonical_json(m.settings), json.dumps(list(m.times)), m.max_rel_error, m.max_abs_error,
          m.input_distribution, m.status, m.error, measured_at, json.dumps(list(m.choices)), m.opts)

def _measurement(row: tuple) -> Measurement:
  """A Measurement from a row of RUNS joined with its graph_desc and fingerprint; bad JSON is a damaged file."""
  values = dict(zip(RUN_COLUMNS + ("graph_desc", "fingerprint"), row))
  try:
    return Measurement(graph_key=values["graph_key"], graph_desc=json.loads(values["graph_desc"]),
                       path_id=values["path_id"], path_desc=values["path_desc"], device=values["device"],
                       parts=tuple(json.loads(values["parts"])), fingerprint=json.loads(values["fingerprint"]),
                       tgrad_version=values["tgrad_version"], settings=json.loads(values["settings"]),
                       times=tuple(json.loads(values["times"])), max_rel_error=_stored_float(values["max_rel_error"]),
                       max_abs_error=_stored_float(values["max_abs_error"]),
                       input_distribution=values["input_distribution"], status=values["status"],
                       error=values["error"], measured_at=values["measured_at"],
                       choices=tuple(json.loads(values["choices"])), opts=values["opts"])
  except (TypeError, ValueError) as error:
    raise sqlite3.DatabaseError(f"damaged row {values['id']} of {RUNS}: {error}") from None

def _stored_float(value: Optional[float]) -> float: return math.nan if value is None else value  # sqlite: NaN → NULL

# ---- the database

class PathsDB(SqliteStore):
  """The benchmark database: graphs, hardware fingerprints and runs, in the kernel cache's file unless `path` names
  another. Reads find nothing and writes are dropped under CACHELEVEL=0 or once the file failed (one CacheWarning per
  process); `clear` and `stats` are maintenance calls and ignore CACHELEVEL."""
  TABLES = TABLE_COLUMNS
  TABLE_NAME = PATHS_TABLE_NAME
  SCHEMA = (f"CREATE INDEX IF NOT EXISTS {RUNS}_by_graph ON {RUNS} (graph_key, device)",
            f"CREATE INDEX IF NOT EXISTS {RUNS}_by_device ON {RUNS} (device)")
  WHAT = "benchmark database"

  def __init__(self, path: Optional[str] = None):
    super().__init__(path or cache_path())
    self._known_to_have_records: set[str] = set()   # devices ("" for any) with rows, seen by this process
    self._found_empty_at: dict[str, float] = {}      # device → monotonic time of the last query that found no rows

  def add(self, m: Measurement) -> None:
    """Store one run. Runs are appended, never replaced: several runs of one path all stay, with every timing."""
    if not isinstance(m, Measurement): raise TypeError(f"PathsDB.add takes a Measurement, got {type(m).__name__}")
    if not Context.CACHELEVEL: return
    run_row = _run_row(m, m.measured_at or time.time())
    graph_row = (m.graph_key, _canonical_json(m.graph_desc), time.time())
    hardware_row = (fingerprint_key(m.fingerprint), _canonical_json(m.fingerprint))
    def write(conn: sqlite3.Connection) -> bool:
      with write_transaction(conn):
        conn.execute(f"INSERT OR IGNORE INTO {GRAPHS} VALUES (?, ?, ?, ?)",
                     (*graph_row, self._mac(GRAPHS, *graph_row[:2])))
        conn.execute(f"INSERT OR IGNORE INTO {HARDWARE} VALUES (?, ?, ?)", (*hardware_row, self._mac(HARDWARE,
                                                                                                 *hardware_row)))
        conn.execute(f"INSERT INTO {RUNS} ({', '.join(RUN_COLUMNS[1:])}, mac) "
                     f"VALUES ({', '.join('?' * (len(run_row) + 1))})", (*run_row, self._mac(RUNS, *run_row)))
      return True
    if self._run(write, False): self._known_to_have_records.update(("", m.device))

  def runs(self, graph_key: str, device: Optional[str] = None) -> list[Measurement]:
    """Every run of `graph_key` (on `device` when given), oldest first. A run, graph or hardware row that fails
    authentication or doesn't parse is deleted with a CacheWarning (a damaged graph or hardware row hides its runs
    until the next `add` writes it again)."""
    if not Context.CACHELEVEL: return []
    where, arguments = "r.graph_key = ?", [graph_key]
    if device is not None: where, arguments = where + " AND r.device = ?", arguments + [device]
    query = (f"SELECT {', '.join('r.' + c for c in RUN_COLUMNS)}, r.mac, g.graph_desc, g.mac, h.fingerprint, h.mac "
             f"FROM {RUNS} r JOIN {GRAPHS} g ON g.graph_key = r.graph_key "
             f"JOIN {HARDWARE} h ON h.fingerprint_key = r.fingerprint_key WHERE {where} ORDER BY r.id")
    def read(conn: sqlite3.Connection) -> list[Measurement]:
      good, dropped_parents = [], set()
      for *run, run_mac, graph_desc, graph_mac, fingerprint, hardware_mac in conn.execute(query, arguments).fetchall():
        row_id, key, fingerprint_id = run[0], run[1], run[6]
        if not self._verified(run_mac, RUNS, *run[1:]):
          self._drop(conn, RUNS, "id = ?", (row_id,), f"run {row_id}", "failed authentication")
        elif not self._verified(graph_mac, GRAPHS, key, graph_desc):
          if (GRAPHS, key) not in dropped_parents:
            dropped_parents.add((GRAPHS, key))
            self._drop(conn, GRAPHS, "graph_key = ?", (key,), f"graph {key[:16]}", "failed authentication")
        elif not self._verified(hardware_mac, HARDWARE, fingerprint_id, fingerprint):
          if (HARDWARE, fingerprint_id) not in dropped_parents:
            dropped_parents.add((HARDWARE, fingerprint_id))
            self._drop(conn, HARDWARE, "fingerprint_key = ?", (fingerprint_id,), f"hardware {fingerprint_id[:16]}",
                       "failed authentication")
        else:
          try: good.append(_measurement((*run, graph_desc, fingerprint)))
          except sqlite3.DatabaseError as error:
            self._drop(conn, RUNS, "id = ?", (row_id,), f"run {row_id}", str(error))
      return good
    return self._run(read, [])

  def graphs(self) -> list[tuple[str, dict]]:
    """(graph_key, graph_desc) of every graph with records, in the order they were first added."""
    if not Context.CACHELEVEL: return []
    def read(conn: sqlite3.Connection) -> list[tuple[str, dict]]:
      good = []
      for key, desc, mac in conn.execute(f"SELECT graph_key, graph_desc, mac FROM {GRAPHS} ORDER BY rowid").fetchall():
        try:
          if not self._verified(mac, GRAPHS, key, desc): raise ValueError("failed authentication")
          if not isinstance(parsed := json.loads(desc), dict): raise ValueError(f"not a JSON object: {desc!r:.60}")
          good.append((key, parsed))
        except (TypeError, ValueError) as error:
          self._drop(conn, GRAPHS, "graph_key = ?", (key,), f"graph {key[:16]}", str(error))
      return good
    return self._run(read, [])

  def has_records(self, device: Optional[str] = None) -> bool:
    """Whether any run (on `device` when given) is stored: cheap enough to ask before every selection. A yes is
    remembered; a no is asked again after HAS_RECORDS_RECHECK_SECONDS."""
    if not Context.CACHELEVEL or self.error is not None: return False
    key = device or ""
    if key in self._known_to_have_records: return True
    now = time.monotonic()
    if now - self._found_empty_at.get(key, -math.inf) < HAS_RECORDS_RECHECK_SECONDS: return False
    query, arguments = (f"SELECT 1 FROM {RUNS} WHERE device = ? LIMIT 1", (device,)) if device else \
                       (f"SELECT 1 FROM {RUNS} LIMIT 1", ())
    found = self._run(lambda conn: conn.execute(query, arguments).fetchone() is not None, False)
    if found: self._known_to_have_records.add(key)
    else: self._found_empty_at[key] = now
    return found

  def stats(self) -> dict:
    """The path, the schema version, the row count of each table, and why the database is off (None while it works)."""
    return {"path": self.path, "schema_version": DB_SCHEMA_VERSION, "rows": self.row_counts(), "error": self.error}

  def clear(self) -> None:
    """Delete every record and drop the path tables of other schema versions (the kernel cache's tables stay)."""
    super().clear()
    self.recheck()

  def recheck(self) -> None:
    """Forget what has_records answered: the next call asks the file (another writer may have added rows)."""
    self._known_to_have_records.clear()
    self._found_empty_at.clear()

_database = ProcessWide(PathsDB)

def get_paths_db() -> PathsDB:
  """The process-wide database for the current TGRAD_CACHE path; a changed path gets a fresh instance."""
  return _database.get()

# ---- tolerances: what selection accepts, and what counts as a failed run

# Default TOLERANCE per dtype: the largest max relative error a selected path may have when TOLERANCE is unset. About
# 100 units of roundoff for float32 (eps 1.2e-7): room for reassociated reductions over thousands of elements and for
# fast intrinsics (__expf: 2 ulp), while a path that loses 3 of float32's 7 digits is not picked silently. The half
# types already round every stored value by eps/2 (float16 eps 9.8e-4, bfloat16 7.8e-3), so a few eps is all a path
# can promise: 10 eps for float16, ~6 for bfloat16. float64 (eps 2.2e-16) gets 1e-12, ~4500 eps, enough for long
# reductions and polynomial approximations while still rejecting any path that computes in float32.
DEFAULT_TOLERANCES = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-2, "bfloat16": 5e-2}
# Sanity bound per dtype: a run whose max relative error is beyond it computed a wrong answer (a bug, garbage, a
# crash), not an imprecise one; the profiler records it as 'failed' and selection never picks it, whatever
# TOLERANCE says. 1e-6 for float64 is 10^10 ulps; 5e-2 for float32 leaves 1–2 of its 7 digits: a deep graph's
# correct kernels measure up to 1.3e-2 elementwise (gemma-3-270m's 520-token prefill, KV caches included: the
# relative error of small elements grows through 18 layers), so the bound sits above that; the half types keep 1
# (float16, 1e-1) or less (bfloat16, 2.5e-1) digit.
SANITY_BOUNDS = {"float64": 1e-6, "float32": 5e-2, "float16": 1e-1, "bfloat16": 2.5e-1}
EXACT = 0.0   # integer and bool results have one right answer: any error is a failure

def _dtype_name(dtype: Union[DType, str]) -> str:
  name = dtype.name if isinstance(dtype, DType) else dtype
  if not isinstance(name, str) or not isinstance(getattr(dtypes, name, None), DType) or name == "void":
    raise ValueError(f"no tolerance for dtype {dtype!r}; expected a tgrad DType or the name of one")
  return getattr(dtypes, name).name   # aliases ('float', 'half') to their canonical names

def default_tolerance(dtype: Union[DType, str]) -> float:
  """The max relative error a selected path of a graph with this output dtype may have when TOLERANCE is unset."""
  return DEFAULT_TOLERANCES.get(_dtype_name(dtype), EXACT)

def sanity_bound(dtype: Union[DType, str]) -> float:
  """The max relative error beyond which a run of this output dtype is recorded as failed."""
  return SANITY_BOUNDS.get(_dtype_name(dtype), EXACT)

def selection_tolerance(dtype: Union[DType, str]) -> float:
  """TOLERANCE if it is set (`with Context(TOLERANCE=1e-3):`), else default_tolerance(dtype)."""
  return Context.TOLERANCE if Context.TOLERANCE is not None else default_tolerance(dtype)

# ---- summaries and selection

@dataclass(frozen=True, kw_only=True)
class PathSummary:
  """Every run of one path on one fingerprint, tgrad version and settings, in one line. Times are over every timing
  of every run: `min_time` (what selection ranks by: the run least disturbed by the rest of the machine) and
  `median_time` (shown, and the first tie-breaker). Errors are the worst of any run. `status` is 'ok' only if every
  run was ok: a path that failed once is not trusted."""
  graph_key: str
  path_id: str
  path_desc: str
  device: str
  parts: tuple[str, ...]
  runs: int
  timings: int
  min_time: float        # seconds; inf when no run has a timing
  median_time: float
  max_rel_error: float   # NaN when any run's error is NaN
  max_abs_error: float
  status: str
  error: str             # the first failed run's error text
  fingerprint: dict
  tgrad_version: str
  settings: dict
  choices: tuple[str, ...] = ()   # the path's lowering per region (see Measurement)
  opts: str = "heuristic"

def summarize(runs: Sequence[Measurement]) -> list[PathSummary]:
  """One PathSummary per (graph, path, fingerprint, tgrad version, settings), in the order each first appears."""
  groups: dict[tuple, list[Measurement]] = {}
  for m in runs:
    key = (m.graph_key, m.path_id, fingerprint_key(m.fingerprint), m.tgrad_version, _canonical_json(m.settings))
    groups.setdefault(key, []).append(m)
  return [_summary(group) for group in groups.values()]

def _summary(group: list[Measurement]) -> PathSummary:
  first, times = group[0], [t for m in group for t in m.times]
  failed = [m for m in group if m.status != "ok"]
  return PathSummary(graph_key=first.graph_key, path_id=first.path_id, path_desc=first.path_desc, device=first.device,
                     parts=first.parts, runs=len(group), timings=len(times),
                     min_time=min(times, default=math.inf),
                     median_time=statistics.median(times) if times else math.inf,
                     max_rel_error=_worst(m.max_rel_error for m in group),
                     max_abs_error=_worst(m.max_abs_error for m in group),
                     status="failed" if failed else "ok", error=failed[0].error if failed else "",
                     fingerprint=first.fingerprint, tgrad_version=first.tgrad_version, settings=first.settings,
                     choices=first.choices, opts=first.opts)

def _worst(errors) -> float:
  errors = list(errors)
  return math.nan if any(math.isnan(e) for e in errors) else max(errors)

@dataclass(frozen=True)
class Selection:
  """The chosen path (None: the caller runs its documented default path), why, and why every other path lost."""
  chosen: Optional[PathSummary]
  reason: str
  rejected: tuple[tuple[PathSummary, str], ...] = ()

# the order in which rejected paths are listed: the near misses first
_SLOWER, _BEYOND_TOLERANCE, _FAILED, _ELSEWHERE = range(4)

def select(runs: Sequence[Measurement], tolerance: float, fingerprint: Union[dict, Callable[[str], dict]],
           tgrad_version: str, settings: dict) -> Selection:
  """The fastest verified path of one graph whose max relative error (worst over its runs) is <= `tolerance`, among
  the paths recorded on this `fingerprint`, by this `tgrad_version`, under these code-changing `settings`. Fastest
  is the least min_time; ties go to the lower median_time, then the lower path_id. Failed paths are never chosen.
  `fingerprint` may be a function of the device name (`hardware_fingerprint`) when the runs are on several devices:
  each path is then compared with its own device's fingerprint.
  Only `runs` are read, so another tolerance re-selects from the same records without measuring again."""
  if not isinstance(tolerance, (int, float)) or isinstance(tolerance, bool) or not 0 <= tolerance < math.inf:
    raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
  if not runs: return Selection(None, "no records")
  if len(graph_keys := {m.graph_key for m in runs}) > 1:
    raise ValueError(f"select() takes the runs of one graph, got {len(graph_keys)}: {sorted(graph_keys)}")
  settings = json.loads(json.dumps(settings))   # compared in the form the records hold
  fingerprints = _FingerprintsHere(fingerprint)
  verdicts: list[tuple[int, PathSummary, str]] = []
  eligible: list[PathSummary] = []
  for summary in summarize(runs):
    if (elsewhere := _recorded_elsewhere(summary, fingerprints, tgrad_version, settings)):
      verdicts.append((_ELSEWHERE, summary, elsewhere))
    elif summary.status != "ok": verdicts.append((_FAILED, summary, f"failed: {summary.error or 'no error text'}"))
    elif not summary.max_rel_error <= tolerance:   # NaN is never within
      verdicts.append((_BEYOND_TOLERANCE, summary,
                       f"rel error {summary.max_rel_error:.1e} > tolerance {tolerance:.0e}"))
    else: eligible.append(summary)
  eligible.sort(key=lambda s: (s.min_time, s.median_time, s.path_id))
  if eligible:
    best = eligible[0]
    verdicts += [(_SLOWER, s, _slower_reason(s, best)) for s in eligible[1:]]
    reason = (f"fastest of {len(eligible)} verified path{'s' * (len(eligible) > 1)} within {tolerance:.0e} "
              f"(rel err {best.max_rel_error:.1e}, {_microseconds(best.min_time)})")
  else: best, reason = None, _why_none(verdicts, tolerance)
  verdicts.sort(key=lambda v: (v[0], v[1].min_time, v[1].path_id))
  return Selection(best, reason, tuple((summary, why) for _, summary, why in verdicts))

class _FingerprintsHere:
  """This machine's fingerprint for each device, asked once per device; a device whose fingerprint can't be had (no
  GPU here: DeviceUnavailable) gets None, so its records count as made elsewhere."""
  def __init__(self, fingerprint: Union[dict, Callable[[str], dict]]):
    self.fingerprint, self.known, self.unavailable = fingerprint, {}, {}
  def __call__(self, device: str) -> Optional[dict]:
    if not callable(self.fingerprint): return json.loads(json.dumps(self.fingerprint))
    if device not in self.known and device not in self.unavailable:
      try: self.known[device] = json.loads(json.dumps(self.fingerprint(device)))
      except (RuntimeError, ValueError) as error: self.unavailable[device] = f"{type(error).__name__}: {error}"
    return self.known.get(device)

def _recorded_elsewhere(summary: PathSummary, fingerprints: _FingerprintsHere, tgrad_version: str,
                        settings: dict) -> str:
  """Why a path's records do not apply here (other hardware, tgrad version or settings), '' when they do."""
  reasons = []
  if (here := fingerprints(summary.device)) is None:
    reasons.append(f"other hardware: no {summary.device} here ({fingerprints.unavailable[summary.device]})")
  elif (hardware := describe_difference(summary.fingerprint, here)):
    reasons.append(f"other hardware (record vs here): {hardware}")
  if summary.tgrad_version != tgrad_version:
    reasons.append(f"other tgrad version (record vs here): {summary.tgrad_version} vs {tgrad_version}")
  if summary.settings != settings:
    names = sorted(set(summary.settings) | set(settings), key=str)
    changed = [f"{n}: {summary.settings.get(n)!r} vs {settings.get(n)!r}" for n in names
               if summary.settings.get(n) != settings.get(n)]
    reasons.append(f"other settings (record vs here): {', '.join(changed)}")
  return "; ".join(reasons)

def _slower_reason(summary: PathSummary, best: PathSummary) -> str:
  if summary.min_time != best.min_time:
    return f"slower: {_microseconds(summary.min_time)} vs {_microseconds(best.min_time)}"
  if summary.median_time != best.median_time:
    return (f"tie at {_microseconds(best.min_time)}, slower median: {_microseconds(summary.median_time)} vs "
            f"{_microseconds(best.median_time)}")
  return f"tie at {_microseconds(best.min_time)} (median too), broken by path id ({best.path_id} first)"

def _why_none(verdicts: list[tuple[int, PathSummary, str]], tolerance: float) -> str:
  counts = {kind: sum(1 for k, _, _ in verdicts if k == kind) for kind in (_BEYOND_TOLERANCE, _FAILED, _ELSEWHERE)}
  if counts[_ELSEWHERE] == len(verdicts):
    return f"no records for this hardware, tgrad version and settings ({len(verdicts)} paths recorded elsewhere)"
  parts = []
  if counts[_BEYOND_TOLERANCE]:
    closest = min((s for k, s, _ in verdicts if k == _BEYOND_TOLERANCE),
                  key=lambda s: (math.isnan(s.max_rel_error), s.max_rel_error, s.path_id))
    parts.append(f"{counts[_BEYOND_TOLERANCE]} beyond tolerance (closest: {closest.path_id}, rel err "
                 f"{closest.max_rel_error:.1e})")
  if counts[_FAILED]: parts.append(f"{counts[_FAILED]} failed")
  if counts[_ELSEWHERE]: parts.append(f"{counts[_ELSEWHERE]} recorded elsewhere")
  return f"no verified path within {tolerance:.0e}: {', '.join(parts)}"

def _microseconds(seconds: float) -> str: return f"{seconds * 1e6:.1f} us"
