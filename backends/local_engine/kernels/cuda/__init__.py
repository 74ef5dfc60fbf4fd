"""CUDA C++ kernels (int4 on tensor cores), compiled on first use."""
