"""The CUDA-on-CPU emulator (test/cuda_on_cpu.py) itself: a block's threads are fibers resumed forward, then backward,
between barriers, so a kernel that reads another thread's shared-memory write without the barrier between them gets
an old value whichever of the two threads writes; with the barrier it gets the right one."""
import numpy as np
import pytest
from cuda_on_cpu import cpu_available, run_on_cpu

THREADS, STEPS = 64, 2
KERNEL = r"""
extern "C" __global__ void neighbour(float* out) {
  __shared__ float row[64];
  for (int step = 0; step < 2; step++) {
    row[threadIdx.x] = (float)(threadIdx.x + 100 * step);
    BARRIER
    // the thread before's value (not the last thread's read: it is the one that goes on from the barrier at once)
    out[step * 64 + threadIdx.x] = threadIdx.x > 0 && threadIdx.x < 63 ? row[threadIdx.x - 1] : -1.0f;
    __syncthreads();
  }
}
"""

def neighbours(barrier: bool) -> np.ndarray:
  out = np.zeros(THREADS * STEPS, np.float32)
  run_on_cpu(KERNEL.replace("BARRIER", "__syncthreads();" if barrier else ""), "neighbour", (1,), (THREADS,), [out], [])
  return out.reshape(STEPS, THREADS)

@pytest.mark.skipif(not cpu_available(), reason="needs g++")
def test_a_missing_barrier_shows_whichever_thread_writes():
  threads = np.arange(THREADS)
  reads = (threads > 0) & (threads < THREADS - 1)
  want = np.where(reads, threads - 1, -1)[None, :] + 100 * np.arange(STEPS)[:, None] * reads
  np.testing.assert_array_equal(neighbours(barrier=True), want)
  # the thread before writes first when threads run forward: only the backward step can show the race
  assert not np.array_equal(neighbours(barrier=False), want)
