// Set a CUDA graph condition from device code.
//
// Numba has no binding for cudaGraphSetConditional, so numbagraph declares
// this function with cuda.declare_device("ng_set_condition",
// "int32(uint64, uint32)", link=[this file]); numba compiles it with NVRTC
// when it links a kernel that calls it. Numba's device ABI returns through
// the first pointer argument.

typedef unsigned long long cudaGraphConditionalHandle;

extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(
    cudaGraphConditionalHandle handle, unsigned int value);

extern "C" __device__ int ng_set_condition(int* ret, unsigned long long handle,
                                           unsigned int value)
{
    cudaGraphSetConditional((cudaGraphConditionalHandle)handle, value);
    *ret = 0;
    return 0;
}
