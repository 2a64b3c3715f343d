"""Code generation: AxisState and Kernel (axes), OptOps (opts), linearizer, heuristics, search, renderers.

CODEGEN_VERSION is the version of what this package makes of a kernel AST and a list of Opts: part of the key of every
BEAM winner in the cache (search.py), so a winner found and verified under older code is searched and verified again.
"""

# Bump when a change here alters the code that some AST and Opt list produce, or what an Opt means: axes.py and opts.py,
# the linearizer, a renderer, the heuristics that seed the search, or how search verifies. Changes that only
# rename or restructure without changing generated code need no bump.
CODEGEN_VERSION = 49   # 2: gathers (data-dependent loads); int casts as narrow CUDA index math. 3: row kernels.
# 4: guarded GROUPs of symbolic reduces that padding would change (padding guards), split views indexed without division
# 5: guarded UPCAST and PADTO of symbolic global axes (stride-0 loads stretched, not masked), tensor cores with padded
# symbolic rows/columns
# 6: on sm_90+ (PDL=1) CUDA kernels open with griddepcontrol.wait / launch_dependents (Programmatic Dependent Launch)
# 7: LLVM: an unrolled chain of summands into a reorderable accumulator is reassoc nsz, its loops not loop-vectorized
# 8: kernels with several outputs (schedule rule 2c: reduced and row stores side by side, a gated store pass); a reduce
# read in several passes over a size-1 loop axis is built once
# 9: CPU matmuls: B packed into column panels by a copy kernel (cpu_gemm.py), register tiles sized for the host's
# SIMD registers
# 10: the CPU register tile is sized by the accumulators' dtype (float32 for a half matmul: 16 columns on AVX2, not 32)
# 11: OptOps.WGMMA: on sm_90a a big half/bfloat16 matmul without an epilogue is one warpgroup-MMA kernel (heuristics)
# 12: exp2's range reduction rounds with a float magic constant (no float → int conversion: vectorizes on AVX2); a CPU
# softmax's sum pass stores its exponentials for the store pass (value_graph.PassStore)
# 13: CUDA reads runs of bytes of a read-only buffer as whole words (funnel shifts where the alignment is unknown); two
# GROUP axes; packed matrix–vector products spread each row over its blocks and 32-bit words
# 14: CPU: values that vary along no loop come before the global loops; values under a reduce that vary only along its
# axes are computed once per thread into a scratch array (scratch.py); a reduce is built once per position it varies on
# 15: OptOps.WGMMA's TMA tiles (a producer warpgroup loads A and B through tensor maps; WGMMA_TMA=1 in the heuristics)
# 16: CPU: a value under a reduce that reads no memory (a bit field's shift from an arange) is not put in a scratch
# array: it folds to literals where its axes are unrolled
# 17: an unrolled float sum's terms float(int)·s that share s are summed as int32 first (reduces.factor_integer_terms);
# scratch keeps the source of a widening integer cast
# 18: LLVM: the masked stores between two other ops share one branch per mask (SLP vectorizes a padded tile's rows);
# CPU matmuls with a symbolic row count or several reduce axes (a packed weight) get the GEMM tile and packing
# 19: GPU packed matvecs with many rows take fewer threads a row (matvec_rules.PACKED_MATVEC_GPU_THREADS); a GROUP
# combines the partials of a sum of at most ACCUMULATE_BLOCK values without compensation (reduces.long_reduce)
# 20: OptOps.WGMMA with a symbolic M (a prompt's rows: grid from the variable, rows past it read zeros and are not
# stored), A in K segments (attention heads [H, T, D] read as T×(H·D)), a float32 output; the heuristics pick it for
# symbolic prefill projections on sm_90a (cp.async tiles)
# 21: on sm_90+ under PDL (PDL_PREFETCH=1) a CUDA kernel's blocks prefetch their bytes of its largest read-only input
# into L2 before griddepcontrol.wait (runtime/cuda/prefetch.py)
# 22: OptOps.SGEMM: on CUDA a big float32 matmul without an epilogue is the float32 matmul template
# (runtime/cuda/sgemm.py; heuristics, SGEMM=1; default tile 128×128 with two blocks an SM)
# 23: OptOps.WGMMA takes TF32: a float32 matmul whose loads the graph rounds to TF32 (a·wᵀ) is one warpgroup-MMA kernel
# on sm_90a (m64nNk8 .tf32, operands rounded in shared memory)
# 24: OptOps.TF32X3: on sm_90a a big float32 matmul without an epilogue is one 3xTF32 warpgroup-MMA kernel (big and
# small TF32 parts in shared memory, three wgmmas per K step; heuristics under F32_MATMUL=3xtf32)
# 25: CPU: a reduce along a strided axis upcasts its contiguous output axis by up to 8 vectors (_cpu_column_reduce)
# 26: an unrolled float sum's products that share a factor put it last (reduces.shared_factors_last): LLVM factors it
# out of the reorderable chain (one multiply by a packed block's scale, not one per value)
# 27: CPU: a packed super-block's innermost run of values stays a loop (heuristics.CPU_VALUE_LOOP_MIN), which the
# LLVM renderer leaves to the loop vectorizer (an accumulator summed over two loops or more)
# 28: 3xTF32: the split by cvt.rna.tf32.f32; tiles with A split in registers (the heuristics' default tiles), and
# F32_MATMUL=3xtf32 the default
# 29: CPU: a big reduce is threaded in heuristics.CPU_CHUNKS_PER_CORE pieces a core, which the runtime hands out to the
# cores as they finish one
# 30: flash attention (CUDA) of head dim 256 walks its keys 64 at a time (32 before)
# 31: 29's pieces withdrawn: a big CPU reduce is one piece a core again
# 32: CUDA: a stored float16 cast keeps the half bits of its one conversion (its store no longer converts the value
# again)
# 33: CPU: a big reduce is threaded in up to heuristics.CPU_PIECES_PER_CORE pieces a core again (as 29), which the
# runtime hands out to the cores as they finish one
# 34: a reduce folded over loops of one trip (a GROUP's own partial) is its value + 0.0 in its dtype, not a float64
# multiply-add and two conversions
# 35: CUDA: a block's L2 prefetch covers each separate part of its buffer (up to 4 ranges) instead of giving up on a
# buffer read at two places (gate and up from one stacked weight)
# 36: a packed matvec's row takes a third GROUP (a loop inside the block) where a thread would decode 64 values of a
# block (Q6_K), and its blocks of threads have at least PACKED_MATVEC_BLOCK_THREADS threads (rows rounded up)
# 37: the GROUP reduces of one pass store their partials before one shared barrier (was a barrier after each)
# 38: CUDA: a GROUP's partials of one output are first combined inside each warp by xor-shuffles (reduces.warp_combine);
# the shared-memory combine reads one partial a warp
# 39: CUDA: an unrolled float sum's shared factors are taken out of it (reduces.factor_shared_out): (Σ x·q)·d, one
# multiply by a packed block's scale per thread, not one per value
# 40: GPU row kernels that fuse a norm into a matvec: 80 threads a row, 2 rows a block (matvec_rules.ROW_MATVEC_*)
# 41: on targets with thread blocks a later pass's loads of small read-only inputs are issued before the block's first
#     barrier (early_loads.py)
# 42: CUDA: a float32 reciprocal of a square root is one rsqrtf (within 2 ulp)
# 43: a GPU row kernel of at most GPU_FEW_ROWS rows: a step a thread, in whole warps (shuffled combines)
# 44: LLVM: a float max reduce's llvm.maximum update ignores the sign of zero (nsz)
# 45: CUDA: the L2 prefetch before a dependent launch's wait also covers loads indexed by a thread index modulo a
#     constant over whole periods (a packed Q6_K matvec's lidx % 4)
# 46: CUDA: uint8 chains on the four bytes of a loaded word computed on the word (runtime/cuda/byte_lanes.py), a
#     lane converted to float32 by __byte_perm into 2^23's bits; ALU ops nobody reads are not written
# 47: CUDA: a byte lane's float plus a select of two constants (Q5_0's fifth bit) folds the select into its bias
# 48: CUDA: an unrolled float sum's terms x·(p + q) whose p and q share factors with other terms are distributed before
#     the shared factors come out (a K-quant's (d·sc)·Σ x·q + −(dmin·m)·Σ x); byte lanes: adds of 0 are the lanes
# 49: tied shared factors of an unrolled sum come out in the order their terms name them (reduces._terms_with: a
#     set of UOps iterated in memory order had made the same kernel render two ways from process to process)
