/* Host (CPU) MSMs for G1 and G2, built with the system C compiler (-pthread) and loaded through
 * ctypes by cuzk_engine.native.msm. The group law is the one the CUDA kernels use (jacobian.h
 * via g1.h / g2.h); the Pippenger driver (msm_cpu.h) is instantiated once per group. Every
 * point crosses the boundary as canonical LE affine limbs (arkworks' xy bytes), every scalar as
 * 4 canonical LE limbs. */
#define FP_HOST_FAST /* fp_x64.h: the carry-chain Fp arithmetic */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "g2.h"
#include "msm.h" /* msm_window_digit */

#define MSM_MAX_THREADS 64

/* what a pending batched affine addition turns out to be */
enum { MSM_ADD = 0, MSM_DOUBLE = 1, MSM_CANCEL = 2 };
/* indices of the optional stats array an MSM fills (cuzk_engine.native.msm.STATS) */
enum {
    MSM_STAT_WINDOW, MSM_STAT_WINDOWS, MSM_STAT_GENERAL, MSM_STAT_ONES, MSM_STAT_BUCKET_ADDS,
    MSM_STAT_REDUCTION_ADDS, MSM_STAT_DOUBLINGS, MSM_STAT_COUNT
};
#define MSM_LANES 4 /* independent product chains in a batch inversion (msm_cpu.h) */

static fp_t fp_load_mont(const fr_limb *src)
{
    fp_t a;
    for (int i = 0; i < FP_LIMBS; i++) a.l[i] = src[i];
    return fp_to_mont(&a);
}

static void fp_store_canonical(fr_limb *dst, const fp_t *a)
{
    const fp_t c = fp_from_mont(a);
    for (int i = 0; i < FP_LIMBS; i++) dst[i] = c.l[i];
}

static fp2_t fp2_load_mont(const fr_limb *src)
{
    fp2_t a;
    a.c0 = fp_load_mont(src);
    a.c1 = fp_load_mont(src + FP_LIMBS);
    return a;
}

static void fp2_store_canonical(fr_limb *dst, const fp2_t *a)
{
    fp_store_canonical(dst, &a->c0);
    fp_store_canonical(dst + FP_LIMBS, &a->c1);
}

/* The window width c minimising ceil(256 / c) * (m bucket additions + 0.6 * 2^c), the second
 * term standing for the reduction of 2^(c-1) buckets (a mixed and a full Jacobian addition
 * each) and for the cache misses of wider bucket arrays. The factor is fitted to measurements
 * (best c: 12 at 2^14 points, 13 at 2^16). */
static unsigned int msm_choose_window(int64_t m)
{
    unsigned int best = 2;
    double best_cost = 0;
    for (unsigned int c = 2; c <= 20; c++) {
        const double cost = (double)((256 + c - 1) / c) * ((double)m + 0.6 * (double)(1 << c));
        if (c == 2 || cost < best_cost) {
            best = c;
            best_cost = cost;
        }
    }
    return best;
}

#define JAC_GROUP g1
#define JAC_FIELD fp
#define MSM_COORD_LIMBS FP_LIMBS
#include "msm_cpu.h"
#undef JAC_GROUP
#undef JAC_FIELD
#undef MSM_COORD_LIMBS

#define JAC_GROUP g2
#define JAC_FIELD fp2
#define MSM_COORD_LIMBS (2 * FP_LIMBS)
#include "msm_cpu.h"
#undef JAC_GROUP
#undef JAC_FIELD
#undef MSM_COORD_LIMBS
