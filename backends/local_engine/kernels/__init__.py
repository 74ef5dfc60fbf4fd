"""Kernels: quantized layers and their choice (select.py), CPU C++ (cpu/), CUDA (cuda/), Triton (triton/)."""
