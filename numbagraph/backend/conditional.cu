// Set a CUDA graph condition from device code.
//
// Numba has no binding for cudaGraphSetConditional, so numbagraph declares
// this function with cuda.declare_device("ng_set_condition",
// "int32(uint64, uint32)", link=[this file]); numba compiles it with NVRTC
// when it links a kernel that calls it. Numba's device ABI returns through
// the first pointer argument.
//
// A kernel recorded into pass p of an unrolled loop is given, for the loop's
// condition, a pass tag instead of the handle: NG_PASS_TAG in the top byte,
// p in the next, and in the low 48 bits the address of the loop's state,
// whose first int is the last pass of the iteration that may run and whose
// second says the loop was stopped. Setting a tag to 0 ends the loop after
// pass p; the loop's own kernel then sets the real condition.

typedef unsigned long long cudaGraphConditionalHandle;

extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(
    cudaGraphConditionalHandle handle, unsigned int value);

#define NG_PASS_TAG 0xA5ull
#define NG_ADDRESS_BITS 48

extern "C" __device__ int ng_set_condition(int* ret, unsigned long long handle,
                                           unsigned int value)
{
    if ((handle >> 56) == NG_PASS_TAG) {
        int* state = (int*)(handle & ((1ull << NG_ADDRESS_BITS) - 1));
        int pass = (int)((handle >> NG_ADDRESS_BITS) & 0xFF);
        if (value == 0) {
            atomicMin(state, pass);
            atomicExch(state + 1, 1);
        }
    } else {
        cudaGraphSetConditional((cudaGraphConditionalHandle)handle, value);
    }
    *ret = 0;
    return 0;
}
