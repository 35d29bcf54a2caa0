"""torch.cuda's public names that a device module made by accelkit does not have, and
why (the kit's names group checks the rest)."""

# torch.cuda's public names that torch.<name> does not have, and why: each is
# CUDA's own (its toolkit, libraries or NVIDIA's management library)
# or a deprecated CUDA tensor type.
CUDA_ONLY = {
    # Legacy typed tensor classes (torch.cuda.FloatTensor, ...): PyTorch builds
    # them for CUDA alone; torch.tensor(..., device=) replaces them. (The typed
    # storage classes are the device module's: Note [Legacy storage classes].)
    **{f"{t}Tensor": "legacy CUDA tensor types"
       for t in ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long",
                 "Short")},
    # Allocator backends of CUDA's allocator.
    "CUDAPluggableAllocator": "CUDA allocator backends",
    "change_current_allocator": "CUDA allocator backends",
    "get_allocator_backend": "CUDA allocator backends (native or cudaMallocAsync)",
    "caching_allocator_alloc": "raw CUDA allocations",
    "caching_allocator_delete": "raw CUDA allocations",
    "caching_allocator_enable": "CUDA allocator switch",
    "caching_allocator_disabled": "CUDA allocator switch",
    # The CUDA runtime and toolkit.
    "cudart": "CUDA runtime", "cudaStatus": "CUDA runtime", "CudaError": "CUDA runtime",
    "check_error": "CUDA runtime", "DeferredCudaCallError": "CUDA lazy-call errors",
    "get_arch_list": "CUDA architectures of the build",
    "get_gencode_flags": "CUDA architectures of the build",
    "has_half": "CUDA build flag", "has_magma": "MAGMA (CUDA linear algebra)",
    "current_blas_handle": "cuBLAS", "current_solver_handle": "cuSOLVER",
    "is_tf32_supported": "TF32, an NVIDIA format",
    "ExternalStream": "a cudaStream_t from other code",
    "get_stream_from_external": "a cudaStream_t from other code",
    "set_sync_debug_mode": "CUDA's synchronizing-call detector",
    "get_sync_debug_mode": "CUDA's synchronizing-call detector",
    "GreenContext": "CUDA green contexts",
    # NVIDIA's management library (NVML) or AMD's (amdsmi).
    "memory_usage": "NVML", "utilization": "NVML", "temperature": "NVML",
    "power_draw": "NVML", "clock_rate": "NVML",
    # Submodules of CUDA libraries.
    "jiterator": "CUDA JIT kernels", "nvtx": "NVIDIA tools extension", "nccl": "NCCL",
    "tunable": "TunableOp (cuBLAS/hipBLASLt)", "sparse": "cuSPARSE",
    "profiler": "cudaProfilerStart/Stop",
}
