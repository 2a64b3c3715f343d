"""Execution paths: enumeration (counts against brute force, determinism), measuring (errors against float64),
realize_path, selection at realize time from a database, the profiler (resume), and the canonical graph key."""
import itertools, os, subprocess, sys, time
import numpy as np
import pytest
from tgrad import Tensor, dtypes
from tgrad.helpers import Context
from tgrad.paths import select as path_select
from tgrad.paths.db import PathsDB, Measurement
from tgrad.paths.fingerprint import hardware_fingerprint, tgrad_version
from tgrad.helpers import code_settings
from tgrad.paths.graph import graph_key
from tgrad.paths.path import DEFAULT, PathSpace, errors, iterate, measure, realize_path, reference_outputs, \
  relative_floor
from tgrad.paths.profile import Profiler, watching

SEED = 1234

@pytest.fixture
def db_file(tmp_path, monkeypatch):
  """A fresh database file for the test, and the selection's memory of the real one dropped (before and after)."""
  path = str(tmp_path / "paths.db")
  monkeypatch.setenv("TGRAD_CACHE", path)
  path_select.forget()
  yield path
  path_select.forget()

def _x(shape=(5, 7), scale=2.0, seed=SEED):
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale).realize()

def _brute_force_count(space: PathSpace) -> int:
  """Every assignment of every region's lowerings, made canonical (regions inside a lowered-away ancestor are
  default), deduplicated: what the iterator must yield."""
  seen = set()
  for choices in itertools.product(*space.options):
    seen.add(space._canonical(tuple(choices)))
  return len(seen) * len(space.opts)

@pytest.mark.parametrize("build", [
  lambda x: x.tanh(), lambda x: x.gelu(), lambda x: x.softmax(-1), lambda x: x.tanh() + x.sigmoid(),
  lambda x: (x.exp() + 1).log(), lambda x: x.gelu().softmax(-1), lambda x: x * 2 + 1])
def test_count_matches_brute_force_and_iteration(build):
  space = iterate(build(_x()))
  paths = list(space)
  assert space.count == len(paths) == len({p.id for p in paths}) == _brute_force_count(space)
  assert paths[0].choices == tuple(DEFAULT for _ in space.regions)   # the default path comes first

def test_iteration_is_deterministic():
  first = [p.id for p in iterate(_x().gelu().softmax(-1))]
  second = [p.id for p in iterate(_x().gelu().softmax(-1))]
  assert first == second and len(first) > 1

def test_opts_choices_multiply_the_count():
  space = iterate(_x().tanh(), opts=("heuristic", "beam2"))
  assert space.count == 2 * iterate(_x().tanh()).count
  with pytest.raises(ValueError, match="unknown opts"): iterate(_x().tanh(), opts=("fastest",))

@pytest.mark.parametrize("name,build,ref", [
  ("tanh", lambda x: x.tanh(), np.tanh),
  ("sigmoid", lambda x: x.sigmoid(), lambda a: 1 / (1 + np.exp(-a))),
  ("softmax", lambda x: x.softmax(-1), lambda a: np.exp(a - a.max(-1, keepdims=True)) /
   np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True))])
def test_every_path_realizes_the_right_values(name, build, ref):
  data = np.random.default_rng(SEED).standard_normal((6, 9)).astype(np.float32) * 3
  count = iterate(build(Tensor(data).realize())).count
  for i in range(count):
    out = build(Tensor(data).realize())
    space = iterate(out)
    path = list(space)[i]
    realize_path(path)
    np.testing.assert_allclose(out.numpy(), ref(data.astype(np.float64)), rtol=2e-5, atol=2e-6,
                               err_msg=f"{name} along {path.description}")

def test_measure_leaves_the_graph_unrealized_and_reports_small_errors():
  out = _x().tanh()
  space = iterate(out)
  reference = reference_outputs(space)
  for path in space:
    run = measure(space, path, reference, repeats=2)
    assert not run.error and len(run.times) == 2 and all(t > 0 for t in run.times)
    assert run.max_rel_error < 1e-5 and run.max_abs_error < 1e-5, path.description
  assert out.lazydata.base.buffer is None and all(r.current == DEFAULT for r in space.regions)
  np.testing.assert_allclose(out.numpy(), np.tanh(_x().numpy().astype(np.float64)), rtol=1e-5, atol=1e-6)

def test_reference_is_float64_and_errors_of_float16_are_its_rounding():
  """The reference is the graph's math in float64: every float dtype widened, casts between floats included (a cast
  to float16 inside the graph is a rounding the path makes, so it is part of the path's error)."""
  x32 = _x((64,))
  out = x32.cast(dtypes.float16).tanh()
  space = iterate(out)
  (reference,) = reference_outputs(space)
  want = np.tanh(x32.numpy().astype(np.float64))
  np.testing.assert_allclose(reference, want, rtol=1e-12)
  run = measure(space, next(iter(space)), [reference], repeats=1)
  assert 1e-5 < run.max_rel_error < 2e-3   # float16's rounding, not garbage

def test_errors_relative_floor_and_nan():
  ref = [np.array([1.0, 1e-9, np.nan, np.inf])]
  floor = relative_floor(dtypes.float32)   # √ε of float32: 3.5e-4
  assert floor == pytest.approx(3.45e-4, rel=1e-2) and relative_floor(dtypes.float16) == pytest.approx(3.1e-2, rel=1e-2)
  assert errors([np.array([1.0, 0.0, np.nan, np.inf])], ref) == (pytest.approx(1e-9 / floor), pytest.approx(1e-9))
  assert errors([np.array([1.0, 0.0, np.nan, np.inf])], ref, [0.5]) == (pytest.approx(2e-9), pytest.approx(1e-9))
  rel, _ = errors([np.array([1.1, 1e-9, 0.0, np.inf])], ref)
  assert rel == np.inf   # NaN where the reference has a number (or a number where it has NaN) is an infinite error

def test_assign_targets_are_restored_between_runs():
  state = Tensor.zeros(4).contiguous().realize()
  buffer = state.lazydata.base.buffer
  out = state.assign(state + _x((4,)).tanh())
  space = iterate(out)
  for path in space: assert not measure(space, path, repeats=3).error
  np.testing.assert_array_equal(buffer.copyout(), np.zeros(4, np.float32))
  np.testing.assert_allclose(out.numpy(), np.tanh(_x((4,)).numpy()), rtol=1e-5, atol=1e-6)   # once, after all

def test_graph_key_is_stable_across_processes_and_ignores_input_values():
  code = ("import numpy as np; from tgrad import Tensor; from tgrad.paths.graph import graph_key; "
          "x = Tensor(np.full((3, 5), 0.5, np.float32)).realize(); print(graph_key([x.gelu().softmax(-1).lazydata]))")
  env = {**os.environ, "PYTHONHASHSEED": "7"}
  keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
                         ).stdout.strip() for _ in range(2)}
  here = graph_key([_x((3, 5)).gelu().softmax(-1).lazydata])
  assert keys == {here}
  assert graph_key([_x((3, 6)).gelu().softmax(-1).lazydata]) != here
  assert graph_key([_x((3, 5)).gelu().softmax(0).lazydata]) != here

def _record(db: PathsDB, space: PathSpace, path, seconds: float, rel: float, status="ok", **changes) -> None:
  fields = dict(graph_key=space.key, graph_desc=space.description(), path_id=path.id, path_desc=path.description,
                device=space.device, parts=(space.device,), fingerprint=hardware_fingerprint(space.device),
                tgrad_version=tgrad_version(), settings=code_settings(), times=(seconds, seconds * 1.1),
                max_rel_error=rel, max_abs_error=rel, input_distribution="test", status=status, error="",
                measured_at=0.0, choices=path.choices, opts=path.opts)
  fields.update(changes)
  db.add(Measurement(**fields))

def test_realize_selects_fastest_path_within_tolerance(db_file, capsys):
  data = np.random.default_rng(SEED).standard_normal((4, 8)).astype(np.float32)
  space = iterate(Tensor(data).realize().tanh())
  paths = list(space)
  assert len(paths) >= 3
  db = PathsDB(db_file)
  fast_inexact, slow_exact = paths[1], paths[2]
  _record(db, space, paths[0], 3e-3, 1e-7)
  _record(db, space, fast_inexact, 1e-3, 5e-3)
  _record(db, space, slow_exact, 2e-3, 1e-7)
  path_select.forget()
  for tolerance, want in ((1e-2, fast_inexact), (1e-5, slow_exact), (1e-9, None)):
    out = Tensor(data).realize().tanh()
    with Context(TOLERANCE=tolerance, DEBUG=2): result = out.realize().numpy()
    np.testing.assert_allclose(result, np.tanh(data), rtol=1e-5, atol=1e-6)
    printed = capsys.readouterr().out
    regions = iterate(Tensor(data).realize().tanh()).regions   # a fresh graph, only to count regions
    chosen = want.choices if want is not None else tuple(DEFAULT for _ in regions)
    for i, lowering in enumerate(chosen): assert f"#{i} " in printed and f"→ {lowering}" in printed
    assert ("guess" in printed) == (want is None)

def test_failed_and_foreign_records_are_never_selected(db_file):
  data = np.random.default_rng(SEED).standard_normal((4, 8)).astype(np.float32)
  space = iterate(Tensor(data).realize().tanh())
  paths = list(space)
  db = PathsDB(db_file)
  _record(db, space, paths[1], 1e-6, 1e-7, status="failed")
  _record(db, space, paths[2], 1e-6, 1e-7, fingerprint={"gpu": "another machine"})
  _record(db, space, paths[0], 1e-3, 1e-7)
  path_select.forget()
  selection, choices, _ = path_select.choose(space, 1e-2)
  assert choices == paths[0].choices, selection.reason

def test_profiler_records_and_resumes(db_file):
  def program():
    x = Tensor(np.linspace(-3, 3, 40, dtype=np.float32).reshape(5, 8)).realize()
    return x.gelu().numpy()
  first = Profiler(PathsDB(db_file), budget=120, max_paths=100, repeats=1, progress=False)
  with watching(first): got = program()
  # gelu's erf form is another function than the tanh approximation asked for (~1e-1 relative in the tails here):
  # beyond float32's sanity bound, so that path is recorded as failed; every other path is verified
  assert first.measured > 1 and first.skipped == 0 and first.failed == 1
  second = Profiler(PathsDB(db_file), budget=120, max_paths=100, repeats=1, progress=False)
  with watching(second): again = program()
  assert second.measured == 0 and second.skipped == first.measured
  np.testing.assert_array_equal(got, again)
  runs = PathsDB(db_file).runs(next(iter(first.graphs_seen)))
  assert len(runs) == first.measured
  for run in runs:
    if "gelu=erf" in run.path_desc: assert run.status == "failed" and "sanity bound" in run.error
    else: assert run.status == "ok" and run.max_rel_error < 1e-4, run.path_desc

def test_profiler_measures_only_the_named_composites(db_file):
  """`composites`: the uniform paths that lower only those composites (and the all-default path), then it stops — a
  graph of many regions (each alternative a factor of the space) is not searched for more matches."""
  x = Tensor(np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)).realize()
  program = (x.gelu() * x.tanh()).softmax(-1) + sum((x * (i + 1)).exp() for i in range(12))   # 10^10+ paths
  profiler = Profiler(PathsDB(db_file), budget=120, max_paths=64, repeats=1, progress=False, composites=["softmax"])
  start = time.monotonic()
  with watching(profiler): program.numpy()
  runs = PathsDB(db_file).runs(next(iter(profiler.graphs_seen)))
  described = sorted(run.path_desc.split(";")[0] for run in runs)
  assert described == ["all default", "softmax=numpy", "softmax=online", "softmax=three_kernels"], described
  assert time.monotonic() - start < 60

def test_cli_show_and_best(db_file):
  x = Tensor(np.linspace(-2, 2, 12, dtype=np.float32)).realize()
  profiler = Profiler(PathsDB(db_file), budget=60, max_paths=4, repeats=1, progress=False)
  with watching(profiler): x.tanh().numpy()
  from tgrad.paths.__main__ import main
  env_out = subprocess.run([sys.executable, "-m", "tgrad.paths", "show"], capture_output=True, text=True,
                           env={**os.environ, "TGRAD_CACHE": db_file}, check=True).stdout
  assert "selected at TOLERANCE" in env_out and env_out.count("\n") >= 1 + profiler.measured
  assert main(["best", "--tolerance", "1e-2"]) == 0
  assert main(["best"]) == 0   # each graph at its dtype's default tolerance

def _paths_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "tgrad.paths", *args], capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))},
                        cwd=cwd)

@pytest.mark.parametrize("args, message", [
  (["best", "--tolerance", "-1"], "argument --tolerance: must be a finite number >= 0, got -1"),
  (["best", "--tolerance", "nan"], "argument --tolerance: must be a finite number >= 0, got nan"),
  (["profile", "--budget", "-5", "x.py"], "argument --budget: must be a finite number > 0, got -5"),
  (["profile", "--repeats", "0", "x.py"], "argument --repeats: must be a finite number >= 1, got 0"),
  (["profile", "--max-paths", "-1", "x.py"], "argument --max-paths: must be a finite number >= 1, got -1"),
  (["profile", "--repeats", "2.5", "x.py"], "argument --repeats: '2.5' is not an int"),
  (["profile", "no_such_script.py"], "profile: script 'no_such_script.py': no such file")])
def test_cli_bad_arguments_are_one_error_line(db_file, tmp_path, args, message):
  result = _paths_cli(*args, cwd=tmp_path)
  assert result.returncode == 2 and result.stderr.strip() == f"error: {message}" and result.stdout == ""

def test_cli_profile_exits_with_the_programs_status(db_file, tmp_path):
  script = tmp_path / "exits.py"
  script.write_text("import sys\nprint('ran', sys.argv[1:])\nsys.exit(int(sys.argv[1]))\n")
  for status in (3, 0):
    result = _paths_cli("profile", "--budget", "5", str(script), str(status))
    assert result.returncode == status and f"ran ['{status}']" in result.stdout, result.stderr[-2000:]

@pytest.mark.parametrize("argument, value", [("budget", 0), ("max_paths", 0), ("repeats", -1)])
def test_profiler_rejects_bad_limits(db_file, argument, value):
  with pytest.raises(ValueError, match=rf"Profiler: {argument} must be"):
    Profiler(PathsDB(db_file), progress=False, **{argument: value})
