# The worker-side gather/scatter kernels and their host implementation
# (cuda/kernels.h). The host one is always built; the CUDA one with the CUDA
# backend. kvcuda stays a static library that C programs link: the .cu is
# compiled whole (no separable compilation, so no device link step); CMake
# then links kvcuda's users with the CUDA host linker (g++), which brings
# the C++ runtime the .cu's host code needs, and the shared CUDA runtime
# only (CUDA::cudart, not cudart_static). The project's warning flags reach
# the host compiler through nvcc's -forward-unknown-to-host-compiler.
target_sources(kvcuda PRIVATE ${CMAKE_CURRENT_LIST_DIR}/kernels_host.c)
if(KV_HAVE_CUDA)
  target_sources(kvcuda PRIVATE ${CMAKE_CURRENT_LIST_DIR}/kernels.cu)
  set_target_properties(kvcuda PROPERTIES
    CUDA_SEPARABLE_COMPILATION OFF CUDA_RESOLVE_DEVICE_SYMBOLS OFF
    CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON CUDA_RUNTIME_LIBRARY Shared)
endif()
