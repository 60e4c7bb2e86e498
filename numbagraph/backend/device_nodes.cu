// Update a device-updatable kernel node of a CUDA graph from device code.
//
// Numba has no binding for CUDA's device-side node updates, so numbagraph
// declares these functions with cuda.declare_device(..., link=[this file]);
// numba compiles the file with NVRTC when it links a kernel that calls one.
// Numba's device ABI returns through the first pointer argument: here the
// cudaError_t of the update (0: done; 1, cudaErrorInvalidValue: refused,
// nothing changed).
//
// cudaGraphKernelNodeSetGridDim and cudaGraphKernelNodeSetEnabled are
// `__cudart_builtin__` (cuda_device_runtime_api.h, CUDA 12.4+), as
// cudaGraphSetConditional is: ptxas resolves them, with no cudadevrt and no
// separate link step. NVRTC declares them already, with
// cudaGraphDeviceNode_t and dim3, so the header is included only where it
// has not been seen (issue 35: probe35 on an H200, CUDA 13.0).
#if !defined(__CUDA_DEVICE_RUNTIME_API_H__)
#include <cuda_device_runtime_api.h>
#endif

extern "C" __device__ int ng_set_grid(int* ret, unsigned long long node, unsigned int x,
                                      unsigned int y, unsigned int z)
{
    *ret = (int)cudaGraphKernelNodeSetGridDim((cudaGraphDeviceNode_t)node, dim3(x, y, z));
    return 0;
}

// enable != 0: enable the node; 0: disable it (a disabled node does nothing).
extern "C" __device__ int ng_set_enabled(int* ret, unsigned long long node, unsigned int enable)
{
    *ret = (int)cudaGraphKernelNodeSetEnabled((cudaGraphDeviceNode_t)node, enable != 0);
    return 0;
}
