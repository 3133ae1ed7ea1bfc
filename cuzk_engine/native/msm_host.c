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

/* The window width c minimising ceil(bits / c) * (m bucket additions + 0.8 * 2^c) for m points
 * with scalars of `bits` bits, the second term standing for the reduction of 2^(c-1) buckets
 * and for the cache misses of wider bucket arrays. The factor is fitted to measurements. */
static unsigned int msm_choose_window(int64_t m, unsigned int bits)
{
    unsigned int best = 2;
    double best_cost = 0;
    for (unsigned int c = 2; c <= 20; c++) {
        const double cost = (double)((bits + c - 1) / c) * ((double)m + 0.8 * (double)(1 << c));
        if (c == 2 || cost < best_cost) {
            best = c;
            best_cost = cost;
        }
    }
    return best;
}

/* GLV: lambda = z^2 - 1 is a cube root of unity mod r (lambda^2 + lambda + 1 = r, z the curve's
 * parameter), and on both groups lambda * (x, y) = (beta x, y) for a cube root of unity beta in
 * Fp (a different one for G1 and G2; both checked against arkworks by the tests). A scalar
 * k < r splits as k = k1 + k2 lambda with k2 = floor(k / lambda) <= lambda + 1 and
 * k1 = k mod lambda, both below 2^128: the MSM then runs over 2m points with 128-bit scalars,
 * the same bucket additions in half the windows, so half the reductions and doublings. */
static const fr_limb msm_glv_lambda[2] = {0x00000000ffffffffULL, 0xac45a4010001a402ULL};
/* floor(2^256 / lambda): for k < 2^255, k mu / 2^256 is within 1/2 below k / lambda, so its
 * floor is floor(k / lambda) or one less */
static const fr_limb msm_glv_mu[3] = {0x63f6e522f6cfee30ULL, 0x7c6becf1e01faaddULL, 1};
#define MSM_GLV_BITS 129 /* the halves' bits plus the signed digits' final carry */

typedef unsigned __int128 msm_u128;

static fr_limb msm_sub_borrow(fr_limb a, fr_limb b, fr_limb *borrow)
{
    const msm_u128 t = (msm_u128)a - b - *borrow;
    *borrow = (fr_limb)(t >> 64) & 1;
    return (fr_limb)t;
}

static void msm_glv_split(const fr_limb *k, fr_limb k1[4], fr_limb k2[4])
{
    typedef msm_u128 u128;
    fr_limb prod[7] = {0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 4; i++) {
        fr_limb carry = 0;
        for (int j = 0; j < 3; j++) {
            const u128 t = (u128)k[i] * msm_glv_mu[j] + prod[i + j] + carry;
            prod[i + j] = (fr_limb)t;
            carry = (fr_limb)(t >> 64);
        }
        prod[i + 3] = carry;
    }
    fr_limb q0 = prod[4], q1 = prod[5]; /* q < 2^128 */
    /* rem = k - q lambda, exact in three limbs (it is below 2 lambda) */
    const u128 a = (u128)q0 * msm_glv_lambda[0];
    const u128 b = (u128)q0 * msm_glv_lambda[1] + (fr_limb)(a >> 64);
    const u128 c = (u128)q1 * msm_glv_lambda[0] + (fr_limb)b;
    const fr_limb ql[3] = {(fr_limb)a, (fr_limb)c,
                           (fr_limb)(b >> 64) + (fr_limb)(c >> 64) + q1 * msm_glv_lambda[1]};
    fr_limb borrow = 0, rem[3];
    for (int i = 0; i < 3; i++) rem[i] = msm_sub_borrow(k[i], ql[i], &borrow);
    if (rem[2] != 0 || rem[1] > msm_glv_lambda[1]
           || (rem[1] == msm_glv_lambda[1] && rem[0] >= msm_glv_lambda[0])) {
        borrow = 0;
        rem[0] = msm_sub_borrow(rem[0], msm_glv_lambda[0], &borrow);
        rem[1] = msm_sub_borrow(rem[1], msm_glv_lambda[1], &borrow);
        rem[2] = msm_sub_borrow(rem[2], 0, &borrow);
        q1 += ++q0 == 0;
    }
    k1[0] = rem[0], k1[1] = rem[1], k1[2] = 0, k1[3] = 0;
    k2[0] = q0, k2[1] = q1, k2[2] = 0, k2[3] = 0;
}

/* lambda * P: (beta x, y), beta in Montgomery form */
static g1_affine_t g1_endomorphism(const g1_affine_t *p)
{
    static const fp_t beta = {{0xcd03c9e48671f071ULL, 0x5dab22461fcda5d2ULL, 0x587042afd3851b95ULL,
                               0x8eb60ebe01bacb9eULL, 0x03f97d6e83d050d2ULL, 0x18f0206554638741ULL}};
    g1_affine_t r = *p;
    r.x = fp_mul(&p->x, &beta);
    return r;
}

static g2_affine_t g2_endomorphism(const g2_affine_t *p)
{
    static const fp_t beta = {{0x30f1361b798a64e8ULL, 0xf3b8ddab7ece5a2aULL, 0x16a8ca3ac61577f7ULL,
                               0xc26a2ff874fd029bULL, 0x3636b76660701c6eULL, 0x051ba4ab241b6160ULL}};
    g2_affine_t r = *p;
    r.x.c0 = fp_mul(&p->x.c0, &beta);
    r.x.c1 = fp_mul(&p->x.c1, &beta);
    return r;
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
