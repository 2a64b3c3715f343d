"""The LLVM device's host memory: big buffers in 2 MiB-aligned mappings advised into huge pages, small ones from
numpy, freed blocks kept for reuse within their caps, and values that survive every path (seeded random sizes against
numpy)."""
import os
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.runtime.llvm import runtime
from tgrad.runtime.llvm.runtime import (BUFFER_ALIGNMENT, HUGE_PAGE_BYTES, HUGE_PAGE_MIN_BYTES, LLVMAllocator)

def _fill(allocator: LLVMAllocator, handle, nbytes: int, seed: int) -> np.ndarray:
  data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
  allocator.copyin(handle, memoryview(data))
  return data

def _read(allocator: LLVMAllocator, handle, nbytes: int) -> np.ndarray:
  out = np.empty(nbytes, dtype=np.uint8)
  allocator.copyout(memoryview(out), handle)
  return out

@pytest.mark.skipif(not runtime.HUGE_PAGES, reason="this platform's mmap has no MADV_HUGEPAGE")
@pytest.mark.parametrize("nbytes", [HUGE_PAGE_MIN_BYTES, HUGE_PAGE_MIN_BYTES + 4097, 3 * HUGE_PAGE_BYTES + 64])
def test_big_buffer_is_huge_page_aligned_and_holds_its_bytes(nbytes):
  allocator = LLVMAllocator()
  handle = allocator.alloc(nbytes)
  assert handle.address % HUGE_PAGE_BYTES == 0 and handle.array.nbytes == nbytes
  assert handle.array.ctypes.data == handle.address and handle.array.flags.writeable
  data = _fill(allocator, handle, nbytes, nbytes)
  np.testing.assert_array_equal(_read(allocator, handle, nbytes), data)

def test_small_buffer_is_cache_line_aligned():
  allocator = LLVMAllocator()
  for nbytes in (1, 63, 4096, HUGE_PAGE_MIN_BYTES - 1):
    handle = allocator.alloc(nbytes)
    assert handle.address % BUFFER_ALIGNMENT == 0 and handle.array.nbytes == nbytes

@pytest.mark.skipif(not runtime.HUGE_PAGES, reason="this platform's mmap has no MADV_HUGEPAGE")
def test_freed_huge_blocks_are_reused_within_their_cap(monkeypatch):
  """Kept by size up to the cap; past it the blocks of the size freed least recently go first (a program whose sizes
  change keeps its newest), and a block bigger than the cap is not kept."""
  monkeypatch.setattr(runtime, "HUGE_POOL_MAX_BYTES", 2 * HUGE_PAGE_MIN_BYTES)
  allocator = LLVMAllocator()
  a, b, c = (allocator.alloc(HUGE_PAGE_MIN_BYTES) for _ in range(3))
  for handle in (a, b, c): allocator.free(handle, HUGE_PAGE_MIN_BYTES)
  assert allocator.huge_pooled_bytes == 2 * HUGE_PAGE_MIN_BYTES   # a, the oldest, went back
  again = {allocator.alloc(HUGE_PAGE_MIN_BYTES).address for _ in range(2)}
  assert again == {b.address, c.address} and allocator.huge_pooled_bytes == 0 and not allocator.huge_pool
  assert allocator.alloc(HUGE_PAGE_MIN_BYTES).address not in again   # the pool is empty: a fresh mapping
  bigger = HUGE_PAGE_MIN_BYTES + HUGE_PAGE_BYTES
  old, new = allocator.alloc(HUGE_PAGE_MIN_BYTES), allocator.alloc(bigger)
  allocator.free(old, HUGE_PAGE_MIN_BYTES)
  allocator.free(new, bigger)   # over the cap with both: the older size's block goes
  assert list(allocator.huge_pool) == [bigger] and allocator.huge_pooled_bytes == bigger
  allocator.free(allocator.alloc(3 * HUGE_PAGE_MIN_BYTES), 3 * HUGE_PAGE_MIN_BYTES)   # bigger than the cap
  assert list(allocator.huge_pool) == [bigger]
  allocator.drop_huge_pool()
  assert allocator.huge_pooled_bytes == 0 and not allocator.huge_pool

def test_failed_mapping_drops_the_kept_blocks_and_tries_again(monkeypatch):
  if not runtime.HUGE_PAGES: pytest.skip("this platform's mmap has no MADV_HUGEPAGE")
  allocator = LLVMAllocator()
  allocator.free(allocator.alloc(2 * HUGE_PAGE_MIN_BYTES), 2 * HUGE_PAGE_MIN_BYTES)
  assert allocator.huge_pooled_bytes == 2 * HUGE_PAGE_MIN_BYTES
  real, calls = runtime.huge_page_bytes, []
  def failing_once(nbytes):
    calls.append(nbytes)
    if len(calls) == 1: raise MemoryError(f"no {nbytes} bytes")
    return real(nbytes)
  monkeypatch.setattr(runtime, "huge_page_bytes", failing_once)
  handle = allocator.alloc(HUGE_PAGE_MIN_BYTES)
  assert calls == [HUGE_PAGE_MIN_BYTES] * 2 and allocator.huge_pooled_bytes == 0 and handle.array.nbytes == \
    HUGE_PAGE_MIN_BYTES

def test_a_mapping_that_fails_twice_is_the_devices_out_of_memory_error(monkeypatch):
  from tgrad.device import OutOfMemoryError
  if not runtime.HUGE_PAGES: pytest.skip("this platform's mmap has no MADV_HUGEPAGE")
  def failing(nbytes): raise OSError(12, "Cannot allocate memory")
  monkeypatch.setattr(runtime, "huge_page_bytes", failing)
  with pytest.raises(OutOfMemoryError, match=f"LLVM: an allocation needs {4 * HUGE_PAGE_MIN_BYTES} bytes"):
    LLVMAllocator().alloc(4 * HUGE_PAGE_MIN_BYTES)

def test_random_sizes_alloc_free_reuse_against_numpy():
  """Seeded: buffers of sizes around both thresholds allocated, written, freed and reallocated in random order; every
  live buffer keeps exactly its bytes (no pooled block is handed out twice)."""
  rng = np.random.default_rng(26)
  allocator = LLVMAllocator()
  sizes = [1, 100, 1 << 20, (1 << 20) + 1, HUGE_PAGE_MIN_BYTES - 8, HUGE_PAGE_MIN_BYTES, HUGE_PAGE_MIN_BYTES + 12345]
  live: list[tuple] = []
  for step in range(120):
    if live and rng.random() < 0.45:
      handle, nbytes, data = live.pop(int(rng.integers(len(live))))
      np.testing.assert_array_equal(_read(allocator, handle, nbytes), data, err_msg=f"step {step}, {nbytes} bytes")
      allocator.free(handle, nbytes)
    else:
      nbytes = sizes[int(rng.integers(len(sizes)))]
      handle = allocator.alloc(nbytes)
      live.append((handle, nbytes, _fill(allocator, handle, nbytes, step)))
    assert allocator.huge_pooled_bytes <= runtime.HUGE_POOL_MAX_BYTES
    assert allocator.huge_pooled_bytes == sum(n * len(blocks) for n, blocks in allocator.huge_pool.items())
  addresses = [h.address for h, _, _ in live]
  assert len(set(addresses)) == len(addresses)
  for handle, nbytes, data in live: np.testing.assert_array_equal(_read(allocator, handle, nbytes), data)

def test_views_of_a_huge_buffer():
  allocator = LLVMAllocator()
  nbytes = HUGE_PAGE_MIN_BYTES + 1000
  handle = allocator.alloc(nbytes)
  data = _fill(allocator, handle, nbytes, 7)
  view = allocator.view(handle, 999, 5000)
  assert view.address == handle.address + 999
  np.testing.assert_array_equal(_read(allocator, view, 5000), data[999:5999])

@pytest.mark.parametrize("shape", [(HUGE_PAGE_MIN_BYTES // 4,), (1031, 1029), (3, 700_001)])
def test_ops_on_big_buffers_match_numpy(shape):
  """Values through huge-page buffers: an elementwise op, a sum and a reduce along each axis."""
  rng = np.random.default_rng(len(shape))
  a, b = rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(shape, dtype=np.float32)
  ta, tb = Tensor(a), Tensor(b)
  np.testing.assert_allclose((ta * tb + 1).relu().numpy(), np.maximum(a * b + 1, 0), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(ta.sum().numpy(), a.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)
  for axis in range(len(shape)):
    np.testing.assert_allclose(ta.sum(axis=axis).numpy(), a.astype(np.float64).sum(axis=axis), rtol=1e-4, atol=1e-3)

def _mapping_of(address: int) -> tuple[str, list[str]]:
  """The permissions and VmFlags of the mapping of this process that holds `address` (Linux /proc/self/smaps)."""
  perms, inside = "", False
  with open("/proc/self/smaps") as smaps:
    for line in smaps:
      head = line.split()
      if "-" in head[0] and len(head) >= 5 and all(c in "0123456789abcdef-" for c in head[0]):
        low, high = (int(part, 16) for part in head[0].split("-"))
        inside, perms = low <= address < high, head[1]
      elif inside and line.startswith("VmFlags:"): return perms, head[1:]
  raise AssertionError(f"no mapping holds {address:#x}")

@pytest.mark.skipif(not runtime.HUGE_PAGES or not os.path.exists("/proc/self/smaps"), reason="Linux only")
def test_big_buffer_mapping_is_private_and_advised_huge():
  """Shared anonymous memory is shmem, which the kernel never backs with transparent huge pages: the mapping must be
  private, and carry the huge-page advice (VmFlags `hg`), whether or not this machine's THP setting then uses it."""
  handle = LLVMAllocator().alloc(2 * HUGE_PAGE_BYTES)
  perms, flags = _mapping_of(handle.address)
  assert perms.endswith("p") and "hg" in flags, (perms, flags)
