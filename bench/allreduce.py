"""GPU benchmark: all-reduce (sum, float32, in place) bus bandwidth between the GPUs of one host, tgrad's NCCL path
(tgrad/runtime/cuda/nccl.py, one process driving every GPU) next to torch.distributed with NCCL (one process per GPU,
as torch runs it), 1 KiB … 1 GiB.

Per size: the mean time of one all-reduce over ITERATIONS back-to-back calls, between CUDA events recorded on every
GPU's stream before and after (the slowest GPU's span counts). tgrad is timed two ways: `eager` (each call queued from
Python: one ncclGroupStart/End over the GPUs) and `graph` (GRAPH_BATCH calls captured once into one CUDA graph per GPU
and replayed: what a jitted step pays, without Python per call). torch: `dist.all_reduce` in a spawned process per GPU.
Bus bandwidth is NCCL's: algbw = bytes / time, busbw = algbw · 2(n−1)/n (nccl-tests' PERFORMANCE.md), so it compares
with the link's speed whatever n is. The small-message latency is the time at the smallest size.
Usage: python bench/allreduce.py [--gpus 2] [--max-bytes 1073741824] [--out allreduce.json] [--skip-torch]
NCCL_NVLS_ENABLE=0 is kept (NVLink multicast off) for both.
"""
from __future__ import annotations
import argparse, json, os, socket, sys, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

MIN_BYTES, MAX_BYTES, SIZE_STEP = 1 << 10, 1 << 30, 4   # 1 KiB, 4 KiB, … 1 GiB
GRAPH_BATCH = 20        # all-reduces captured into one graph
WARMUP = 5
BYTES_PER_SIZE_RUN = 8 << 30   # iterations per size: about this many bytes reduced, between the two bounds below
MIN_ITERATIONS, MAX_ITERATIONS = 2 * GRAPH_BATCH, 50 * GRAPH_BATCH
FLOAT32_BYTES = 4

def sizes(max_bytes: int) -> list[int]:
  out, size = [], MIN_BYTES
  while size <= max_bytes:
    out.append(size)
    size *= SIZE_STEP
  return out

def iterations(nbytes: int) -> int:
  wanted = BYTES_PER_SIZE_RUN // nbytes
  return max(MIN_ITERATIONS, min(MAX_ITERATIONS, wanted // GRAPH_BATCH * GRAPH_BATCH))

def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> float:
  """GB/s on the bus: algbw · 2(n−1)/n."""
  return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9

# ---- tgrad: one process, every GPU

def tgrad_times(gpus: int, all_sizes: list[int]) -> dict[int, dict[str, float]]:
  import pycuda.driver as cuda
  from tgrad.dtype import dtypes
  from tgrad.runtime.cuda.nccl import NCCLCollectives
  from tgrad.runtime.cuda.runtime import create_device
  devices = [create_device(i) for i in range(gpus)]
  collectives = NCCLCollectives(devices)
  def on(device, fn):
    device.context.enter()
    try: return fn()
    finally: device.context.leave()
  def timed(queue, calls: int) -> float:
    """Seconds per call: `queue()` queues `calls` all-reduces; events on every GPU around it, the slowest span."""
    starts = [on(d, cuda.Event) for d in devices]
    ends = [on(d, cuda.Event) for d in devices]
    for device, event in zip(devices, starts): on(device, event.record)
    queue()
    for device, event in zip(devices, ends): on(device, event.record)
    for device, event in zip(devices, ends): on(device, event.synchronize)
    return max(on(d, lambda s=s, e=e: s.time_till(e)) for d, s, e in zip(devices, starts, ends)) * 1e-3 / calls
  results = {}
  for nbytes in all_sizes:
    count = nbytes // FLOAT32_BYTES
    buffers = [on(d, lambda: cuda.mem_alloc(nbytes)) for d in devices]
    for device, buffer in zip(devices, buffers): on(device, lambda b=buffer: cuda.memset_d32(b, 0, count))
    handles = [int(b) for b in buffers]
    def one(streams=None): collectives.all_reduce(handles, "sum", dtypes.float32, count, streams=streams)
    calls = iterations(nbytes)
    for _ in range(WARMUP): one()
    eager = timed(lambda: [one() for _ in range(calls)], calls)
    captured = collectives.capture(lambda streams: [one(streams) for _ in range(GRAPH_BATCH)])
    captured.launch()   # instantiate and warm up
    graph = timed(lambda: [captured.launch() for _ in range(calls // GRAPH_BATCH)], calls // GRAPH_BATCH * GRAPH_BATCH)
    captured.close()
    for device in devices: device.synchronize()
    del buffers
    results[nbytes] = {"eager_s": eager, "graph_s": graph}
    print(f"tgrad {nbytes:>12d} B  eager {eager * 1e6:9.1f} us  graph {graph * 1e6:9.1f} us", flush=True)
  return results

# ---- torch.distributed: one process per GPU

def _torch_worker(rank: int, gpus: int, port: int, all_sizes: list[int], out_path: str) -> None:
  import torch
  import torch.distributed as dist
  torch.cuda.set_device(rank)
  dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=gpus,
                          device_id=torch.device("cuda", rank))
  results = {}
  for nbytes in all_sizes:
    x = torch.zeros(nbytes // FLOAT32_BYTES, dtype=torch.float32, device="cuda")
    for _ in range(WARMUP): dist.all_reduce(x)
    calls = iterations(nbytes)
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls): dist.all_reduce(x)
    end.record()
    end.synchronize()
    seconds = torch.tensor([start.elapsed_time(end) * 1e-3 / calls], device="cuda")
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)   # the slowest rank's span
    results[nbytes] = float(seconds.item())
    if rank == 0: print(f"torch {nbytes:>12d} B  {results[nbytes] * 1e6:9.1f} us", flush=True)
    del x
  if rank == 0:
    with open(out_path, "w") as f: json.dump({str(k): v for k, v in results.items()}, f)
  dist.destroy_process_group()

def torch_times(gpus: int, all_sizes: list[int]) -> dict[int, float]:
  import torch.multiprocessing as mp
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "torch.json")
    mp.spawn(_torch_worker, args=(gpus, port, all_sizes, path), nprocs=gpus, join=True)
    with open(path) as f: return {int(k): v for k, v in json.load(f).items()}

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--gpus", type=int, default=2)
  parser.add_argument("--max-bytes", type=int, default=MAX_BYTES)
  parser.add_argument("--out", default="allreduce.json")
  parser.add_argument("--skip-torch", action="store_true")
  args = parser.parse_args()
  os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
  all_sizes = sizes(args.max_bytes)
  torch_results = {} if args.skip_torch else torch_times(args.gpus, all_sizes)   # before CUDA starts here
  tgrad_results = tgrad_times(args.gpus, all_sizes)
  from tgrad.runtime.cuda.nccl import nccl
  rows = []
  print(f"\nall-reduce sum float32 on {args.gpus} GPUs (NCCL {'.'.join(map(str, nccl().version))}); "
        "time per call (us) and bus bandwidth (GB/s)")
  print(f"{'bytes':>12} {'tgrad eager':>12} {'busbw':>7} {'tgrad graph':>12} {'busbw':>7} {'torch':>10} {'busbw':>7} "
        f"{'graph/torch':>11}")
  for nbytes in all_sizes:
    eager, graph = tgrad_results[nbytes]["eager_s"], tgrad_results[nbytes]["graph_s"]
    reference = torch_results.get(nbytes)
    row = {"bytes": nbytes, "tgrad_eager_us": eager * 1e6,
           "tgrad_eager_busbw_gbs": bus_bandwidth(nbytes, eager, args.gpus), "tgrad_graph_us": graph * 1e6,
           "tgrad_graph_busbw_gbs": bus_bandwidth(nbytes, graph, args.gpus)}
    if reference is not None:
      row.update(torch_us=reference * 1e6, torch_busbw_gbs=bus_bandwidth(nbytes, reference, args.gpus),
                 graph_over_torch_busbw=reference / graph)
    rows.append(row)
    torch_text = f"{row['torch_us']:>10.1f} {row['torch_busbw_gbs']:>7.1f} {row['graph_over_torch_busbw']:>11.2f}" \
      if reference is not None else f"{'-':>10} {'-':>7} {'-':>11}"
    print(f"{nbytes:>12d} {row['tgrad_eager_us']:>12.1f} {row['tgrad_eager_busbw_gbs']:>7.1f} "
          f"{row['tgrad_graph_us']:>12.1f} {row['tgrad_graph_busbw_gbs']:>7.1f} {torch_text}")
  small = rows[0]
  print(f"\nsmall-message latency ({small['bytes']} B): tgrad eager {small['tgrad_eager_us']:.1f} us, graph "
        f"{small['tgrad_graph_us']:.1f} us" + (f", torch {small['torch_us']:.1f} us" if "torch_us" in small else ""))
  with open(args.out, "w") as f:
    json.dump({"gpus": args.gpus, "nccl_version": list(nccl().version), "dtype": "float32", "op": "sum",
               "rows": rows}, f, indent=1)
  print(f"wrote {args.out}")

if __name__ == "__main__":
  main()
