"""What authentication and eviction cost the disk cache (tgrad/cache.py): microseconds per get_binary hit of a ~10 KB
and a ~1 MB binary with the HMAC check and with it skipped, and milliseconds per put that evicts.

Run: python bench/cache_verify.py (uses a temporary cache file and secret).
"""
import os, statistics, tempfile, time
from tgrad.helpers import Context

SIZES = {"10 KB": 10 * 1024, "1 MB": 1024 * 1024}
GETS = 2000        # hits timed per size and mode
ROUNDS = 5         # the median of this many rounds is reported
EVICT_BINARIES = 2000   # binaries of EVICT_SIZE in the cache before the evicting puts
EVICT_SIZE = 10 * 1024
PUTS = 50          # puts timed past the bound (evicting) and under it

def per_get_us(cache, src: str, rounds: int = ROUNDS) -> float:
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(GETS): cache.get_binary(src, "bench")
    times.append((time.perf_counter() - start) / GETS * 1e6)
  return statistics.median(times)

def main() -> None:
  folder = tempfile.mkdtemp(prefix="tgrad-cache-bench-")
  os.environ["TGRAD_CACHE"], os.environ["TGRAD_CACHE_SECRET"] = f"{folder}/cache.db", f"{folder}/secret"
  from tgrad.cache import get_cache
  cache = get_cache()
  for name, size in SIZES.items():
    cache.put_binary(name, "bench", os.urandom(size))
    checked = per_get_us(cache, name)
    verified = cache._verified
    cache._verified = lambda mac, table, *values: True   # the same get without the HMAC
    unchecked = per_get_us(cache, name)
    cache._verified = verified
    print(f"get_binary {name:>6}: {checked:8.1f} us with the check, {unchecked:8.1f} us without "
          f"(+{checked - unchecked:.1f} us per hit)")
  bound = EVICT_BINARIES * EVICT_SIZE
  with Context(CACHE_MAX_BYTES=bound):
    for i in range(EVICT_BINARIES): cache.put_binary(f"fill {i}", "bench", os.urandom(EVICT_SIZE))
    start = time.perf_counter()
    for i in range(PUTS): cache.put_binary(f"over {i}", "bench", os.urandom(EVICT_SIZE))
    per_put = (time.perf_counter() - start) / PUTS * 1e3
    print(f"{PUTS} puts into a full cache of {EVICT_BINARIES} x {EVICT_SIZE // 1024} KB: {per_put:.2f} ms each, "
          f"{cache.evicted} evicted in all (an eviction takes the total to 90% of the bound)")
  with Context(CACHE_MAX_BYTES=1 << 40):
    start = time.perf_counter()
    for i in range(PUTS): cache.put_binary(f"plain {i}", "bench", os.urandom(EVICT_SIZE))
    print(f"{PUTS} puts under the bound: {(time.perf_counter() - start) / PUTS * 1e3:.2f} ms each")

if __name__ == "__main__":
  main()
