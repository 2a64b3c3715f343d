"""Code generation: AxisState and Kernel (axes), OptOps (opts), linearizer, heuristics, search, renderers.

CODEGEN_VERSION is the version of what this package makes of a kernel AST and a list of Opts: part of the key of every
BEAM winner in the cache (search.py), so a winner found and verified under older code is searched and verified again.
"""

# Bump when a change here alters the code that some AST and Opt list produce, or what an Opt means: axes.py and opts.py,
# the linearizer, a renderer, the heuristics that seed the search, or how search verifies. Changes that only
# rename or restructure without changing generated code need no bump.
CODEGEN_VERSION = 6   # 2: gathers (data-dependent loads); int casts as narrow CUDA index math. 3: row kernels.
# 4: guarded GROUPs of symbolic reduces that padding would change (padding guards), split views indexed without division
# 5: guarded UPCAST and PADTO of symbolic global axes (stride-0 loads stretched, not masked), tensor cores with padded
# symbolic rows/columns
# 6: CPU matmuls: B packed into column panels by a copy kernel (cpu_gemm.py), register tiles sized for the host's SIMD
