"""The training examples, shortened: a few steps must lower the loss, and the command line must report the
held-out accuracy with the exit status saying whether --min-accuracy was reached."""
import importlib.util, os, subprocess, sys
from pathlib import Path
import numpy as np

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LOSS_WINDOW = 5            # compare the mean of the first and of the last few minibatch losses

def load_example(name: str):
  spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module   # dataclasses look their module up here
  spec.loader.exec_module(module)
  return module

def assert_loss_fell(losses: list[float], factor: float) -> None:
  first, last = np.mean(losses[:LOSS_WINDOW]), np.mean(losses[-LOSS_WINDOW:])
  assert last < factor * first, f"loss went from {first:.3f} to {last:.3f} (needed below {factor} × the start)"

def test_mlp_learns_the_spirals():
  mlp = load_example("train_mlp")
  result = mlp.train(steps=60, seed=1, progress=False)
  assert_loss_fell(result.losses, factor=0.6)
  assert result.test_accuracy > 0.8
  assert mlp.main(["--steps", "2", "--min-accuracy", "1.01"]) == 1   # unreachable target: exit status 1

def test_cnn_learns_the_bars():
  cnn = load_example("train_cnn")
  images, labels = cnn.make_bars(64, np.random.default_rng(0))
  assert images.shape == (64, 1, 16, 16) and set(labels.tolist()) == set(range(cnn.CLASSES))
  result = cnn.train(steps=40, seed=1, progress=False)
  assert_loss_fell(result.losses, factor=0.8)

def test_mlp_command_line():
  run = subprocess.run([sys.executable, str(EXAMPLES / "train_mlp.py"), "--steps", "3", "--seed", "2",
                        "--min-accuracy", "0"], capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr[-2000:]
  assert "held-out accuracy" in run.stdout and "reached" in run.stdout

def test_custom_kernel_example(tmp_path):
  """Registers the fused kernels, profiles both graphs into a temporary database and shows what it chose (on a
  CPU-only machine: the LLVM IR and numpy versions)."""
  env = {**os.environ, "TGRAD_CACHE": str(tmp_path / "cache.db")}
  run = subprocess.run([sys.executable, str(EXAMPLES / "custom_kernel.py"), "--budget", "60", "--new-tokens", "4"],
                       capture_output=True, text=True, timeout=300, env=env)
  assert run.returncode == 0, run.stderr[-2000:]
  assert "profiled 2 graphs" in run.stdout and "0 failed" in run.stdout
  assert "gemma tiny: profiled 2 graphs" in run.stdout and "gemma tiny decode at TOLERANCE" in run.stdout
  assert "user:rms_norm" in run.stdout   # Gemma's graphs hold RMSNorm sites (show lists their paths)
  assert "user:fma_relu=fma_relu:numpy" in run.stdout and "user:rms_norm=rms_norm:numpy" in run.stdout
  assert run.stdout.count("selected at TOLERANCE") >= 2   # show: the database chose a path for each graph
