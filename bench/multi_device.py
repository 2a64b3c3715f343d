"""Data-parallel training on a device set: samples/s of a jitted MLP and CNN training step on one device and on all of
them, next to the same models trained with torch DDP (torch.distributed, NCCL, one process per GPU), in one run.

  python bench/multi_device.py                                   # CUDA,CUDA:1; MLP and CNN; torch too
  python bench/multi_device.py --devices LLVM:0,LLVM:1 --hidden 256 --batch 512 --skip-torch --steps 5
  python bench/multi_device.py --models mlp --steps 10 --profile   # and where each GPU's step time goes

First the largest error of a few sharded ops against numpy (elementwise, reduces and a matmul over the split axis, a
column-parallel matmul). Then, per model, tgrad's step (batch split on axis 0 over the devices, weights replicated,
SGD; the gradients' all-reduces are collective steps: NCCL on CUDA, captured into each GPU's CUDA graph) is timed on
the first device alone and on every device, and torch's on one GPU and with DistributedDataParallel on every GPU (a
spawned process each; the CNN's BatchNorm is SyncBatchNorm there, as tgrad's batch statistics over a split batch are
the whole batch's). Times are GPU time between CUDA events recorded on every GPU before and after --steps replays,
the slowest GPU's span (host clock on CPU devices). float32 everywhere, no TF32 on either side. The weights after
tgrad's steps on all devices are compared with one device's.

--profile (bench/step_profile.py), after the timing, for tgrad on one device and on all: per device the graph step,
its kernels' summed time (one replay instruction by instruction, CUDA events around each), the collectives (NCCL's
LibraryCollective or the CopyCollective fallback) with their transfer time, the waits at collectives that the
program's order makes (a rendezvous model from those times), the gaps left over, the graph runs and CUDA graph
launches per step, the host steps between them, how long the host takes to queue a step and how often it waits.

Sizes (defaults, chosen so the step is compute-bound: the gradient all-reduce is a few percent of it):
  MLP  --features 1024 → --hidden 4096 → --hidden → --classes 1024, global batch --batch 8192 (25.2 M parameters,
       1.2 TFLOP per step);
  CNN  3×32×32 images, conv 3→--channels 64 (3×3) → BatchNorm → relu → maxpool → conv 64→128 → relu → maxpool →
       linear → 10 classes, global batch --cnn-batch 1024.
"""
from __future__ import annotations
import argparse, json, os, socket, sys, tempfile, time
from pathlib import Path
from typing import Callable, Optional
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tgrad import Tensor, TinyJit  # noqa: E402
from tgrad.backend import device_kind  # noqa: E402
from tgrad.device import Device  # noqa: E402
import tgrad.nn as nn  # noqa: E402
from tgrad.nn.optim import SGD  # noqa: E402
from tgrad.nn.state import get_parameters  # noqa: E402
from step_profile import report_lines, step_profile  # noqa: E402

WARMUP_STEPS = 3       # the first call runs, the second captures, the third replays
DATA_BATCHES = 2       # distinct input batches cycled through (the JIT swaps argument buffers)
LEARNING_RATE = 0.01
IMAGE_SIZE, IMAGE_CHANNELS, CNN_CLASSES = 32, 3, 10

def check_ops(devices: tuple[str, ...]) -> float:
  rng = np.random.default_rng(0)
  a, w = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 48)).astype(np.float32)
  x_rows, x_cols = Tensor(a).shard(devices, 0), Tensor(a).shard(devices, 1)
  errors = [np.abs((x_rows * 2 + 1).numpy() - (a * 2 + 1)).max(),
            np.abs(x_cols.sum(1).numpy() - a.sum(1)).max() / np.abs(a).sum(1).max(),
            np.abs(x_rows.sum(0).numpy() - a.sum(0)).max() / np.abs(a).sum(0).max(),
            np.abs((x_cols @ Tensor(w).shard(devices, 0)).numpy() - a @ w).max() / np.abs(a @ w).max()]
  if 48 % len(devices) == 0:
    errors.append(np.abs((Tensor(a).shard(devices) @ Tensor(w).shard(devices, 1)).numpy() - a @ w).max() /
                  np.abs(a @ w).max())
  return float(max(errors))

# ---- the models, in tgrad

class MLP:
  def __init__(self, features: int, hidden: int, classes: int):
    self.layers = [nn.Linear(features, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, classes)]
  def __call__(self, x: Tensor) -> Tensor:
    for layer in self.layers[:-1]: x = layer(x).relu()
    return self.layers[-1](x)

class CNN:
  def __init__(self, channels: int):
    self.conv1, self.norm1 = nn.Conv2d(IMAGE_CHANNELS, channels, 3, padding=1), nn.BatchNorm2d(channels)
    self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
    self.head = nn.Linear(2 * channels * (IMAGE_SIZE // 4) ** 2, CNN_CLASSES)
  def __call__(self, x: Tensor) -> Tensor:
    x = self.norm1(self.conv1(x)).relu().max_pool2d(2)
    return self.head(self.conv2(x).relu().max_pool2d(2).flatten(1))

def batches(model: str, args: argparse.Namespace) -> list[tuple[np.ndarray, np.ndarray]]:
  rng = np.random.default_rng(1)
  if model == "mlp":
    return [(rng.standard_normal((args.batch, args.features)).astype(np.float32),
             rng.integers(0, args.classes, args.batch).astype(np.int32)) for _ in range(DATA_BATCHES)]
  shape = (args.cnn_batch, IMAGE_CHANNELS, IMAGE_SIZE, IMAGE_SIZE)
  return [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, CNN_CLASSES, args.cnn_batch).astype(np.int32))
          for _ in range(DATA_BATCHES)]

def device_seconds(devices: tuple[str, ...], queue: Callable[[], None]) -> tuple[list[float], float]:
  """Seconds from before to after what `queue()` queues on each device (CUDA events on every GPU; the host clock
  around queue() and a synchronize on other devices), and the host's seconds inside queue()."""
  if any(device_kind(d) != "CUDA" for d in devices):
    start = time.perf_counter()
    queue()
    queued = time.perf_counter() - start
    for d in devices: Device[d].synchronize()
    return [time.perf_counter() - start] * len(devices), queued
  import pycuda.driver as cuda
  gpus = [Device[d] for d in devices]
  def on(gpu, fn):
    gpu.context.enter()
    try: return fn()
    finally: gpu.context.leave()
  starts, ends = [on(g, cuda.Event) for g in gpus], [on(g, cuda.Event) for g in gpus]
  for gpu, event in zip(gpus, starts): on(gpu, event.record)
  start = time.perf_counter()
  queue()
  queued = time.perf_counter() - start
  for gpu, event in zip(gpus, ends): on(gpu, event.record)
  for gpu, event in zip(gpus, ends): on(gpu, event.synchronize)
  return [on(g, lambda s=s, e=e: s.time_till(e)) * 1e-3 for g, s, e in zip(gpus, starts, ends)], queued

def train_tgrad(model: str, devices: tuple[str, ...], args: argparse.Namespace
                ) -> tuple[float, list[np.ndarray], Optional[dict]]:
  """Seconds per step after warm-up (the slowest device's), the weights after every step, and with --profile the
  step's profile (step_profile: after the weights are read, as it runs one more step)."""
  Tensor.manual_seed(0)
  net = MLP(args.features, args.hidden, args.classes) if model == "mlp" else CNN(args.channels)
  params = get_parameters(net)
  for p in params: p.shard_(devices) if len(devices) > 1 else p.to_(devices[0])
  opt = SGD(params, lr=LEARNING_RATE)
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = net(x).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize(loss, *opt.schedule_step())
    return loss
  def place(data: np.ndarray) -> Tensor:
    t = Tensor(data, device=devices[0])
    return t.shard(devices, 0).realize() if len(devices) > 1 else t.realize()
  placed = [(place(x), place(y)) for x, y in batches(model, args)]
  def queue() -> None:
    for i in range(args.steps): step(*placed[i % DATA_BATCHES])
  with Tensor.train():
    for i in range(WARMUP_STEPS): step(*placed[i % DATA_BATCHES])
    for d in devices: Device[d].synchronize()
    waits = HostWaits(devices)
    spans, queued = device_seconds(devices, lambda: waits.around(queue))
    weights = [p.numpy() for p in params]
    profile = None
    if args.profile:
      profiles, whole = step_profile(step.captured, {d: span / args.steps for d, span in zip(devices, spans)})
      profile = {"devices": profiles, "lines": report_lines(profiles, whole, queued / args.steps,
                                                            waits.count / args.steps),
                 "model_step": whole["model_step"], "misaligned": whole["misaligned"]}
  return max(spans) / args.steps, weights, profile

class HostWaits:
  """Counts the host's waits for a device (Device.synchronize) while `around(fn)` runs fn."""
  def __init__(self, devices: tuple[str, ...]):
    self.devices, self.count = devices, 0
  def around(self, fn: Callable[[], None]) -> None:
    def counted(original: Callable[[], None]) -> Callable[[], None]:
      def wait() -> None:
        self.count += 1
        original()
      return wait
    started = [Device[d] for d in self.devices]
    for device in started: device.synchronize = counted(device.synchronize)
    try: fn()
    finally:
      for device in started: del device.synchronize   # the class's method again

# ---- the same models in torch, one process per GPU

def _torch_model(model: str, args: argparse.Namespace, world: int):
  import torch.nn as tnn
  if model == "mlp":
    return tnn.Sequential(tnn.Linear(args.features, args.hidden), tnn.ReLU(), tnn.Linear(args.hidden, args.hidden),
                          tnn.ReLU(), tnn.Linear(args.hidden, args.classes))
  c = args.channels
  net = tnn.Sequential(tnn.Conv2d(IMAGE_CHANNELS, c, 3, padding=1), tnn.BatchNorm2d(c), tnn.ReLU(), tnn.MaxPool2d(2),
                       tnn.Conv2d(c, 2 * c, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2), tnn.Flatten(),
                       tnn.Linear(2 * c * (IMAGE_SIZE // 4) ** 2, CNN_CLASSES))
  return tnn.SyncBatchNorm.convert_sync_batchnorm(net) if world > 1 else net

def _torch_worker(rank: int, world: int, port: int, model: str, args: argparse.Namespace, out_path: str) -> None:
  import torch
  import torch.distributed as dist
  import torch.nn.functional as F
  from torch.nn.parallel import DistributedDataParallel
  torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False   # float32, as tgrad's
  torch.cuda.set_device(rank)
  if world > 1:
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
  torch.manual_seed(0)
  net = _torch_model(model, args, world).cuda()
  if world > 1: net = DistributedDataParallel(net, device_ids=[rank])
  opt = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
  x, y = batches(model, args)[0]
  local = len(x) // world
  x = torch.from_numpy(x[rank * local:(rank + 1) * local]).cuda()
  y = torch.from_numpy(y[rank * local:(rank + 1) * local]).long().cuda()
  net.train()
  def step():
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(net(x), y).backward()
    opt.step()
  for _ in range(WARMUP_STEPS): step()
  torch.cuda.synchronize()
  if world > 1: dist.barrier()
  start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  start.record()
  for _ in range(args.steps): step()
  end.record()
  end.synchronize()
  seconds = torch.tensor([start.elapsed_time(end) * 1e-3 / args.steps], device="cuda")
  if world > 1:
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)   # the slowest rank's span
    dist.destroy_process_group()
  if rank == 0:
    with open(out_path, "w") as f: json.dump(float(seconds.item()), f)

def train_torch(model: str, world: int, args: argparse.Namespace) -> float:
  import torch.multiprocessing as mp
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "seconds.json")
    mp.spawn(_torch_worker, args=(world, port, model, args, path), nprocs=world, join=True)
    with open(path) as f: return json.load(f)

# ---- the report

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", default="CUDA,CUDA:1", help="e.g. CUDA,CUDA:1 or LLVM:0,LLVM:1")
  parser.add_argument("--models", default="mlp,cnn")
  parser.add_argument("--steps", type=int, default=20, help="timed steps after the warm-up")
  parser.add_argument("--features", type=int, default=1024)
  parser.add_argument("--hidden", type=int, default=4096)
  parser.add_argument("--classes", type=int, default=1024)
  parser.add_argument("--batch", type=int, default=8192, help="the MLP's global batch (split over the devices)")
  parser.add_argument("--channels", type=int, default=64)
  parser.add_argument("--cnn-batch", type=int, default=1024, help="the CNN's global batch")
  parser.add_argument("--skip-torch", action="store_true")
  parser.add_argument("--profile", action="store_true",
                      help="after the timing, where each device's step time goes (bench/step_profile.py)")
  parser.add_argument("--out", default=None, help="write the numbers as JSON here")
  args = parser.parse_args()
  devices = tuple(d.strip() for d in args.devices.split(","))
  models = [m.strip() for m in args.models.split(",")]
  torch_seconds: dict[str, dict[int, float]] = {}
  if not args.skip_torch:   # before tgrad starts CUDA here: each run is processes of its own
    for model in models: torch_seconds[model] = {world: train_torch(model, world, args) for world in (1, len(devices))}
  print(f"sharded ops on {devices}: largest relative error vs numpy {check_ops(devices):.2e}")
  report = {"devices": list(devices), "args": vars(args), "models": {}}
  for model in models:
    batch = args.batch if model == "mlp" else args.cnn_batch
    one_seconds, one_weights, one_profile = train_tgrad(model, devices[:1], args)
    all_seconds, all_weights, all_profile = train_tgrad(model, devices, args)
    difference = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(all_weights, one_weights))
    row = {"batch": batch, "tgrad_1_samples_s": batch / one_seconds, "tgrad_n_samples_s": batch / all_seconds,
           "tgrad_speedup": one_seconds / all_seconds, "weight_difference": difference}
    size = (f"{args.features}-{args.hidden}-{args.hidden}-{args.classes}" if model == "mlp" else
            f"{IMAGE_CHANNELS}x{IMAGE_SIZE}x{IMAGE_SIZE} conv {args.channels}/{2 * args.channels}")
    print(f"{model.upper()} {size}, global batch {batch}, {args.steps} steps (GPU time per step):")
    print(f"  tgrad  1 device  {batch / one_seconds:12,.0f} samples/s ({one_seconds * 1e3:8.2f} ms)")
    print(f"  tgrad  {len(devices)} devices {batch / all_seconds:12,.0f} samples/s ({all_seconds * 1e3:8.2f} ms)  "
          f"{one_seconds / all_seconds:.2f}x; largest relative weight difference vs 1 device {difference:.1e}")
    if model in torch_seconds:
      one, many = torch_seconds[model][1], torch_seconds[model][len(devices)]
      row.update(torch_1_samples_s=batch / one, torch_n_samples_s=batch / many, torch_speedup=one / many,
                 tgrad_n_over_torch_n=many / all_seconds)
      print(f"  torch  1 GPU     {batch / one:12,.0f} samples/s ({one * 1e3:8.2f} ms)")
      print(f"  torch  DDP {len(devices)} GPUs {batch / many:10,.0f} samples/s ({many * 1e3:8.2f} ms)  "
            f"{one / many:.2f}x;"
            f" tgrad/torch on {len(devices)}: {many / all_seconds:.2f}")
    if one_profile is not None and all_profile is not None:
      for label, profile in (("1 device", one_profile), (f"{len(devices)} devices", all_profile)):
        print(f"  profile of tgrad's step on {label}, ms per step (graph step = kernels + transfer + waits + gaps; "
              "waits from the rendezvous model):")
        print("\n".join(profile["lines"]))
      one_kernels = one_profile["devices"][0].kernel_seconds
      shares = ", ".join(f"{p.device} {p.kernel_seconds / (one_kernels / len(devices)):.2f}"
                         for p in all_profile["devices"])
      print(f"  each device's kernels / (one device's kernels / {len(devices)}): {shares}")
      row["profile"] = {label: {"model_step": profile["model_step"], "misaligned": profile["misaligned"],
                                "devices": [{"device": p.device, "graph_step": p.graph_step, "kernels": p.kernels,
                                             "kernel_seconds": p.kernel_seconds, "collectives": p.collectives,
                                             "transfer_seconds": p.transfer_seconds, "wait_seconds": p.wait_seconds,
                                             "gap_seconds": p.gap_seconds, "runs": p.runs,
                                             "graph_launches": p.graph_launches, "host_steps": p.host_steps}
                                            for p in profile["devices"]]}
                        for label, profile in (("one", one_profile), ("all", all_profile))}
    report["models"][model] = row
  if args.out:
    with open(args.out, "w") as f: json.dump(report, f, indent=1)
    print(f"wrote {args.out}")

if __name__ == "__main__":
  main()
