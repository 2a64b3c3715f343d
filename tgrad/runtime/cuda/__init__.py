"""The CUDA device: its renderer (CUDA C), NVRTC compiler, pycuda runtime and CUDA graphs."""
