"""Tests for the benchmark database of execution paths (tgrad/paths/db.py) and hardware fingerprints
(tgrad/paths/fingerprint.py): storage round trips, a damaged or locked file, concurrent writers, selection within a
tolerance on synthetic records, the TOLERANCE setting and the per-dtype tolerances.
"""
import ast, json, math, multiprocessing, os, random, sqlite3, subprocess, sys, warnings
from pathlib import Path
import pytest
import tgrad.cache as cache_module
import tgrad.paths.db as db_module
from tgrad.cache import BINARIES, CacheWarning, get_cache
from tgrad.dtype import dtypes
from tgrad.helpers import Context, SettingError, _settings_from_environment, code_settings, settings_key
from tgrad.paths.db import (GRAPHS, HARDWARE, RUNS, Measurement, PathsDB, default_tolerance, get_paths_db,
                            sanity_bound, select, selection_tolerance, summarize)
from tgrad.helpers import cpu_model
from tgrad.paths.fingerprint import (describe_difference, fingerprint_key, hardware_fingerprint, source_hash,
                                     tgrad_version)
from tgrad.runtime.cuda.fingerprint import cuda_fingerprint

REPO_ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_TIMEOUT_SECONDS = 60
H100 = {"device": "CUDA", "gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "multiprocessors": 132,
        "total_memory_bytes": 85_000_000_000, "driver_version": "12.8", "cuda_version": "12.8", "nvrtc_version": "13.0"}
A100 = {**H100, "gpu_name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0", "multiprocessors": 108}
VERSION = "0.1.0+src.aaaaaaaaaaaa"
SETTINGS = {"NOOPT": 0}
GRAPH = "ab" * 32

def run(path_id: str, times=(1e-5,), rel=1e-7, status="ok", fingerprint=H100, version=VERSION, settings=SETTINGS,
        graph=GRAPH, error="", device="CUDA", **fields) -> Measurement:
  """One synthetic run; every field the selection reads can be changed."""
  return Measurement(graph_key=graph, graph_desc={"shapes": [[4096, 4096]], "dtypes": ["float32"],
                                                  "composites": ["softmax"]},
                     path_id=path_id, path_desc=f"softmax as {path_id}", device=device, fingerprint=fingerprint,
                     tgrad_version=version, settings=settings, times=times, max_rel_error=rel,
                     max_abs_error=rel * 10, input_distribution="normal(0,1) seed 0", status=status, error=error,
                     **fields)

@pytest.fixture
def paths_db(tmp_path, monkeypatch) -> PathsDB:
  path = tmp_path / "cache.db"
  monkeypatch.setenv("TGRAD_CACHE", str(path))
  monkeypatch.setattr(cache_module, "_warned", False)
  return PathsDB()

def run_python(code: str, cache_path: Path) -> subprocess.CompletedProcess:
  env = {**os.environ, "TGRAD_CACHE": str(cache_path), "PYTHONPATH": str(REPO_ROOT)}
  return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        timeout=SUBPROCESS_TIMEOUT_SECONDS)

# ---- storage

def test_every_field_survives_the_round_trip(paths_db):
  measurement = Measurement(
    graph_key=GRAPH, graph_desc={"shapes": [[2, 3], [3]], "dtypes": ["float16"], "composites": ["gelu", "softmax"]},
    path_id="gelu=tanh|softmax=online|k0=UPCAST(0,4)|CUDA+LLVM", path_desc="gelu as tanh, online softmax, half on CPU",
    device="CUDA", parts=("CUDA", "LLVM", "CUDA"), fingerprint=H100, tgrad_version=VERSION, settings={"NOOPT": 1},
    times=(1.25e-5, 1.5e-5, 1.0000000000000002e-5), max_rel_error=3.0517578125e-05, max_abs_error=1 / 3,
    input_distribution="uniform(-3,3) seed 7", status="failed", error="RuntimeError: cuLaunch failed\nline 2",
    measured_at=1_790_000_000.123456)
  paths_db.add(measurement)
  assert paths_db.runs(GRAPH) == [measurement]
  assert paths_db.graphs() == [(GRAPH, measurement.graph_desc)]

def test_json_forms_defaults_and_special_errors(paths_db):
  tuples = Measurement(graph_key=GRAPH, graph_desc={"shape": (2, 3)}, path_id="p", path_desc="", device="LLVM",
                       fingerprint={"cores": 2}, tgrad_version=VERSION, settings={}, times=[1e-3],
                       max_rel_error=math.inf, max_abs_error=math.nan, input_distribution="", status="ok")
  assert tuples.graph_desc == {"shape": [2, 3]} and tuples.parts == ("LLVM",) and tuples.times == (1e-3,)
  paths_db.add(tuples)
  (stored,) = paths_db.runs(GRAPH)
  assert stored.max_rel_error == math.inf and math.isnan(stored.max_abs_error)   # sqlite keeps NaN as NULL
  assert stored.measured_at > 1e9 and stored.graph_desc == {"shape": [2, 3]}     # 0 means "now"

def test_bad_measurements_raise():
  with pytest.raises(ValueError, match="status"): run("p", status="slow")
  with pytest.raises(ValueError, match="at least one timing"): run("p", times=())
  with pytest.raises(ValueError, match="finite seconds"): run("p", times=(1e-5, -1.0))
  with pytest.raises(ValueError, match="finite seconds"): run("p", times=(math.nan,))
  with pytest.raises(TypeError, match="settings is not JSON-able"): run("p", settings={"NOOPT": object()})
  with pytest.raises(ValueError, match="path_id"): run("")
  assert run("crashed", times=(), status="failed", error="segfault").times == ()
  with pytest.raises(TypeError, match="Measurement"): PathsDB(":memory:").add({"path_id": "p"})

def test_several_runs_keep_every_timing_in_order(paths_db):
  paths_db.add(run("a", times=(3e-5, 1e-5, 2e-5)))
  paths_db.add(run("b", times=(5e-6,), device="LLVM", fingerprint={"device": "LLVM"}))
  paths_db.add(run("a", times=(4e-5, 0.5e-5)))
  paths_db.add(run("a", times=(1e-4,), graph="cd" * 32))
  assert [(m.path_id, m.times) for m in paths_db.runs(GRAPH)] == [("a", (3e-5, 1e-5, 2e-5)), ("b", (5e-6,)),
                                                                 ("a", (4e-5, 0.5e-5))]
  assert [m.path_id for m in paths_db.runs(GRAPH, device="LLVM")] == ["b"]
  assert paths_db.runs("ef" * 32) == []
  assert [key for key, _ in paths_db.graphs()] == [GRAPH, "cd" * 32]
  assert paths_db.stats()["rows"] == {GRAPHS: 2, HARDWARE: 2, RUNS: 4}   # one row per graph and per fingerprint
  (summary,) = [s for s in summarize(paths_db.runs(GRAPH)) if s.path_id == "a"]
  assert (summary.runs, summary.timings, summary.min_time, summary.median_time) == (2, 5, 0.5e-5, 2e-5)

def test_values_are_json_text_never_pickle(paths_db):
  paths_db.add(run("a"))
  conn = sqlite3.connect(paths_db.path)
  row = conn.execute(f"SELECT parts, settings, times FROM {RUNS}").fetchone()
  assert [json.loads(text) for text in row] == [["CUDA"], SETTINGS, [1e-5]]
  assert json.loads(conn.execute(f"SELECT fingerprint FROM {HARDWARE}").fetchone()[0]) == H100
  conn.close()
  for module in ("db.py", "fingerprint.py"):   # nothing that can deserialize code is even imported
    tree = ast.parse((REPO_ROOT / "tgrad" / "paths" / module).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names} | \
               {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "json" in imported or module == "fingerprint.py"
    assert not imported & {"pickle", "marshal", "shelve", "dill", "cloudpickle"}, imported

def test_shares_the_kernel_cache_file_and_clears_only_its_tables(paths_db):
  assert get_paths_db().path == get_cache().path == paths_db.path
  get_cache().put_binary("src", "key", b"binary")
  paths_db.add(run("a"))
  conn = sqlite3.connect(paths_db.path, isolation_level=None)
  conn.execute("CREATE TABLE paths_runs_v0 (x)")   # a table of an older schema
  paths_db.clear()
  tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
  conn.close()
  assert "paths_runs_v0" not in tables and RUNS in tables and BINARIES in tables
  assert paths_db.runs(GRAPH) == [] and paths_db.graphs() == [] and not paths_db.has_records()
  assert get_cache().get_binary("src", "key") == b"binary"

def test_has_records_sees_own_and_other_processes_writes(paths_db, monkeypatch):
  assert not paths_db.has_records() and not paths_db.has_records("CUDA")
  paths_db.add(run("a"))
  assert paths_db.has_records() and paths_db.has_records("CUDA") and not paths_db.has_records("LLVM")
  monkeypatch.setattr(db_module, "HAS_RECORDS_RECHECK_SECONDS", 0.0)
  writer = ("from tgrad.paths.db import Measurement, get_paths_db\n"
            "get_paths_db().add(Measurement(graph_key='g', graph_desc={}, path_id='p', path_desc='', device='LLVM', "
            "fingerprint={}, tgrad_version='v', settings={}, times=(1.0,), max_rel_error=0.0, max_abs_error=0.0, "
            "input_distribution='', status='ok'))\n")
  assert run_python(writer, Path(paths_db.path)).returncode == 0
  assert paths_db.has_records("LLVM")
  paths_db.clear()
  assert not paths_db.has_records() and not paths_db.has_records("CUDA")

def test_cachelevel_zero_reads_nothing_and_writes_nothing(paths_db):
  with Context(CACHELEVEL=0):
    paths_db.add(run("a"))
    assert paths_db.runs(GRAPH) == [] and paths_db.graphs() == [] and not paths_db.has_records()
  assert not os.path.exists(paths_db.path)   # nothing was even opened
  paths_db.add(run("a"))
  with Context(CACHELEVEL=0): assert paths_db.runs(GRAPH) == []
  assert len(paths_db.runs(GRAPH)) == 1

def test_damaged_file_warns_once_and_runs_without_records(paths_db):
  Path(paths_db.path).write_bytes(b"not an sqlite database\x00\xff" * 300)
  with pytest.warns(CacheWarning, match="benchmark database .*cache.db is unusable"):
    paths_db.add(run("a"))
  with warnings.catch_warnings():
    warnings.simplefilter("error")   # a second warning would raise here
    assert paths_db.runs(GRAPH) == [] and paths_db.graphs() == [] and not paths_db.has_records()
    paths_db.add(run("b"))
    paths_db.clear()
    assert "DatabaseError" in paths_db.stats()["error"]
    assert PathsDB().runs(GRAPH) == []   # another instance on the same bad file: also silent, the warning was given
    assert select(paths_db.runs(GRAPH), 1e-5, H100, VERSION, SETTINGS).reason == "no records"

def test_damaged_row_is_dropped_and_the_rest_kept(paths_db):
  paths_db.add(run("a"))
  paths_db.add(run("b"))
  conn = sqlite3.connect(paths_db.path, isolation_level=None)
  conn.execute(f"UPDATE {RUNS} SET times = 'not json' WHERE path_id = 'a'")
  with pytest.warns(CacheWarning, match="dropped run 1 .failed authentication"):
    assert [r.path_id for r in paths_db.runs(GRAPH)] == ["b"]
  assert conn.execute(f"SELECT path_id FROM {RUNS}").fetchall() == [("b",)] and paths_db.error is None
  conn.close()

def test_locked_file_warns_and_runs_without_records(paths_db, monkeypatch):
  monkeypatch.setattr(cache_module, "BUSY_TIMEOUT_SECONDS", 0.05)
  paths_db.add(run("a"))
  holder = sqlite3.connect(paths_db.path, isolation_level=None)
  holder.execute("BEGIN EXCLUSIVE")
  try:
    with pytest.warns(CacheWarning, match="locked"):
      paths_db.add(run("b"))
    assert paths_db.runs(GRAPH) == [] and not paths_db.has_records("CUDA")   # off: even what this process added
  finally:
    holder.execute("ROLLBACK")
    holder.close()
  assert [m.path_id for m in PathsDB().runs(GRAPH)] == ["a"]   # the dropped write left nothing half-written

WRITERS, RUNS_EACH = 4, 25

def _write_runs(writer: int) -> None:
  database = get_paths_db()
  for i in range(RUNS_EACH):
    database.add(run(f"writer{writer}", times=(i * 1e-6, writer * 1e-6)))
  if database.error is not None: raise RuntimeError(database.error)

def test_concurrent_writers_keep_every_row(paths_db):
  paths_db.add(run("parent"))   # the parent's open connection is inherited by every forked writer
  get_paths_db().add(run("parent"))
  workers = multiprocessing.get_context("fork").Pool(WRITERS)
  try: workers.map(_write_runs, range(WRITERS), chunksize=1)
  finally:
    workers.close()
    workers.join()
  stored = paths_db.runs(GRAPH)
  assert len(stored) == 2 + WRITERS * RUNS_EACH and paths_db.error is None
  for writer in range(WRITERS):
    assert [m.times for m in stored if m.path_id == f"writer{writer}"] == \
           [(i * 1e-6, writer * 1e-6) for i in range(RUNS_EACH)]

# ---- selection

def test_fastest_within_tolerance_and_every_other_reason():
  runs = [run("fast_inexact", times=(5e-6,), rel=1e-3), run("medium", times=(1e-5, 1.2e-5), rel=1e-6),
          run("slow_exact", times=(2e-5,), rel=1e-8)]
  selection = select(runs, 1e-5, H100, VERSION, SETTINGS)
  assert selection.chosen.path_id == "medium"
  assert selection.reason == "fastest of 2 verified paths within 1e-05 (rel err 1.0e-06, 10.0 us)"
  assert [(s.path_id, why) for s, why in selection.rejected] == [
    ("slow_exact", "slower: 20.0 us vs 10.0 us"), ("fast_inexact", "rel error 1.0e-03 > tolerance 1e-05")]

def test_another_tolerance_reselects_from_the_same_records(paths_db):
  for path_id, seconds, rel in (("fast", 5e-6, 1e-3), ("medium", 1e-5, 1e-6), ("slow", 2e-5, 1e-8)):
    paths_db.add(run(path_id, times=(seconds,), rel=rel))
  records = paths_db.runs(GRAPH)
  chosen = {tolerance: select(records, tolerance, H100, VERSION, SETTINGS).chosen
            for tolerance in (1e-2, 1e-6, 5e-7, 1e-9)}
  assert {t: c and c.path_id for t, c in chosen.items()} == {1e-2: "fast", 1e-6: "medium", 5e-7: "slow", 1e-9: None}
  with Context(TOLERANCE=1e-2): assert select(records, selection_tolerance(dtypes.float32), H100, VERSION,
                                              SETTINGS).chosen.path_id == "fast"
  assert select(records, selection_tolerance(dtypes.float32), H100, VERSION, SETTINGS).chosen.path_id == "medium"

def test_worst_error_and_least_time_over_runs():
  runs = [run("a", times=(3e-5,), rel=1e-7), run("a", times=(1e-5,), rel=1e-4), run("b", times=(2e-5,), rel=1e-7),
          run("b", times=(4e-5, 1.5e-5), rel=2e-7)]
  selection = select(runs, 1e-5, H100, VERSION, SETTINGS)
  assert selection.chosen.path_id == "b" and selection.chosen.min_time == 1.5e-5 and selection.chosen.runs == 2
  assert selection.chosen.max_rel_error == 2e-7 and selection.chosen.median_time == 2e-5
  assert selection.rejected[0][1] == "rel error 1.0e-04 > tolerance 1e-05"
  assert select(runs, 1e-3, H100, VERSION, SETTINGS).chosen.path_id == "a"   # least time: the second run's 10 us

def test_ties_break_on_median_then_path_id_whatever_the_order():
  runs = [run("c", times=(1e-5, 3e-5)), run("b", times=(1e-5, 2e-5)), run("a", times=(1e-5, 2e-5))]
  for seed in range(4):
    random.Random(seed).shuffle(runs)
    selection = select(runs, 1e-5, H100, VERSION, SETTINGS)
    assert selection.chosen.path_id == "a"
    assert [(s.path_id, why) for s, why in selection.rejected] == [
      ("b", "tie at 10.0 us (median too), broken by path id (a first)"),
      ("c", "tie at 10.0 us, slower median: 20.0 us vs 15.0 us")]

def test_no_records():
  selection = select([], 1e-5, H100, VERSION, SETTINGS)
  assert (selection.chosen, selection.reason, selection.rejected) == (None, "no records", ())

def test_everything_beyond_tolerance_chooses_nothing():
  runs = [run("a", rel=3e-4), run("b", rel=2e-5), run("c", rel=math.nan), run("d", status="failed", error="boom")]
  selection = select(runs, 1e-5, H100, VERSION, SETTINGS)
  assert selection.chosen is None
  assert selection.reason == "no verified path within 1e-05: 3 beyond tolerance (closest: b, rel err 2.0e-05), 1 failed"
  assert [(s.path_id, why) for s, why in selection.rejected] == [
    ("a", "rel error 3.0e-04 > tolerance 1e-05"), ("b", "rel error 2.0e-05 > tolerance 1e-05"),
    ("c", "rel error nan > tolerance 1e-05"), ("d", "failed: boom")]

def test_failed_paths_are_never_chosen():
  runs = [run("crashes", times=(), rel=math.inf, status="failed", error="CUDA error: illegal address"),
          run("wrong", times=(1e-6,), rel=0.5, status="failed", error="rel error 5.0e-01 beyond sanity bound 1e-02"),
          run("flaky", times=(2e-6,), rel=0.0), run("flaky", times=(2e-6,), rel=0.0, status="failed", error="hang"),
          run("ok", times=(1e-4,), rel=1e-7)]
  for tolerance in (1e-5, 10.0):
    selection = select(runs, tolerance, H100, VERSION, SETTINGS)
    assert selection.chosen.path_id == "ok"
    assert {s.path_id: why for s, why in selection.rejected} == {
      "crashes": "failed: CUDA error: illegal address", "wrong": "failed: rel error 5.0e-01 beyond sanity bound 1e-02",
      "flaky": "failed: hang"}

def test_records_from_elsewhere_are_rejected_naming_the_difference():
  runs = [run("a100", times=(1e-6,), fingerprint=A100), run("old", times=(2e-6,), version="0.0.9+src.bbbbbbbbbbbb"),
          run("noopt", times=(3e-6,), settings={"NOOPT": 1}), run("here", times=(9e-6,))]
  selection = select(runs, 1e-5, H100, VERSION, SETTINGS)
  assert selection.chosen.path_id == "here" and selection.reason.startswith("fastest of 1 verified path within")
  reasons = {s.path_id: why for s, why in selection.rejected}
  assert reasons["a100"] == ("other hardware (record vs here): other GPU: NVIDIA A100-SXM4-80GB vs NVIDIA H100 80GB "
                             "HBM3; other compute capability: 8.0 vs 9.0; other multiprocessor count: 108 vs 132")
  assert reasons["old"] == f"other tgrad version (record vs here): 0.0.9+src.bbbbbbbbbbbb vs {VERSION}"
  assert reasons["noopt"] == "other settings (record vs here): NOOPT: 1 vs 0"
  nothing_here = select(runs[:3], 1e-5, H100, VERSION, SETTINGS)
  assert nothing_here.chosen is None
  assert nothing_here.reason == "no records for this hardware, tgrad version and settings (3 paths recorded elsewhere)"

def test_paths_on_several_devices_compare_with_their_own_fingerprint():
  cpu = {"device": "LLVM", "cpu_model": "AMD EPYC", "cores": 2}
  runs = [run("gpu", times=(5e-6,)), run("cpu", times=(2e-6,), device="LLVM", fingerprint=cpu),
          run("other_cpu", times=(1e-6,), device="LLVM", fingerprint={**cpu, "cores": 64})]
  fingerprints = {"CUDA": H100, "LLVM": cpu}
  selection = select(runs, 1e-5, fingerprints.__getitem__, VERSION, SETTINGS)
  assert selection.chosen.path_id == "cpu"
  assert {s.path_id: why for s, why in selection.rejected} == {
    "gpu": "slower: 5.0 us vs 2.0 us", "other_cpu": "other hardware (record vs here): other core count: 64 vs 2"}
  assert select(runs, 1e-5, H100, VERSION, SETTINGS).chosen.path_id == "gpu"   # one fingerprint: the CPU is foreign
  def no_gpu_here(device: str) -> dict:
    if device == "CUDA": raise RuntimeError("device CUDA can't start: no GPU is visible")
    return cpu
  selection = select(runs, 1e-5, no_gpu_here, VERSION, SETTINGS)
  assert selection.chosen.path_id == "cpu"
  assert dict((s.path_id, why) for s, why in selection.rejected)["gpu"] == \
         "other hardware: no CUDA here (RuntimeError: device CUDA can't start: no GPU is visible)"

def test_select_checks_its_arguments():
  for bad in (-1e-5, math.nan, math.inf, "1e-5", True):
    with pytest.raises(ValueError, match="tolerance"): select([run("a")], bad, H100, VERSION, SETTINGS)
  with pytest.raises(ValueError, match="one graph"): select([run("a"), run("a", graph="cd" * 32)], 1e-5, H100,
                                                            VERSION, SETTINGS)

# ---- tolerances and the TOLERANCE setting

def test_default_tolerances_and_sanity_bounds_per_dtype():
  assert [default_tolerance(d) for d in (dtypes.float64, dtypes.float32, dtypes.float16, dtypes.bfloat16)] == \
         [1e-12, 1e-5, 1e-2, 5e-2]
  assert default_tolerance("float") == default_tolerance("float32") and default_tolerance("half") == 1e-2
  assert default_tolerance(dtypes.int32) == 0.0 and sanity_bound(dtypes.bool) == 0.0
  for dtype in (dtypes.float64, dtypes.float32, dtypes.float16, dtypes.bfloat16):
    eps = float(__import__("numpy").finfo(dtype.np).eps) if dtype != dtypes.bfloat16 else 2.0 ** -7
    assert eps < default_tolerance(dtype) < sanity_bound(dtype) < 1, dtype
  for bad in ("float8", dtypes.void, 3):
    with pytest.raises(ValueError, match="no tolerance for dtype"): default_tolerance(bad)

def test_tolerance_setting_from_context_and_environment(monkeypatch):
  assert Context.TOLERANCE is None and selection_tolerance(dtypes.float16) == 1e-2
  with Context(TOLERANCE=1e-3):
    assert Context.TOLERANCE == 1e-3 and selection_tolerance(dtypes.float16) == 1e-3
    with Context(TOLERANCE=None): assert selection_tolerance(dtypes.float64) == 1e-12
  with Context(TOLERANCE="2e-4"): assert Context.TOLERANCE == 2e-4
  with Context(TOLERANCE=0): assert selection_tolerance(dtypes.float32) == 0.0
  for bad in (-1, "abc", math.nan, math.inf, True):
    with pytest.raises(SettingError, match="TOLERANCE"): Context(TOLERANCE=bad)
  monkeypatch.setenv("TOLERANCE", " 1e-4 ")
  assert _settings_from_environment().TOLERANCE == 1e-4
  monkeypatch.setenv("TOLERANCE", "")
  assert _settings_from_environment().TOLERANCE is None
  monkeypatch.setenv("TOLERANCE", "tight")
  with pytest.raises(SettingError, match="environment variable TOLERANCE='tight' is not valid"):
    _settings_from_environment()

def test_tolerance_is_not_part_of_the_kernel_cache_keys():
  import tgrad.realize as realize
  from tgrad import Tensor
  assert "TOLERANCE" not in code_settings()
  plain_key, plain_settings = settings_key(), realize._settings()
  (Tensor([1.0, 2.0]) * 3 + 1).numpy()
  compiled = len(realize._runner_cache)
  with Context(TOLERANCE=1e-1):
    assert settings_key() == plain_key and realize._settings() == plain_settings
    assert (Tensor([1.0, 2.0]) * 3 + 1).numpy().tolist() == [4.0, 7.0]
  assert len(realize._runner_cache) == compiled   # the kernel compiled without TOLERANCE served the scope with it

# ---- fingerprints and version

def test_llvm_fingerprint_starts_no_gpu_and_hashes_the_same_in_another_process():
  code = ("import json, sys\nfrom tgrad.paths.fingerprint import hardware_fingerprint, fingerprint_key\n"
          "fp = hardware_fingerprint('cpu')\n"
          "print(json.dumps([fp, fingerprint_key(fp), 'pycuda' in sys.modules, "
          "'tgrad.runtime.cuda.runtime' in sys.modules]))")
  result = run_python(code, REPO_ROOT / "unused.db")
  assert result.returncode == 0, result.stderr
  fingerprint, key, pycuda_loaded, cuda_loaded = json.loads(result.stdout)
  assert not pycuda_loaded and not cuda_loaded
  assert fingerprint == hardware_fingerprint("LLVM") and key == fingerprint_key(hardware_fingerprint("LLVM"))
  assert fingerprint["device"] == "LLVM" and fingerprint["cores"] >= 1 and fingerprint["cpu_model"]
  assert fingerprint["llvm_cpu"] and "," in fingerprint["cpu_features"]
  assert fingerprint_key(dict(reversed(list(fingerprint.items())))) == key
  with pytest.raises(ValueError, match="unknown device"): hardware_fingerprint("TPU")

def test_cuda_fingerprint_from_a_context():
  class FakeDevice:
    def name(self): return "NVIDIA H100 80GB HBM3"
    def total_memory(self): return 85_000_000_000
  class FakeContext:
    device, compute_capability = FakeDevice(), (9, 0)
    def attribute(self, name): return {"MULTIPROCESSOR_COUNT": 132}[name]
  assert cuda_fingerprint(FakeContext(), 12080, (12, 8, 0), (13, 0)) == {**H100, "cuda_version": "12.8.0"}

@pytest.mark.gpu
def test_cuda_fingerprint_of_this_gpu():
  fingerprint = hardware_fingerprint("CUDA")
  assert fingerprint["device"] == "CUDA" and "NVIDIA" in fingerprint["gpu_name"]
  assert fingerprint["compute_capability"][0].isdigit() and fingerprint["multiprocessors"] > 0

def test_describe_difference():
  assert describe_difference(H100, dict(reversed(list(H100.items())))) == ""
  assert describe_difference({**H100, "driver_version": "12.4"}, H100) == "other CUDA driver: 12.4 vs 12.8"
  cpu = {"device": "LLVM", "cpu_features": "avx,avx2,avx512f", "cores": 16}
  assert describe_difference(cpu, {**cpu, "cpu_features": "avx,avx2,amx-tile", "cores": 8, "extra": "x"}) == (
    "other CPU features: this CPU lacks avx512f, the record's CPU lacks amx-tile; other core count: 16 vs 8; "
    "other extra: (none) vs x")
  assert describe_difference(H100, cpu).startswith("other device: CUDA vs LLVM; other GPU: NVIDIA H100 80GB HBM3 vs")

def test_cpu_model_from_cpuinfo(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9555 64-Core Processor\n"
                     "processor\t: 1\nmodel name\t: AMD EPYC 9555 64-Core Processor\n")
  assert cpu_model(str(cpuinfo)) == "AMD EPYC 9555 64-Core Processor"
  assert cpu_model(str(tmp_path / "missing"))   # falls back to the platform module

def test_tgrad_version_hashes_code_generating_sources(tmp_path):
  version = tgrad_version()
  package, _, source = version.partition("+src.")
  assert package and len(source) == 12 and version == tgrad_version()
  (tmp_path / "codegen").mkdir()
  (tmp_path / "nn").mkdir()
  for name in ("ops.py", "codegen/cuda.py", "cache.py", "nn/layers.py"): (tmp_path / name).write_text("x = 1\n")
  before = source_hash(tmp_path)
  (tmp_path / "cache.py").write_text("x = 2\n")         # storage: not code generation
  (tmp_path / "nn/layers.py").write_text("x = 2\n")     # builds graphs, never runs them
  (tmp_path / "notes.txt").write_text("not python\n")
  assert source_hash(tmp_path) == before
  (tmp_path / "codegen/cuda.py").write_text("x = 2\n")
  assert source_hash(tmp_path) != before
