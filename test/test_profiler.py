"""The trace profiler: valid trace-event JSON with host phases, every launch on its device track, memory in use, JIT
capture and replays kernel by kernel, results unchanged; off, it records nothing."""
import json, os, subprocess, sys
import numpy as np
import pytest
import tgrad
from tgrad import Tensor, TinyJit, profiler
from tgrad.viz.trace_format import validate_trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def events(trace: profiler.Trace, **match) -> list[dict]:
  return [e for e in trace.to_json()["traceEvents"] if all(e.get(k) == v for k, v in match.items())]

def test_eager_trace_has_phases_kernels_and_memory(tmp_path):
  rng = np.random.default_rng(0)
  a_np, b_np = rng.standard_normal((37, 19), dtype=np.float32), rng.standard_normal((19,), dtype=np.float32)
  path = tmp_path / "trace.json"
  with tgrad.profile(str(path)) as trace:
    got = ((Tensor(a_np) * Tensor(b_np)).sum(1) + 1).numpy()
  np.testing.assert_allclose(got, (a_np * b_np).sum(1) + 1, rtol=1e-5, atol=1e-5)
  data = json.loads(path.read_text())
  validate_trace(data)
  host = {e["name"] for e in events(trace, pid=profiler.HOST_PID, ph="X")}
  assert {"schedule", "lower", "launch", "synchronize + copy to host"} <= host
  kernels = [e for e in events(trace, ph="X", cat="kernel") if e["tid"] == profiler.KERNEL_TID]
  assert len(kernels) == 1   # mul, sum and add fuse into one reduce kernel
  args = kernels[0]["args"]
  assert args["flops"] > 0 and args["bytes"] >= (37 * 19 + 19 + 37) * 4 and args["GB/s"] > 0
  assert {"global_size", "local_size", "opts", "kernel_id", "out"} <= set(args)
  launch = [e for e in events(trace, name="launch") if e["ts"] <= kernels[0]["ts"]][-1]
  assert launch["ts"] <= kernels[0]["ts"] and kernels[0]["ts"] + kernels[0]["dur"] <= launch["ts"] + launch["dur"]
  copies = [e for e in events(trace, ph="X") if e["tid"] == profiler.COPY_TID and e["pid"] != profiler.HOST_PID]
  assert {e["name"] for e in copies} == {"copyin"} and len(copies) == 2
  memory = events(trace, ph="C", name="memory in use")
  assert memory and max(e["args"]["bytes"] for e in memory) >= (37 * 19 + 19 + 37) * 4
  record = next(iter(trace.kernels.values()))
  assert record.calls == 1 and record.src and record.uops and record.seconds > 0

def test_jit_replays_are_traced_kernel_by_kernel_and_unchanged():
  rng = np.random.default_rng(1)
  inputs = [rng.standard_normal((5, 7), dtype=np.float32) for _ in range(6)]
  def fn(x: Tensor) -> Tensor: return (x.exp() * 2).sum(1) + x.max(1)
  want = [(np.exp(x) * 2).sum(1) + x.max(1) for x in inputs]
  step = TinyJit(fn)
  step(Tensor(inputs[0])).numpy()
  with tgrad.profile() as trace:
    got = [step(Tensor(x)).numpy().copy() for x in inputs[1:4]]   # capture, then two replays
  got += [step(Tensor(x)).numpy().copy() for x in inputs[4:]]       # after the profile: the graph runners again
  for g, w in zip(got, want[1:]): np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
  instructions = len(step.captured.instructions)
  assert len(events(trace, name="JIT capture")) == 1 and len(events(trace, name="JIT replay")) == 3
  replayed = events(trace, ph="X", cat="jit replay")
  assert len(replayed) == 3 * instructions and all(e["dur"] >= 0 for e in replayed)

def test_off_records_nothing_and_profiles_do_not_nest():
  assert not profiler.ENABLED and profiler.current() is None
  (Tensor([1.0, 2.0]) + 1).numpy()
  assert profiler.current() is None
  with tgrad.profile():
    with pytest.raises(RuntimeError, match="nest"):
      with tgrad.profile(): pass
  assert not profiler.ENABLED

def test_profile_environment_variable(tmp_path):
  path = tmp_path / "env_trace.json"
  script = "import numpy as np; from tgrad import Tensor; print((Tensor(np.arange(6.0)) * 2).sum().item())"
  env = {**os.environ, "PROFILE": str(path), "DEVICE": "LLVM", "PYTHONPATH": ROOT}
  done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert "30.0" in done.stdout
  data = json.loads(path.read_text())
  validate_trace(data)
  assert any(e["name"] == "schedule" for e in data["traceEvents"])

@pytest.mark.parametrize("bad, message", [
  ({}, "traceEvents"),
  ({"traceEvents": [{"name": "k", "ph": "X", "pid": 1, "tid": 1, "ts": 0}]}, "dur"),
  ({"traceEvents": [{"name": "k", "ph": "Q", "pid": 1, "tid": 1, "ts": 0}]}, "phase"),
  ({"traceEvents": [{"name": "k", "ph": "X", "pid": "a", "tid": 1, "ts": 0, "dur": 1}]}, "pid"),
  ({"traceEvents": [{"name": "m", "ph": "C", "pid": 1, "ts": 0, "args": {"bytes": "x"}}]}, "counter"),
  ({"traceEvents": [{"name": "k", "ph": "X", "pid": 1, "tid": 1, "ts": float("nan"), "dur": 1}]}, "ts"),
])
def test_validate_trace_rejects(bad, message):
  with pytest.raises(ValueError, match=message): validate_trace(bad)
