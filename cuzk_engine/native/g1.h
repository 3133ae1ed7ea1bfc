/* BLS12-381 G1 (y^2 = x^3 + 4 over Fp) in Jacobian coordinates, coordinates in Montgomery form:
 * g1_affine_t, g1_jacobian_t, g1_dbl, g1_add, g1_add_mixed, g1_mul_small and friends, from the
 * group law in jacobian.h (shared with G2 over Fp2). */
#ifndef CUZK_G1_H
#define CUZK_G1_H

#include "fp.h"

/* The point formulas are large (a dozen inlined Montgomery products each); forcing them inline
 * into every caller multiplies the PTX size and NVRTC time, so on the device they stay calls. */
#ifndef HD_CALL
#ifdef __CUDACC__
#define HD_CALL __host__ __device__ __noinline__
#else
#define HD_CALL static
#endif
#endif

#define JAC_GROUP g1
#define JAC_FIELD fp
#include "jacobian.h"
#undef JAC_GROUP
#undef JAC_FIELD

#endif
