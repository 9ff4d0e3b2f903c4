"""CUDA micro-kernels: the same shape-generic idea on NVIDIA GPUs.

A GPU micro-kernel is a thread block's output tile (block_m x block_n), each
thread's register tile (thread_m x thread_n) and a K step staged through
shared memory; the space comes from the architecture's limits (threads,
shared memory, registers), never from a shape. Kernels are compiled by TVM to
CUDA C with symbolic dims, then by nvcc to one fatbin (sm_80 and sm_90
machine code) at build time, so nothing is compiled at run time; each kernel
carries its launch rule (grid from the dims, block size, parameter types) so a
runner needs only the CUDA driver.
"""
