"""x86 CPU kernels (AVX2 / AVX-512 VNNI), compiled on first use."""
