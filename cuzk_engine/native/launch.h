/* One definition per kernel, two builds: under CUDA, CUZK_KERNEL(name, params, args) defines the
 * grid kernel `name_all(params..., count)` running body `name(args..., t)` for t < count on one
 * thread each; under gcc it defines a host function of the same name and signature that loops
 * t = 0 .. count - 1. The CPU tests call the host build through ctypes, so they exercise the very
 * per-thread bodies the GPU runs. */
#ifndef CUZK_LAUNCH_H
#define CUZK_LAUNCH_H

#include "fr.h"

#define CUZK_UNPAREN(...) __VA_ARGS__

#ifdef __CUDACC__
#define CUZK_KERNEL(name, params, args)                                                  \
    extern "C" __global__ void name##_all(CUZK_UNPAREN params, fr_limb count)            \
    {                                                                                    \
        const fr_limb t = (fr_limb)blockIdx.x * blockDim.x + threadIdx.x;               \
        if (t < count) name(CUZK_UNPAREN args, t);                                       \
    }
#else
#define CUZK_KERNEL(name, params, args)                                                  \
    void name##_all(CUZK_UNPAREN params, fr_limb count)                                  \
    {                                                                                    \
        for (fr_limb t = 0; t < count; t++) name(CUZK_UNPAREN args, t);                  \
    }
#endif

#endif
