"""Run a rendered CUDA kernel on the CPU, without a GPU: a test helper for what only a GPU could otherwise check (the
values of kernels with thread blocks, shared memory and barriers: GROUP combines, guarded LOCAL and GROUP splits;
tensor-core kernels).

The CUDA C source is compiled as C++20 by g++ with a small header that stands in for the CUDA built-ins: each thread
of a block is a fiber (ucontext) on one OS thread, switched only where it waits (threadIdx is switched with it: a
barrier costs no OS context switches) and resumed in turn forward, then backward (a missing barrier shows whichever
thread of the pair writes), `__shared__` arrays are static (one copy, and the blocks run one after another),
`__syncthreads()` is a barrier of the block's threads, float2/float4/ushort4/... are plain structs. Render float32
kernels for sm_75 (CPU_ARCH: no inline PTX). Half, bfloat16 and tensor-core kernels render for sm_80
(TENSOR_CORE_ARCH) with a few PTX instructions, which `emulable` rewrites into calls of C++ stand-ins written
from the PTX ISA's definitions (not from the renderer's tables, so they check them): cvt between f16 and f32/f64
(_Float16, round to nearest even; the paired f16x2/bf16x2 forms), `__byte_perm`, `__funnelshift_r`, max.NaN.f32, and
mma.sync m16n8k16 (f16, bf16) and m16n8k8 (tf32) with f32 accumulators. An mma is a warp's: each lane puts its A and B
registers in a block-wide exchange, the block waits at its barrier, each lane computes its own C elements from its
warp's registers, and waits again (so every thread of the block must reach each mma, as the tensor-core kernels' uniform
loops do); `ldmatrix.x4[.trans]`, `__shfl_xor_sync` and `__shfl_sync` (of any value up to 8 bytes, moved whole) are
warp exchanges the same way, and `ex2.approx` is exp2 (the flash-attention kernel uses them); `__syncwarp` a barrier
of the warp's threads, `atomicAdd` on an unsigned
int and `__threadfence` are the host's atomics, `__ldcg` a plain load (flash decoding's last-block combine). A dependent
launch's `griddepcontrol.wait` / `launch_dependents` are no-ops (one grid runs at a time), and `prefetch.global.L2`
reads its byte and records its address: run_on_cpu returns the addresses, for checking what an sm_90 kernel prefetches
against the buffers it reads.
Staged kernels of the renderer (its cp.async.ca copies) don't run. The warpgroup-MMA kernel (runtime/cuda/wgmma.py,
sm_90a) does: its dynamic shared array becomes
a static one of the size its module global names; `cp.async` is an immediate 16-byte copy with its zero fill (so the
commit/wait counts are not checked, but which stage buffer each copy lands in is: a copy into a buffer still being
read corrupts the result); proxy fences, wgmma fences, commits and waits are no-ops; `wgmma.mma_async` is each
thread's own accumulators summed from the shared-memory operands its descriptors address, read through the 128-byte
swizzle (PTX ISA "Matrix Descriptor Format", the canonical K-major and MN-major layouts, and "Matrix Fragments for
wgmma.mma_async.m64nNk16"), all written here from the ISA, not from wgmma.py; a TF32 wgmma (m64nNk8) reads 4-byte
K-major elements and keeps only their TF32 bits (the hardware's truncation: rounding is the kernel's job).
A thread block cluster (a kernel with `__cluster_dims__(n, 1, 1)`, flash decoding's combine) runs its n blocks at
once: the fibers are the cluster's threads, every shared array has a copy a block (`mapa.u64` maps an address to
another block's copy), `barrier.cluster.arrive` is a barrier of all of them (its `wait` a no-op), and when all threads
of a block have returned its shared copies become NaN bytes, so a block that leaves while another still reads its
shared memory shows.
`run_on_cpu(source, name, global_size, local_size, buffers, variables)` launches it once; the buffers are numpy
arrays, written in place.
"""
from __future__ import annotations
import ctypes, hashlib, os, re, shutil, subprocess, tempfile
import numpy as np

CPU_ARCH = "sm_75"   # the arch to render for: its kernels use no inline PTX for float32
TENSOR_CORE_ARCH = "sm_80"   # the oldest arch with the tensor cores the renderer uses (mma.sync, emulated)
COMPILER = shutil.which("g++")

HEADER = r"""
#include <map>
#include <set>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ucontext.h>
#include <vector>
using std::sqrt; using std::exp2; using std::log2; using std::sin;
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }   // CUDA's: within 2 ulp of this
struct Dim3 { unsigned int x = 0, y = 0, z = 0; };
static Dim3 threadIdx, blockIdx;                      // the running thread's (the launcher switches them with it)
// The threads of a block are fibers on one OS thread, switched only where one waits (a barrier, an mbarrier's
// try_wait): the launcher's loop resumes each thread that may go on, in order, until all have finished.
struct EmuFiber { ucontext_t context; Dim3 thread, block; unsigned char* shared_base = nullptr; unsigned int id = 0;
                  unsigned int rank = 0; const void* waiting = nullptr; unsigned long long wait_phase = 0;
                  bool done = false; };
static ucontext_t emu_scheduler;
static EmuFiber* emu_current = nullptr;
static inline void emu_switch_out() { swapcontext(&emu_current->context, &emu_scheduler); }
// a barrier of `count` threads: each waits until the last one arrives (who goes on at once)
struct EmuSync {
  unsigned int count, arrived = 0;
  unsigned long long phase = 0;
  explicit EmuSync(unsigned int count) : count(count) {}
  void arrive_and_wait() {
    if (++arrived == count) { arrived = 0; phase++; return; }
    emu_current->waiting = this;
    emu_current->wait_phase = phase;
    emu_switch_out();
  }
  bool released(unsigned long long waited) const { return phase != waited; }
};
static inline void emu_yield() { emu_current->waiting = nullptr; emu_switch_out(); }   // runnable again at once
static EmuSync* block_barrier = nullptr;     // the running thread's block's
static EmuSync* emu_cluster_sync = nullptr;  // every thread of the cluster's blocks (the block's own without clusters)
static unsigned int emu_rank = 0;            // the running thread's block in its cluster
#define __cluster_dims__(...)
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __grid_constant__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __syncthreads() block_barrier->arrive_and_wait()
#define __syncwarp() emu_warp_barrier()
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long u) { double f; std::memcpy(&f, &u, 8); return f; }
struct ushort2 { unsigned short x, y; };
struct ushort4 { unsigned short x, y, z, w; };
struct uint1 { unsigned int x; };
struct uint2 { unsigned int x, y; };
struct uint4 { unsigned int x, y, z, w; };
static inline ushort2 make_ushort2(unsigned short x, unsigned short y) { return {x, y}; }
static inline ushort4 make_ushort4(unsigned short x, unsigned short y, unsigned short z, unsigned short w) {
  return {x, y, z, w};
}
struct uchar4 { unsigned char x, y, z, w; };
struct char4 { signed char x, y, z, w; };
static inline uint1 make_uint1(unsigned int x) { return {x}; }
static inline uint2 make_uint2(unsigned int x, unsigned int y) { return {x, y}; }
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return {x, y, z, w}; }

// ---- PTX stand-ins (see the module docstring)
static inline float emu_f16_to_f32(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
static inline unsigned short emu_bits(_Float16 x) { unsigned short h; std::memcpy(&h, &x, 2); return h; }
static inline unsigned short emu_f32_to_f16(float f) { return emu_bits((_Float16)f); }   // round to nearest even
static inline unsigned short emu_f64_to_f16(double d) { return emu_bits((_Float16)d); }
static inline unsigned int emu_pack_f16x2(float high, float low) {   // cvt.rn.f16x2.f32 d, a, b: a to d's upper half
  return ((unsigned int)emu_f32_to_f16(high) << 16) | emu_f32_to_f16(low);
}
// __funnelshift_r(lo, hi, shift): the 64 bits hi:lo shifted right by shift mod 32, their low 32 bits
static inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift) {
  return (unsigned int)((((unsigned long long)hi << 32) | lo) >> (shift & 31));
}
// __byte_perm(x, y, s): byte i of the result is byte (s >> 4i) & 7 of the 8 bytes y:x (x the low four)
static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
  const unsigned long long bytes = ((unsigned long long)y << 32) | x;
  unsigned int result = 0;
  for (int i = 0; i < 4; i++) result |= (unsigned int)((bytes >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return result;
}
static inline float emu_bf16_to_f32(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
static inline float emu_max_nan(float a, float b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }
static unsigned int emu_thread;          // the running thread's linear id in its cluster (in its block without one)
static const unsigned int EMU_MAX_THREADS = 8 * 1024;   // a cluster of 8 blocks of 1,024 threads
// __syncwarp: a barrier of the thread's warp (its 32 threads must all reach it), one per warp of the block, made when
// first reached and kept (a launch's blocks and later launches reuse it)
static std::map<unsigned int, EmuSync*> emu_warp_barriers;
static inline void emu_warp_barrier() {
  EmuSync*& made = emu_warp_barriers[emu_thread / 32];
  if (made == nullptr) made = new EmuSync(32);
  made->arrive_and_wait();
}
static unsigned int emu_registers[EMU_MAX_THREADS][6];           // each thread's A (4) and B (2) registers at an mma
static inline float emu_half_of(unsigned int reg, int k, bool bf16) {   // element k % 2 of a packed pair
  unsigned short bits = (unsigned short)(reg >> (16 * (k % 2)));
  return bf16 ? emu_bf16_to_f32(bits) : emu_f16_to_f32(bits);
}
// The warp's mma: each lane stores its A (4) and B (2) registers, and after a barrier computes its 4 C elements from
// the warp's registers (sums in double). PTX ISA "Matrix Fragments for mma.m16n8k16 / m16n8k8", groupID = lane >> 2,
// threadID_in_group = lane % 4; with K the step's depth and P the elements per register (2 for f16/bf16 pairs, 1 for
// tf32): A[row][k] is lane (row % 8)·4 + (k % (K/2))/P, register (row >= 8) + 2·(k >= K/2); B[k][col] is lane col·4 +
// (k % (K/2))/P, register k >= K/2; within a register, element k % P. C[row][col]: lane (row % 8)·4 + col/2, element
// 2·(row >= 8) + col % 2. m16n8k16 (f16, bf16): K 16, P 2; m16n8k8 (tf32): K 8, P 1, and the core reads the TF32 part
// of each float (its low 13 bits dropped).
enum EmuMmaInput { EMU_F16, EMU_BF16, EMU_TF32 };
static inline float emu_mma_element(unsigned int reg, int k, EmuMmaInput input) {
  if (input == EMU_TF32) return __uint_as_float(reg & 0xFFFFE000u);
  return emu_half_of(reg, k, input == EMU_BF16);
}
static void emu_mma(float& d0, float& d1, float& d2, float& d3, unsigned int a0, unsigned int a1, unsigned int a2,
                    unsigned int a3, unsigned int b0, unsigned int b1, EmuMmaInput input) {
  unsigned int* mine = emu_registers[emu_thread];
  mine[0] = a0; mine[1] = a1; mine[2] = a2; mine[3] = a3; mine[4] = b0; mine[5] = b1;
  block_barrier->arrive_and_wait();
  const int depth = input == EMU_TF32 ? 8 : 16, per_register = input == EMU_TF32 ? 1 : 2, half = depth / 2;
  unsigned int warp = emu_thread & ~31u, lane = emu_thread & 31u;
  float* d[4] = {&d0, &d1, &d2, &d3};
  for (int e = 0; e < 4; e++) {
    int row = (int)(lane >> 2) + 8 * (e >= 2), col = 2 * (int)(lane & 3) + e % 2;
    double sum = 0;
    for (int k = 0; k < depth; k++) {
      unsigned int* a = emu_registers[warp + (row % 8) * 4 + (k % half) / per_register];
      unsigned int* b = emu_registers[warp + col * 4 + (k % half) / per_register];
      sum += (double)emu_mma_element(a[(row >= 8) + 2 * (k >= half)], k, input) *
             emu_mma_element(b[4 + (k >= half)], k, input);
    }
    *d[e] = (float)(sum + (double)*d[e]);
  }
  block_barrier->arrive_and_wait();
}
// prefetch.global.L2 (a hint: no value changes) records the address, and reads its byte as the GPU's L2 would fetch it
static std::set<unsigned long long> emu_prefetched;
static inline void emu_prefetch(unsigned long long address) {
  (void)*(volatile const unsigned char*)address;
  emu_prefetched.insert(address);
}
// with no `out`: how many there are; else the addresses into `out`, then forget them
extern "C" long long emu_take_prefetched(unsigned long long* out, long long capacity) {
  if (out == nullptr) return (long long)emu_prefetched.size();
  long long count = 0;
  for (unsigned long long address : emu_prefetched) if (count < capacity) out[count++] = address;
  long long total = (long long)emu_prefetched.size();
  emu_prefetched.clear();
  return total;
}
static inline unsigned short emu_f32_to_bf16(float f) {   // round to nearest even (NaN stays a NaN)
  unsigned int u = __float_as_uint(f);
  if (f != f) return 0x7FC0;
  return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
// a warp's shuffle: every lane puts its value in a block-wide exchange, the block waits, each lane reads its partner's
// (so every thread of the block must reach it, as for an mma). Any value of up to 8 bytes, as CUDA's overloads (int,
// unsigned, long long, float, double, ...): its bytes are exchanged as they are
static unsigned long long emu_lane_values[EMU_MAX_THREADS];
template <typename T> static inline T emu_exchange(T value, unsigned int source) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "a shuffle moves at most 8 bytes");
  memcpy(&emu_lane_values[emu_thread], &value, sizeof(T));
  block_barrier->arrive_and_wait();
  T partner;
  memcpy(&partner, &emu_lane_values[(emu_thread & ~31u) | (source & 31u)], sizeof(T));
  block_barrier->arrive_and_wait();
  return partner;
}
template <typename T> static inline T __shfl_xor_sync(unsigned int, T value, int lane_mask) {
  return emu_exchange(value, (emu_thread & 31u) ^ (unsigned int)lane_mask);
}
template <typename T> static inline T __shfl_sync(unsigned int, T value, int source_lane) {   // a lane's value to all
  return emu_exchange(value, (unsigned int)source_lane);
}
// grid-wide atomics and fences (the blocks run one after another, so a fence orders nothing more than program order)
static inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
  return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST);
}
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
// a cluster's blocks each have their copy of every shared array (emulable gives a cluster kernel's declarations one a
// block, registered here): mapa.u64 maps an address in the running block's copy to the same place in block `rank`'s
struct EmuSharedCopies { unsigned char* base; size_t bytes; };   // EMU_CLUSTER copies of `bytes` each, back to back
static std::vector<EmuSharedCopies> emu_shared_copies;
static inline bool emu_register_shared(void* base, size_t bytes) {
  emu_shared_copies.push_back({(unsigned char*)base, bytes});
  return true;
}
static inline unsigned long long emu_mapa(const void* address, unsigned int rank) {
  const unsigned char* p = (const unsigned char*)address;
  for (const EmuSharedCopies& copies : emu_shared_copies)
    if (p >= copies.base && p < copies.base + EMU_CLUSTER * copies.bytes) {
      if (rank >= EMU_CLUSTER) {
        std::fprintf(stderr, "mapa: rank %u of a cluster of %u\n", rank, EMU_CLUSTER);
        std::abort();
      }
      return (unsigned long long)(copies.base + rank * copies.bytes + (p - copies.base) % copies.bytes);
    }
  std::fprintf(stderr, "mapa: an address outside the shared arrays\n");
  std::abort();
}
// a block of a cluster whose threads have all returned: its shared copies become NaN bytes, so a block still reading
// them (a kernel that lets a block leave before the cluster's last read of its shared memory) reads garbage
static unsigned int emu_block_threads = 0, emu_returned[EMU_CLUSTER] = {};
static inline void emu_block_returned() {
  if (EMU_CLUSTER == 1 || ++emu_returned[emu_rank] < emu_block_threads) return;
  emu_returned[emu_rank] = 0;
  for (const EmuSharedCopies& copies : emu_shared_copies)
    std::memset(copies.base + emu_rank * copies.bytes, 0xFF, copies.bytes);
}
template <typename T> static inline T __ldcg(const T* address) { return *address; }   // a load through L2: a load
// shared memory of the wgmma kernel: the generic address of its (static, 1024-aligned) array is shared address 0
static unsigned char* emu_shared_base = nullptr;   // the running thread's
static inline unsigned int __cvta_generic_to_shared(const void* p) {
  emu_shared_base = (unsigned char*)p;
  return 0;
}
static inline void emu_cp_async(unsigned int target, const void* source, unsigned int size) {
  std::memcpy(emu_shared_base + target, source, size);
  std::memset(emu_shared_base + target + size, 0, 16 - size);
}
// mbarriers (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier"): a phase completes when
// its pending arrivals reach 0 and its transaction count (bytes expected by expect_tx, less those the copies
// completed) is 0; then the next phase begins with the arrival count of init. try_wait.parity P is true once the
// phase of parity P has completed: the current phase's parity is not P. Kept beside shared memory, keyed by address.
struct EmuBarrier { int pending = 0, expected = 0; long long transactions = 0; unsigned int phase = 0; };
static std::map<unsigned int, EmuBarrier> emu_barriers;
static inline EmuBarrier& emu_barrier(unsigned int address) {
  auto found = emu_barriers.find(address);
  if (found == emu_barriers.end()) { std::fprintf(stderr, "mbarrier %u used before init\n", address); std::abort(); }
  return found->second;
}
static inline void emu_barrier_advance(EmuBarrier& b) {
  if (b.pending < 0) { std::fprintf(stderr, "more arrivals on an mbarrier than its count\n"); std::abort(); }
  if (b.pending == 0 && b.transactions == 0) { b.phase++; b.pending = b.expected; }
}
static void emu_mbarrier_init(unsigned int address, unsigned int count) {
  EmuBarrier b;
  b.pending = b.expected = (int)count;
  emu_barriers[address] = b;
}
static void emu_mbarrier_arrive(unsigned int address) {
  EmuBarrier& b = emu_barrier(address);
  b.pending--;
  emu_barrier_advance(b);
}
static void emu_mbarrier_arrive_expect_tx(unsigned int address, unsigned int bytes) {
  EmuBarrier& b = emu_barrier(address);
  b.transactions += bytes;
  b.pending--;
  emu_barrier_advance(b);
}
static void emu_mbarrier_complete_tx(unsigned int address, unsigned int bytes) {
  EmuBarrier& b = emu_barrier(address);
  b.transactions -= bytes;
  emu_barrier_advance(b);
}
static unsigned int emu_mbarrier_try_wait(unsigned int address, unsigned int parity) {
  bool done = (emu_barrier(address).phase & 1u) != (parity & 1u);
  if (!done) emu_yield();
  return done;
}
// cp.async.bulk.tensor.2d (tiled, CUDA programming guide "Tensor Memory Access"): the box of box_rows × box_columns
// elements at (inner, outer) of the tensor map's matrix, elements outside it read as 0, stored densely (rows of
// box_columns elements) from `target`, each byte address through the 128-byte swizzle (bits 4-6 ^= bits 7-9); then
// the copy's bytes complete on the mbarrier. The emulated map (cuda_on_cpu's launcher makes it from the kernel's
// {name}_tensor_maps global): the global address, then rows, columns, row stride, box rows, box columns, element
// bytes, swizzle.
static void emu_tma_load_2d(unsigned int target, unsigned long long map, int inner, int outer, unsigned int barrier) {
  const unsigned long long* m = (const unsigned long long*)map;
  const unsigned char* global = (const unsigned char*)m[0];
  long long rows = m[1], columns = m[2], stride = m[3], box_rows = m[4], box_columns = m[5], size = m[6];
  if (m[7] != 3 || box_columns * size != 128 || target % 1024) {
    std::fprintf(stderr, "only 128-byte-swizzled boxes of 128-byte rows into 1024-byte-aligned targets\n");
    std::abort();
  }
  for (long long r = 0; r < box_rows; r++) for (long long e = 0; e < box_columns; e++) {
    unsigned int at = target + (unsigned int)(r * box_columns * size + e * size);
    at ^= ((at >> 7) & 7) << 4;
    long long row = outer + r, column = inner + e;
    if (row < rows && column < columns) std::memcpy(emu_shared_base + at, global + row * stride + column * size, size);
    else std::memset(emu_shared_base + at, 0, size);
  }
  emu_mbarrier_complete_tx(barrier, (unsigned int)(box_rows * box_columns * size));
}
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA "Warp-level matrix load instruction: ldmatrix"): lanes
// 8i..8i+7 give the shared addresses of matrix i's rows 0-7 (16 bytes each); each lane receives one 32-bit register per
// matrix: row lane / 4, elements 2·(lane % 4) and +1; with .trans the matrix is read transposed: elements (row
// 2·(lane % 4), column lane / 4) and (row 2·(lane % 4) + 1, same column), the first in the low half
static unsigned int emu_row_addresses[1024];
static void emu_ldmatrix(unsigned int& r0, unsigned int& r1, unsigned int& r2, unsigned int& r3, unsigned int address,
                         bool transposed) {
  emu_row_addresses[emu_thread] = address;
  block_barrier->arrive_and_wait();
  unsigned int warp = emu_thread & ~31u, lane = emu_thread & 31u;
  unsigned int* out[4] = {&r0, &r1, &r2, &r3};
  unsigned int values[4];
  for (int i = 0; i < 4; i++) {
    unsigned short lo, hi;
    if (transposed) {
      unsigned int column = 2 * (lane / 4);
      std::memcpy(&lo, emu_shared_base + emu_row_addresses[warp + 8 * i + 2 * (lane % 4)] + column, 2);
      std::memcpy(&hi, emu_shared_base + emu_row_addresses[warp + 8 * i + 2 * (lane % 4) + 1] + column, 2);
    } else {
      unsigned char* row = emu_shared_base + emu_row_addresses[warp + 8 * i + lane / 4];
      std::memcpy(&lo, row + 4 * (lane % 4), 2);
      std::memcpy(&hi, row + 4 * (lane % 4) + 2, 2);
    }
    values[i] = (unsigned int)lo | ((unsigned int)hi << 16);
  }
  block_barrier->arrive_and_wait();
  for (int i = 0; i < 4; i++) *out[i] = values[i];
}
// the element (row, k) of a 128-byte-swizzled wgmma operand of 16-bit elements: K-major at start + (row / 8)·SBO +
// (row % 8)·128 + 2k, MN-major (transposed) at start + (row / 64)·LBO + (k / 8)·SBO + (k % 8)·128 + 2·(row % 64);
// of TF32 (K-major only: 4-byte elements, 32 to a 128-byte row) at start + (row / 8)·SBO + (row % 8)·128 + 4k, of
// which the tensor core reads the sign, exponent and top 10 mantissa bits (the low 13 bits ignored: truncation);
// the swizzle XORs address bits 4-6 with bits 7-9
enum EmuWgmmaInput { EMU_WGMMA_F16, EMU_WGMMA_BF16, EMU_WGMMA_TF32 };
static inline float emu_operand(unsigned long long desc, int row, int k, bool transposed, EmuWgmmaInput input) {
  unsigned int start = (unsigned int)(desc & 0x3FFF) << 4, leading = (unsigned int)((desc >> 16) & 0x3FFF) << 4;
  unsigned int stride = (unsigned int)((desc >> 32) & 0x3FFF) << 4;
  if ((desc >> 62) != 1) { std::fprintf(stderr, "only the 128-byte swizzle is emulated\n"); std::abort(); }
  const unsigned int size = input == EMU_WGMMA_TF32 ? 4 : 2;
  if (transposed && size == 4) { std::fprintf(stderr, "TF32 wgmma operands are K-major\n"); std::abort(); }
  unsigned int at = transposed ? start + (row / 64) * leading + (k / 8) * stride + (k % 8) * 128 + 2 * (row % 64)
                               : start + (row / 8) * stride + (row % 8) * 128 + size * k;
  at ^= ((at >> 7) & 7) << 4;
  if (size == 4) {
    unsigned int word;
    std::memcpy(&word, emu_shared_base + at, 4);
    return __uint_as_float(word & 0xFFFFE000u);
  }
  unsigned short bits;
  std::memcpy(&bits, emu_shared_base + at, 2);
  return input == EMU_WGMMA_BF16 ? emu_bf16_to_f32(bits) : emu_f16_to_f32(bits);
}
// one m64nNk16 (16-bit inputs) or m64nNk8 (TF32) wgmma of this thread's warpgroup, D += A·B: this thread's N/2
// accumulators, register i at row 16·(warp) + lane / 4 + 8·((i % 4) / 2), column 8·(i / 4) + 2·(lane % 4) + i % 2
// (t = the thread in its warpgroup)
static void emu_wgmma(float* acc, unsigned long long desc_a, unsigned long long desc_b, int n, EmuWgmmaInput input,
                      bool transposed_b) {
  const int depth = input == EMU_WGMMA_TF32 ? 8 : 16;
  unsigned int t = emu_thread % 128, lane = t % 32;
  for (int i = 0; i < n / 2; i++) {
    int row = 16 * (int)(t / 32) + (int)(lane / 4) + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * (int)(lane % 4) + i % 2;
    double sum = 0;
    for (int k = 0; k < depth; k++)
      sum += (double)emu_operand(desc_a, row, k, false, input) * emu_operand(desc_b, col, k, transposed_b, input);
    acc[i] = (float)((double)acc[i] + sum);
  }
}
// cvt.rna.tf32.f32: to TF32 to nearest, ties away from zero (the low 13 bits cleared); a NaN gives the canonical NaN,
// an infinity stays one, and a finite float that rounds past the largest is infinite
static inline unsigned int emu_tf32_rna(float x) {
  unsigned int bits = __float_as_uint(x);
  if ((bits & 0x7F800000u) == 0x7F800000u) return bits & 0x007FFFFFu ? 0x7FFFFFFFu : bits;
  return (bits + 0x1000u) & 0xFFFFE000u;
}
// the same with A from registers (TF32 only here): each warp's 16 rows of the warpgroup's 64 × 8 as mma.m16n8k8's A
// above (A[row][k] in lane (row % 8)·4 + k % 4 of the row's warp, register (row % 16 >= 8) + 2·(k >= 4)), gathered
// from every thread's four registers between two barriers (all threads of the block issue their warpgroups' wgmmas
// together)
static void emu_wgmma_registers(float* acc, unsigned int a0, unsigned int a1, unsigned int a2, unsigned int a3,
                                unsigned long long desc_b, int n) {
  unsigned int* mine = emu_registers[emu_thread];
  mine[0] = a0; mine[1] = a1; mine[2] = a2; mine[3] = a3;
  block_barrier->arrive_and_wait();
  unsigned int group = emu_thread & ~127u, t = emu_thread % 128, lane = t % 32;
  for (int i = 0; i < n / 2; i++) {
    int row = 16 * (int)(t / 32) + (int)(lane / 4) + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * (int)(lane % 4) + i % 2;
    double sum = 0;
    for (int k = 0; k < 8; k++) {
      unsigned int* holder = emu_registers[group + 32 * (row / 16) + (row % 8) * 4 + k % 4];
      float a = __uint_as_float(holder[(row % 16 >= 8) + 2 * (k >= 4)] & 0xFFFFE000u);
      sum += (double)a * emu_operand(desc_b, col, k, false, EMU_WGMMA_TF32);
    }
    acc[i] = (float)((double)acc[i] + sum);
  }
  block_barrier->arrive_and_wait();
}
"""

MMA_OPERANDS = ", ".join(f"{{{i}}}" for i in range(10))   # D (4 floats), A (4 registers), B (2)
# inline PTX the header stands in for: instruction → a C++ statement over the asm's operands (outputs first)
PTX_STAND_INS = {
  "cvt.f32.f16 %0, %1;": "{0} = emu_f16_to_f32({1});",
  "cvt.rn.f16.f32 %0, %1;": "{0} = emu_f32_to_f16({1});",
  "cvt.rn.f16.f64 %0, %1;": "{0} = emu_f64_to_f16({1});",
  "max.NaN.f32 %0, %1, %2;": "{0} = emu_max_nan({1}, {2});",
  "cvt.rna.tf32.f32 %0, %1;": "{0} = emu_tf32_rna({1});",
  "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32": "emu_mma(" + MMA_OPERANDS + ", EMU_F16);",
  "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32": "emu_mma(" + MMA_OPERANDS + ", EMU_BF16);",
  "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32": "emu_mma(" + MMA_OPERANDS + ", EMU_TF32);",
  "cvt.rn.bf16.f32 %0, %1;": "{0} = emu_f32_to_bf16({1});",
  "cvt.rn.f16x2.f32 %0, %1, %2;": "{0} = emu_pack_f16x2({1}, {2});",
  "cvt.rn.bf16x2.f32 %0, %1, %2;": "{0} = ((unsigned int)emu_f32_to_bf16({1}) << 16) | emu_f32_to_bf16({2});",
  "cp.async.cg.shared.global [%0], [%1], 16, %2;": "emu_cp_async({0}, {1}, {2});",
  "ldmatrix.sync.aligned.m8n8.x4.shared.b16": "emu_ldmatrix({0}, {1}, {2}, {3}, {4}, false);",
  "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16": "emu_ldmatrix({0}, {1}, {2}, {3}, {4}, true);",
  "ex2.approx.ftz.f32 %0, %1;": "{0} = std::exp2({1});",
  "prefetch.global.L2 [%0];": "emu_prefetch({0});",
  # a cluster barrier: every thread of the cluster's blocks arrives, then waits (the wait is the arrive's here)
  "barrier.cluster.arrive.release.aligned;": "emu_cluster_sync->arrive_and_wait();",
  "barrier.cluster.wait.acquire.aligned;": ";",
  "mapa.u64 %0, %1, %2;": "{0} = emu_mapa({1}, {2});",
  "mbarrier.init.shared::cta.b64 [%0], %1;": "emu_mbarrier_init({0}, {1});",
  "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;": "emu_mbarrier_arrive_expect_tx({0}, {1});",
  "mbarrier.arrive.shared::cta.b64 _, [%0];": "emu_mbarrier_arrive({0});",
  "{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;": "{0} = emu_mbarrier_try_wait({1}, {2});",
  "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];":
    "emu_tma_load_2d({0}, {1}, {2}, {3}, {4});",
  # register reallocation between warpgroups changes nothing an OS thread computes
  **{no_op: ";" for no_op in ("cp.async.commit_group;", "cp.async.wait_group", "fence.proxy.async.shared::cta;",
                              "wgmma.fence.sync.aligned;", "wgmma.commit_group.sync.aligned;",
                              "wgmma.wait_group.sync.aligned", "fence.mbarrier_init.release.cluster;",
                              "setmaxnreg.dec.sync.aligned.u32", "setmaxnreg.inc.sync.aligned.u32",
                              # one grid runs at a time here: a dependent launch's wait and early launch are no-ops
                              "griddepcontrol.wait;", "griddepcontrol.launch_dependents;")},
}
# the wgmma kernel's MMA (its asm opens with a predicate for scale-d): shape and types from the instruction (a 16-bit
# type's ends with imm-trans-a 0 and imm-trans-b; TF32's has neither)
WGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k(?:16|8)\.f32\.(f16|bf16|tf32)\.\2 .*, p, 1, 1"
                   r"(?:, 0, ([01]))?;")
WGMMA_INPUTS = {"f16": "EMU_WGMMA_F16", "bf16": "EMU_WGMMA_BF16", "tf32": "EMU_WGMMA_TF32"}
DYNAMIC_SHARED = re.compile(r"extern __shared__ __align__\((\d+)\) unsigned char (\w+)\[\];")
DYNAMIC_SIZE = re.compile(r"_dynamic_shared_bytes = (\d+);")
ASM = re.compile(r'asm(?: volatile)?\("([^"]*)"\s*:([^;]*?):([^;]*?)\);')   # operands may span lines
OPERAND = re.compile(r'"[=+]?\w"\(((?:[^()]|\([^()]*\))*)\)')

def emulable(source: str) -> str:
  """The source with each inline PTX statement replaced by its stand-in's call (PTX_STAND_INS); an instruction without
  one raises NotImplementedError."""
  def replace(match: re.Match) -> str:
    text, outputs, inputs = match.groups()
    if (wgmma := WGMMA.search(text)) is not None:
      accumulators, operands = OPERAND.findall(outputs), OPERAND.findall(inputs)
      assert len(accumulators) == int(wgmma.group(1)) // 2, "one output per accumulator"
      if len(operands) == 6:   # A from registers (4 of them), B's descriptor, scale-d
        assert wgmma.group(2) == "tf32", "A from registers is emulated for TF32"
        return f"emu_wgmma_registers(&{accumulators[0]}, {', '.join(operands[:5])}, {wgmma.group(1)});"
      desc_a, desc_b, _ = operands
      transposed = "true" if wgmma.group(3) == "1" else "false"
      return f"emu_wgmma(&{accumulators[0]}, {desc_a}, {desc_b}, {wgmma.group(1)}, {WGMMA_INPUTS[wgmma.group(2)]}, " \
             f"{transposed});"
    stand_in = next((call for instruction, call in PTX_STAND_INS.items() if text.startswith(instruction)), None)
    if stand_in is None: raise NotImplementedError(f"no CPU stand-in for the PTX {text!r}")
    return stand_in.format(*OPERAND.findall(outputs), *OPERAND.findall(inputs))
  if (dynamic := DYNAMIC_SHARED.search(source)) is not None:   # the wgmma kernel's: a static array of its size
    size = DYNAMIC_SIZE.search(source)
    assert size is not None, "a dynamic shared array without its size"
    source = DYNAMIC_SHARED.sub(f"static __attribute__((aligned({dynamic.group(1)}))) unsigned char "
                                f"{dynamic.group(2)}[{size.group(1)}];", source)
  return ASM.sub(replace, source)

LAUNCHER = r"""
static void** emu_buffers;
static long long* emu_variables;
static const unsigned int* emu_grid;
static void emu_thread_main() {   // one thread: its block of every cluster of the grid in turn (every block, without)
  void** buffers = emu_buffers;
  long long* variables = emu_variables;
  for (unsigned int z = 0; z < emu_grid[2]; z++) for (unsigned int y = 0; y < emu_grid[1]; y++)
    for (unsigned int x = emu_rank; x < emu_grid[0]; x += EMU_CLUSTER) {
      blockIdx = {x, y, z};
      CALL;
      emu_block_returned();
      emu_cluster_sync->arrive_and_wait();   // the next cluster reuses the static shared arrays
    }
  emu_current->done = true;
}
static const size_t EMU_STACK_BYTES = 1 << 20;   // a thread's stack (malloc'd: pages are used only when touched)
extern "C" void launch(void** buffers, long long* variables, const unsigned int* grid, const unsigned int* block) {
  const unsigned int block_threads = block[0] * block[1] * block[2], threads = EMU_CLUSTER * block_threads;
  std::vector<EmuSync> barriers(EMU_CLUSTER, EmuSync(block_threads));   // each block's
  emu_block_threads = block_threads;
  EmuSync cluster_barrier(threads);
  emu_cluster_sync = EMU_CLUSTER > 1 ? &cluster_barrier : &barriers[0];
  emu_buffers = buffers, emu_variables = variables, emu_grid = grid;
  std::vector<EmuFiber> fibers(threads);
  std::vector<void*> stacks(threads);
  for (unsigned int i = 0; i < threads; i++) {
    EmuFiber& f = fibers[i];
    const unsigned int t = i % block_threads;
    f.id = i, f.rank = i / block_threads;
    f.thread = {t % block[0], (t / block[0]) % block[1], t / (block[0] * block[1])};
    stacks[i] = std::malloc(EMU_STACK_BYTES);
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = stacks[i];
    f.context.uc_stack.ss_size = EMU_STACK_BYTES;
    f.context.uc_link = &emu_scheduler;
    makecontext(&f.context, emu_thread_main, 0);
  }
  // passes over the threads alternate direction: a read of another thread's write that lacks the barrier between
  // them then sees the old value in one of two consecutive steps between barriers, whichever thread writes
  for (unsigned int running = threads, pass = 0; running > 0; pass++) {
    bool moved = false;
    for (unsigned int i = 0; i < threads; i++) {
      EmuFiber& f = fibers[pass % 2 ? threads - 1 - i : i];
      if (f.done || (f.waiting != nullptr && !((const EmuSync*)f.waiting)->released(f.wait_phase))) continue;
      emu_current = &f;
      threadIdx = f.thread, blockIdx = f.block, emu_thread = f.id, emu_shared_base = f.shared_base;
      emu_rank = f.rank, block_barrier = &barriers[f.rank];
      swapcontext(&emu_scheduler, &f.context);
      f.block = blockIdx, f.shared_base = emu_shared_base;
      moved = true;
      if (f.done) running--;
    }
    if (!moved) {
      std::fprintf(stderr, "every thread of the block (cluster) waits at a barrier: a deadlock\n");
      std::abort();
    }
  }
  for (void* stack : stacks) std::free(stack);
}
"""

def cpu_available() -> bool: return COMPILER is not None

def _parameters(source: str, name: str) -> list[str]:
  """The C types of the kernel's parameters, in order."""
  match = re.search(rf"\b{re.escape(name)}\((.*?)\)\s*{{", source, re.DOTALL)   # the list may span lines
  assert match is not None, f"kernel {name} not found in the source"
  return [" ".join(p.split()[:-1]) for p in match.group(1).split(",")]

_loaded: dict[str, ctypes.CDLL] = {}

# a TMA kernel's tensor map i, as emu_tma_load_2d reads it, made from the kernel's marker global and the buffers
TENSOR_MAP_MAKER = r"""
static TensorMap emu_tensor_map(const unsigned long long* marker, int index, void** buffers) {
  const unsigned long long* spec = marker + 1 + 8 * index;   // argument, rows, columns, stride, box, size, swizzle
  TensorMap map = {};
  map.opaque[0] = (unsigned long long)buffers[spec[0]];
  for (int field = 1; field < 8; field++) map.opaque[field] = spec[field];
  return map;
}
"""

CLUSTER_DIMS = re.compile(r"__cluster_dims__\((\d+),\s*1,\s*1\)")
SHARED_DECLARATION = re.compile(r"__shared__\s+([\w\s()]+?)\s+(\w+)((?:\[[^\]]+\])*)\s*;")

def cluster_blocks(source: str) -> int:
  """The blocks of the kernel's thread block cluster (its `__cluster_dims__(n, 1, 1)`), 1 without one."""
  found = CLUSTER_DIMS.search(source)
  return int(found.group(1)) if found else 1

def per_block_shared(source: str) -> str:
  """A cluster kernel's shared arrays, one copy a block of the cluster (registered for mapa), each declaration
  naming the running block's copy."""
  def copies(match: re.Match) -> str:
    ctype, name, dims = match.groups()
    return (f"static {ctype} {name}_copies[EMU_CLUSTER]{dims}; "
            f"static const bool {name}_registered = emu_register_shared({name}_copies, sizeof({name}_copies[0])); "
            f"auto& {name} = {name}_copies[emu_rank];")
  return SHARED_DECLARATION.sub(copies, source)

def _compile(source: str, name: str) -> ctypes.CDLL:
  call_args = []
  buffer_count = variable_count = map_count = 0
  maker = ""
  for ctype in _parameters(source, name):
    if "TensorMap" in ctype:
      call_args.append(f"emu_tensor_map({name}_tensor_maps, {map_count}, buffers)")
      map_count += 1
      maker = TENSOR_MAP_MAKER
    elif "*" in ctype:
      call_args.append(f"({ctype.replace('__restrict__', '').strip()})buffers[{buffer_count}]")
      buffer_count += 1
    else:
      call_args.append(f"variables[{variable_count}]")
      variable_count += 1
  cluster = cluster_blocks(source)
  kernel = emulable(per_block_shared(source) if cluster > 1 else source)
  program = f"static const unsigned int EMU_CLUSTER = {cluster};\n" + HEADER + kernel + maker + \
    LAUNCHER.replace("CALL", f"{name}({', '.join(call_args)})")
  key = hashlib.sha256(program.encode()).hexdigest()[:24]
  if key in _loaded: return _loaded[key]
  folder = tempfile.mkdtemp(prefix="tgrad-cuda-on-cpu-")
  source_path, library = os.path.join(folder, "kernel.cpp"), os.path.join(folder, "kernel.so")
  with open(source_path, "w") as f: f.write(program)
  subprocess.run([COMPILER, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", source_path, "-o", library],
                 check=True, capture_output=True, text=True)
  _loaded[key] = ctypes.CDLL(library)
  return _loaded[key]

def run_on_cpu(source: str, name: str, global_size: tuple[int, ...], local_size: tuple[int, ...],
               buffers: list[np.ndarray], variables: list[int]) -> list[int]:
  """Launch the kernel `name` of `source` once over a grid of `global_size` blocks of `local_size` threads (x first),
  on numpy buffers (parameter order; outputs are written in place) and the variables' values (name order). Returns
  the addresses its `prefetch.global.L2` instructions named, sorted (each once)."""
  library = _compile(source, name)
  if global_size[0] % (cluster := cluster_blocks(source)):
    raise ValueError(f"a grid of {global_size[0]} blocks is not whole clusters of {cluster}")
  grid = (ctypes.c_uint * 3)(*(tuple(global_size) + (1,) * (3 - len(global_size))))
  block = (ctypes.c_uint * 3)(*(tuple(local_size) + (1,) * (3 - len(local_size))))
  pointers = (ctypes.c_void_p * max(1, len(buffers)))(*[b.ctypes.data for b in buffers])
  values = (ctypes.c_longlong * max(1, len(variables)))(*variables)
  library.launch(pointers, values, grid, block)
  count = library.emu_take_prefetched(None, 0)
  addresses = (ctypes.c_ulonglong * max(1, count))()
  library.emu_take_prefetched(addresses, count)
  return list(addresses[:count])

def rendered_kernel(out, opts=None, arch: str = CPU_ARCH, renderer=None):
  """The one kernel of the lazy tensor `out` for CUDA `arch`, or for `renderer` where given (the heuristics' opts, or
  `opts`): (its ScheduleItem, the optimized Kernel, its source)."""
  from tgrad.codegen.heuristics import hand_coded_optimizations
  from tgrad.codegen.kernel import Kernel
  from tgrad.codegen.linearizer import linearize
  from tgrad.ops import Ops
  from tgrad.runtime.cuda.renderer import CUDARenderer
  from tgrad.schedule import create_schedule
  (item,) = [i for i in create_schedule([out.lazydata]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, renderer if renderer is not None else CUDARenderer(arch))
  if opts is None: hand_coded_optimizations(kernel)
  else:
    for opt in opts: kernel.apply_opt(opt)
  return item, kernel, kernel.renderer.render("kernel", linearize(kernel))

def run_kernel_emulated(out, opts=None, arch: str = CPU_ARCH) -> tuple[np.ndarray, str]:
  """The one kernel of the lazy tensor `out` rendered for CUDA (rendered_kernel) and run here: (its output, its
  source). The output buffer starts as NaN (or -1 for an integer dtype), so a slot never written shows."""
  item, kernel, source = rendered_kernel(out, opts, arch)
  global_size, local_size = kernel.launch_dims()
  dtype = item.bufs[0].dtype.np
  result = np.full(item.bufs[0].size, np.nan if np.issubdtype(dtype, np.floating) else -1, dtype)
  run_on_cpu(source, "kernel", global_size, local_size, [result] + [b.copyout() for b in item.inputs],
             [item.var_vals[name] for name in sorted(item.var_vals)])   # scalar parameters (exp's log2 e), by name
  return result, source
