# The worker-side gather/scatter kernels and their host implementation.
