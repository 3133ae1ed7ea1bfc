/* G1 bucket-MSM kernels (bodies in msm.h). Also compiles as C: gpu_host.c includes it. */
#include "launch.h"
#include "msm.h"

CUZK_KERNEL(msm_bucket_key, (fr_limb *keys, const fr_limb *scalars, fr_limb n, unsigned int c),
            (keys, scalars, n, c))
CUZK_KERNEL(msm_accumulate_affine,
            (g1_jacobian_t *out, const g1_affine_t *bases, const fr_limb *keys,
             const long long *begin, const long long *end),
            (out, bases, keys, begin, end))
CUZK_KERNEL(msm_accumulate_jacobian,
            (g1_jacobian_t *out, const g1_jacobian_t *in, const long long *begin,
             const long long *end),
            (out, in, begin, end))
CUZK_KERNEL(msm_window_segment,
            (g1_jacobian_t *out, const g1_jacobian_t *buckets, unsigned int c,
             unsigned int seg_log),
            (out, buckets, c, seg_log))
CUZK_KERNEL(msm_bases_to_mont, (g1_affine_t *bases), (bases))
