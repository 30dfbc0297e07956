# The worker-side gather/scatter kernels and their host implementation
# (cuda/kernels.h). The host one is always built.
target_sources(kvcore PRIVATE ${CMAKE_CURRENT_LIST_DIR}/kernels_host.c)
