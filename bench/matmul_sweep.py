"""Matmul opt sweep: time explicit opt lists for the 4096² matmul kernel on CUDA, each checked against torch.

Builds the matmul's kernel AST (fp32, and fp16 inputs summed in fp32 for tensor cores), applies each opt list, and
times the bare kernel with CUDA events (best of KERNEL_RUNS) against torch's kernel time from its profiler (no
dispatch or launch overhead on either side). Before its first run each opt list's output is poisoned (NaN bytes),
and that run's result is checked element by element against torch: an opt list that leaves elements unwritten or
wrong is marked WRONG and never counts as a winner. fp32 lists are register tiles (rows × columns per
thread), threads per block (rows × columns) and a K unroll, with the columns either contiguous per thread or split
into float4 groups a warp apart; fp16 lists are tensor-core tiles per warp, warps per block and K unrolls. Opt lists
that don't apply or compile are skipped; the best few are retried with the grid's block order swapped (SWAP).
Usage: python bench/matmul_sweep.py [--size 4096] [--only fp32|fp16] [--match TEXT] [--dry]
(--match: only opt lists whose label contains TEXT; --dry: apply and render, no GPU)
"""
from __future__ import annotations
import argparse, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gpu import error_ratio, poison, torch_kernel_time  # noqa: E402
from tgrad import Tensor  # noqa: E402
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps  # noqa: E402
from tgrad.codegen.heuristics import hand_coded_optimizations  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402

KERNEL_RUNS = 10
SWAP_RETRIES = 3        # the best this many opt lists are timed again with SWAP(0, 1) (blockIdx.x on the rows)
# per-element tolerance against torch, (rtol, atol per √K): |got - ref| <= atol·√K + rtol·|ref|. Both sides sum K
# products of random normals in float32 in different orders: a sequential float32 sum of K such terms is off by
# ~6e-8·K/2.45 (1e-4 at K = 4096), so near-zero sums need an absolute margin (search.FLOAT_ATOL's float32 value);
# fp16: exact products on both sides, rounded to half by tgrad (rtol: 1 ulp of half)
TOLERANCE = {"fp32": (1e-4, 2e-4), "fp16": (2e-3, 2e-4)}

def _opt(op: str, axis: int, amount: int) -> Opt:
  return Opt(OptOps.TC, 0, 0) if op == "TC" else Opt(OptOps[op], axis, amount)

def fp32_opts(tile_rows: int, tile_columns: int, threads_rows: int, threads_columns: int, unroll: int,
              split_columns: bool, stage: tuple[int, ...] = ()) -> list[Opt]:
  """Axis 0 = rows, 1 = columns, reduce axis 0 = K. split_columns: each thread's columns are float4 groups that are
  threads_columns·4 apart (UPCAST 4, LOCAL, then UPCAST the rest), so every warp access is coalesced. stage: the
  padding of A's and B's shared-memory tiles (SMEM), empty for none."""
  inner_columns = 4 if split_columns else tile_columns
  spec = [("UPCAST", 1, inner_columns), ("UPCAST", 0, tile_rows)]
  if unroll > 1: spec.append(("UNROLL", 0, unroll))
  spec += [("LOCAL", 0, threads_rows), ("LOCAL", 1, threads_columns)]
  if split_columns and tile_columns > 4: spec.append(("UPCAST", 1, tile_columns // 4))
  spec += [("SMEM", operand, padding) for operand, padding in enumerate(stage)]
  return [_opt(*s) for s in spec]

def fp32_candidates() -> dict[str, list[Opt]]:
  grid = [(8, 8, 8, 8, 4, False, ())]   # the best without shared memory (the default before SMEM)
  for threads in [(16, 16), (8, 16), (16, 8), (8, 8), (8, 32), (32, 8)]:
    for unroll in (4, 8):
      for stage in [(0, 0), (4, 0)]: grid.append((8, 8, *threads, unroll, True, stage))
  for stage in [(4, 4), (8, 0)]: grid.append((8, 8, 16, 16, 8, True, stage))
  grid += [(8, 8, 16, 16, 8, False, (4, 0)), (8, 8, 8, 16, 8, False, (4, 0))]
  for threads in [(16, 16), (32, 8), (16, 32)]:
    for unroll in (4, 8): grid.append((8, 4, *threads, unroll, False, (4, 0)))
  for threads in [(16, 16), (8, 32), (32, 16)]:
    for unroll in (4, 8): grid.append((4, 8, *threads, unroll, True, (4, 0)))
  grid += [(4, 4, 16, 16, 8, False, (4, 0)), (4, 4, 32, 32, 8, False, (4, 0))]
  return {f"tile {r}x{c} threads {tr}x{tc} unroll {u}{' split' if s else ''}{f' smem {st}' if st else ''}":
          fp32_opts(r, c, tr, tc, u, s, st) for r, c, tr, tc, u, s, st in grid}

def fp16_candidates() -> dict[str, list[Opt]]:
  """Spread = column tiles upcast before TC (a lane's columns adjacent); rows = row tiles per warp after TC."""
  def tc(spread: int, rows: int, warps: tuple[int, int] = (1, 1), unroll: int = 1, columns_after: int = 1,
         stage: tuple[int, ...] = ()):
    spec = ([("UPCAST", 1, spread)] if spread > 1 else []) + [("TC", 0, 0)]
    if rows > 1: spec.append(("UPCAST", 0, rows))
    if columns_after > 1: spec.append(("UPCAST", 1, columns_after))
    if warps[0] > 1: spec.append(("LOCAL", 0, warps[0]))
    if warps[1] > 1: spec.append(("LOCAL", 1, warps[1]))
    if unroll > 1: spec.append(("UNROLL", 0, unroll))
    spec += [("SMEM", operand, padding) for operand, padding in enumerate(stage)]
    return [_opt(*s) for s in spec]
  grid = {
    "spread 8 rows 4 (default)": tc(8, 4), "spread 8 rows 4 unroll 2": tc(8, 4, unroll=2),
    "spread 8 rows 4 unroll 4": tc(8, 4, unroll=4), "spread 8 rows 2": tc(8, 2),
    "spread 8 rows 2 unroll 2": tc(8, 2, unroll=2), "spread 8 rows 2 unroll 4": tc(8, 2, unroll=4),
    "spread 4 rows 4": tc(4, 4), "spread 4 rows 4 unroll 2": tc(4, 4, unroll=2),
    "spread 4 rows 8 unroll 2": tc(4, 8, unroll=2), "spread 16 rows 2": tc(16, 2),
    "spread 16 rows 2 unroll 2": tc(16, 2, unroll=2),
    "spread 8 rows 4 warps 2x1 unroll 2": tc(8, 4, (2, 1), 2),
    "spread 8 rows 4 warps 1x2 unroll 2": tc(8, 4, (1, 2), 2),
    "spread 8 rows 4 warps 2x2 unroll 2": tc(8, 4, (2, 2), 2),
    "spread 8 rows 2 warps 2x2 unroll 2": tc(8, 2, (2, 2), 2),
    "spread 8 rows 2 warps 4x1 unroll 2": tc(8, 2, (4, 1), 2),
    "spread 4 rows 4 warps 2x2 unroll 2": tc(4, 4, (2, 2), 2),
    "spread 4 rows 4 cols 2 unroll 2": tc(4, 4, columns_after=2, unroll=2),
    "spread 8 rows 4 warps 4x1": tc(8, 4, (4, 1)),
  }
  for warps in [(1, 1), (2, 1), (2, 2), (4, 2), (2, 4), (4, 1)]:
    for unroll in (1, 2):
      for stage in [(0, 0), (8, 8), (0, 8)]:
        grid[f"spread 8 rows 4 warps {warps[0]}x{warps[1]} unroll {unroll} smem {stage}"] = tc(8, 4, warps, unroll,
                                                                                             stage=stage)
  # no spread: B's column tiles are contiguous, so fragments come from the tiles with ldmatrix
  for rows, columns in [(4, 4), (4, 2), (2, 4), (4, 8), (8, 2)]:
    for warps in [(2, 2), (4, 2), (2, 4), (1, 1), (4, 1)]:
      for unroll in (1, 2, 4):
        for stage in [(8, 8)] if (warps, unroll) != ((2, 2), 2) else [(8, 8), (0, 0), (16, 8)]:
          grid[f"ldmatrix rows {rows} cols {columns} warps {warps[0]}x{warps[1]} unroll {unroll} smem {stage}"] = \
            tc(1, rows, warps, unroll, columns, stage)
  for rows, columns in [(4, 8), (8, 4), (4, 4), (8, 8)]:   # bigger K steps and tiles: dynamic shared memory
    for warps in [(2, 2), (4, 2), (2, 4), (4, 4)]:
      for unroll in (2, 4):
        label = f"ldmatrix rows {rows} cols {columns} warps {warps[0]}x{warps[1]} unroll {unroll} smem (8, 8)"
        grid.setdefault(label, tc(1, rows, warps, unroll, columns, (8, 8)))
  for stage in [(0, 0), (8, 8)]:
    grid[f"spread 8 rows 2 warps 2x2 unroll 2 smem {stage}"] = tc(8, 2, (2, 2), 2, stage=stage)
    grid[f"spread 4 rows 4 warps 2x2 unroll 2 smem {stage}"] = tc(4, 4, (2, 2), 2, stage=stage)
    grid[f"spread 4 rows 4 warps 4x2 unroll 2 smem {stage}"] = tc(4, 4, (4, 2), 2, stage=stage)
  return grid

def matmul_ast(n: int, half: bool, device: str):
  rng = np.random.default_rng(0)
  a_np, b_np = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
  if half: a_np, b_np = a_np.astype(np.float16), b_np.astype(np.float16)
  a, b = Tensor(a_np, device=device).realize(), Tensor(b_np, device=device).realize()
  (item,) = [i for i in create_schedule([(a @ b).lazydata]) if i.ast.op is Ops.SINK]
  return item, a_np, b_np

def build(ast, renderer, opts: list[Opt] | None) -> Kernel:
  kernel = Kernel(ast, renderer)
  if opts is None: hand_coded_optimizations(kernel)
  else:
    for opt in opts: kernel.apply_opt(opt)
  return kernel

def sweep(kind: str, n: int, dry: bool, match: str = "") -> None:
  half = kind == "fp16"
  candidates = {label: opts for label, opts in (fp16_candidates() if half else fp32_candidates()).items()
                if match in label}
  flops = 2 * n ** 3
  if dry:
    from tgrad.runtime.cuda.renderer import CUDARenderer
    from tgrad.codegen.linearizer import linearize
    item, _, _ = matmul_ast(n, half, "LLVM")
    for label, opts in candidates.items():
      start = time.perf_counter()
      try:
        kernel = build(item.ast, CUDARenderer(), opts)
        source = kernel.renderer.render("k", linearize(kernel))
        print(f"  {label:44s} ok, {len(source)} chars in {time.perf_counter() - start:.2f} s", flush=True)
      except KernelOptError as error: print(f"  {label:44s} refused: {error}", flush=True)
    return
  import torch
  from tgrad.device import Buffer, Device
  from tgrad.realize import compile_kernel
  torch.backends.cuda.matmul.allow_tf32 = False
  item, a_np, b_np = matmul_ast(n, half, "CUDA")
  ta, tb = torch.from_numpy(a_np).cuda(), torch.from_numpy(b_np).cuda()
  best_torch = torch_kernel_time(lambda: ta @ tb, KERNEL_RUNS)
  ref = (ta.float() @ tb.float()).cpu().numpy()
  rtol, atol = TOLERANCE[kind][0], TOLERANCE[kind][1] * np.sqrt(n)
  out = Buffer("CUDA", item.outputs[0].size, item.outputs[0].dtype)
  buffers = [out] + list(item.inputs)
  print(f"{kind} {n}x{n}: torch kernel {best_torch * 1e6:.0f} us = {flops / best_torch / 1e12:.1f} TFLOP/s "
        f"(profiler); tgrad kernels below from CUDA events; err = worst |got - ref| / tolerance (≤ 1 passes)",
        flush=True)

  def time_opts(label: str, opts: list[Opt] | None):
    start = time.perf_counter()
    try:
      kernel = build(item.ast, Device["CUDA"].renderer, opts)
      runner = compile_kernel("CUDA", kernel, "sweep")
      poison(out)   # the last opt list's correct result must not stand in for elements this one never writes
      runner(buffers, wait=True)
      got = out.copyout().reshape(n, n)
      seconds = min(runner(buffers, wait=True) for _ in range(KERNEL_RUNS))
    except Exception as error:   # an opt list that doesn't apply, render or compile must not end the sweep
      print(f"  {label:44s} skipped: {type(error).__name__}: {str(error)[:100]}", flush=True)
      return None
    if half: got = got.view(np.float16)
    err = error_ratio(got, ref, rtol, atol)
    row = (label, seconds, err, kernel.applied_opts)
    print(f"  {label:44s} {seconds * 1e6:8.0f} us {flops / seconds / 1e12:6.1f} TFLOP/s  err {err:.2f}  "
          f"(built in {time.perf_counter() - start:.1f} s)", flush=True)
    return row

  rows = [r for r in [time_opts("default heuristics", None)] if r]
  for label, opts in candidates.items():
    if (row := time_opts(label, opts)): rows.append(row)
  good = sorted((r for r in rows if r[2] <= 1), key=lambda r: r[1])
  for label, _, _, opts in good[:SWAP_RETRIES]:
    if (row := time_opts(label + " + SWAP", list(opts) + [Opt(OptOps.SWAP, 0, 1)])): rows.append(row)
  print(f"\n{kind} sorted, kernel times (torch {flops / best_torch / 1e12:.1f} TFLOP/s):")
  for label, seconds, err, opts in sorted(rows, key=lambda r: r[1]):
    bad = "" if err <= 1 else "  WRONG"
    print(f"  {flops / seconds / 1e12:6.1f} TFLOP/s {best_torch / seconds:5.2f}x torch  err {err:.2f}{bad}  {label}  "
          f"{[(o.op.name, o.axis, o.amount) for o in opts]}", flush=True)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--size", type=int, default=4096)
  parser.add_argument("--only", choices=["fp32", "fp16"])
  parser.add_argument("--match", default="")
  parser.add_argument("--dry", action="store_true")
  args = parser.parse_args()
  for kind in ["fp32", "fp16"]:
    if args.only in (None, kind): sweep(kind, args.size, args.dry, args.match)

if __name__ == "__main__":
  main()
