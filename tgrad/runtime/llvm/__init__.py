"""The LLVM (CPU) device: its renderer (LLVM IR) and llvmlite runtime."""
