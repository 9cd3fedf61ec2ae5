// persistent_rnn.cu, the launchers and kernels exactly as nvcc compiles them, compiled as host C++
// against kernel_host_shim.h (kernel_platform.cuh picks it without nvcc), for the tests' module
// _jaxring_rnn_host_test (CMakeLists.txt). A file of its own because CMake gives persistent_rnn.cu
// to nvcc in the CUDA library.
#include "persistent_rnn.cu"
