#!/usr/bin/env bash
# The two-GPU checks and numbers of the NCCL path, on a host with 2 GPUs, from the repo root (after
# ../shared/device/prepare.sh on the development machine; the device call carries .gpu):
#   source .gpu/setup.sh && bash bench/multi_gpu.sh
# NCCL comes from the nvidia-nccl-cu13 wheel when it is installed, else the system's libnccl.so.2.
set -eu
export NCCL_NVLS_ENABLE=0   # NVLink multicast stays off
# NCCL: the nvidia-nccl wheel torch installs (found through nvidia.nccl), else the system libnccl.so.2
python3 -c "from tgrad.runtime.cuda.nccl import nccl; n = nccl(); print('NCCL', n.version, n.path)"
nvidia-smi topo -m || true
python3 -m pytest test/test_nccl.py test/test_cuda_graph.py -q -p no:cacheprovider -rs
python3 bench/allreduce.py --gpus 2 --out "${OUT:-.}/allreduce.json"
python3 -m pytest test/test_collective_step.py test/test_multi_device.py -q -p no:cacheprovider -rs
python3 bench/multi_device.py --out "${OUT:-.}/multi_device.json"
