"""Fork safety of the runtimes: a parent runs a threaded 512x512 matmul, then a multiprocessing child (fork, forkserver,
spawn) runs the same and must return the right values. Before the LLVM thread pool was reset at fork, a forked child
waited forever on the parent's pool; each case runs in its own Python with a timeout, so a hang fails the test.
On CUDA a child forked after the parent started the driver can't use the GPU: it must get CUDAForkError's message."""
import os, subprocess, sys, textwrap
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD_TIMEOUT_SECONDS = 120        # the child's join; a hang shows up as exit code None
SCRIPT_TIMEOUT_SECONDS = 300       # the whole parent, compile of the matmul kernel included
START_METHODS = ("fork", "forkserver", "spawn")

# The parent script: realize the matmul on DEVICE, start one child with the given method that does the same and
# sends back its maximum error against numpy (or its exception), and print what the child sent.
SCRIPT = textwrap.dedent("""
  import multiprocessing, sys
  import numpy as np
  from tgrad import Tensor
  SIZE = 512

  def matmul_error(device):
    a = np.arange(SIZE * SIZE, dtype=np.float32).reshape(SIZE, SIZE) % 7 - 3
    out = (Tensor(a, device=device) @ Tensor(a.T.copy(), device=device)).numpy()
    return float(np.abs(out - a @ a.T).max())

  def child(device, queue):
    try: queue.put(("ok", matmul_error(device)))
    except Exception as error: queue.put(("error", f"{type(error).__name__}: {error}"))

  if __name__ == "__main__":
    method, parent_device, child_device = sys.argv[1:4]
    assert matmul_error(parent_device) == 0.0
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    process = context.Process(target=child, args=(child_device, queue))
    process.start()
    process.join(float(sys.argv[4]))
    if process.exitcode is None:
      process.kill()
      print("HANG")
      sys.exit(1)
    status, value = queue.get(timeout=10)
    print(status, value)
""")

def _run_parent(tmp_path, method: str, parent_device: str, child_device: str) -> str:
  script = tmp_path / "fork_parent.py"
  script.write_text(SCRIPT)
  env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  result = subprocess.run([sys.executable, str(script), method, parent_device, child_device,
                           str(CHILD_TIMEOUT_SECONDS)], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=SCRIPT_TIMEOUT_SECONDS)
  assert result.returncode == 0, f"parent exited with {result.returncode}: {result.stdout[-1000:]}" \
                                 f"{result.stderr[-2000:]}"
  return result.stdout.strip().splitlines()[-1]

@pytest.mark.parametrize("method", START_METHODS)
def test_llvm_child_after_threaded_parent(tmp_path, method):
  assert _run_parent(tmp_path, method, "LLVM", "LLVM") == "ok 0.0"

@pytest.mark.gpu
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_cuda_child_started_fresh(tmp_path, method):
  assert _run_parent(tmp_path, method, "CUDA", "CUDA") == "ok 0.0"

@pytest.mark.gpu
def test_cuda_forked_child_gets_a_clear_error_and_llvm_still_works(tmp_path):
  line = _run_parent(tmp_path, "fork", "CUDA", "CUDA")
  assert line.startswith("error DeviceUnavailable") and "CUDAForkError" in line and "'spawn'" in line, line
  assert _run_parent(tmp_path, "fork", "CUDA", "LLVM") == "ok 0.0"
