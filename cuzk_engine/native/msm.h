/* Bucket-method (Pippenger) G1 MSM, one function per GPU thread.
 *
 * Each body handles one index `t`; msm.cu wraps them in __global__ kernels (t from the grid) and
 * gpu_host.c in plain loops, so the CPU tests run exactly the per-thread code the GPU runs. The
 * glue between the steps (sorting, segment bookkeeping) is array code in cuzk_engine.native.msm_plan.
 *
 * Steps for n scalars split into W windows of c bits:
 *   1. msm_bucket_key: for every (window w, scalar i) a 64-bit key (bucket << 32 | i) with
 *      bucket = w * 2^c + digit; zero digits get MSM_SKIP_BUCKET and sort past every real bucket.
 *   2. the keys are sorted (cupy / numpy), grouping each bucket's points together.
 *   3. msm_accumulate_affine / msm_accumulate_jacobian: each task sums a run of at most a few
 *      dozen consecutive entries of one bucket; repeated until one sum per bucket is left, so a
 *      bucket holding most of the points (0/1 witness values) never serializes on one thread.
 *   4. msm_window_segment: each window's buckets are cut into segments; a segment of buckets
 *      [lo, lo + L) yields sum_d d * B_d by a running sum, and the segments of a window are then
 *      summed by step 3's reduction. The W window sums are combined on the host. */
#ifndef CUZK_MSM_H
#define CUZK_MSM_H

#include "g1.h"

#define MSM_SKIP_BUCKET 0xffffffffULL
#define MSM_SCALAR_LIMBS 4

/* Bits [w*c, w*c + c) of a 256-bit little-endian scalar, c <= 32. */
HD fr_limb msm_window_digit(const fr_limb *scalar, unsigned int w, unsigned int c)
{
    const unsigned int bit = w * c;
    const unsigned int limb = bit / 64;
    const unsigned int offset = bit % 64;
    if (limb >= MSM_SCALAR_LIMBS) return 0;
    fr_limb v = scalar[limb] >> offset;
    if (offset + c > 64 && limb + 1 < MSM_SCALAR_LIMBS) v |= scalar[limb + 1] << (64 - offset);
    return v & ((1ULL << c) - 1);
}

/* t in [0, n * windows): window t / n of scalar t % n. */
HD void msm_bucket_key(fr_limb *keys, const fr_limb *scalars, fr_limb n, unsigned int c,
                       fr_limb t)
{
    const fr_limb w = t / n;
    const fr_limb i = t % n;
    const fr_limb digit = msm_window_digit(scalars + MSM_SCALAR_LIMBS * i, (unsigned int)w, c);
    const fr_limb bucket = digit ? ((w << c) | digit) : MSM_SKIP_BUCKET;
    keys[t] = (bucket << 32) | i;
}

/* Sum of the affine bases named by sorted keys [begin[t], end[t]). */
HD void msm_accumulate_affine(g1_jacobian_t *out, const g1_affine_t *bases, const fr_limb *keys,
                              const long long *begin, const long long *end, fr_limb t)
{
    g1_jacobian_t acc = g1_infinity();
    for (long long k = begin[t]; k < end[t]; k++) {
        const g1_affine_t *p = bases + (keys[k] & 0xffffffffULL);
        acc = g1_add_mixed(&acc, p);
    }
    out[t] = acc;
}

/* Sum of partial sums in[begin[t] .. end[t]). */
HD void msm_accumulate_jacobian(g1_jacobian_t *out, const g1_jacobian_t *in,
                                const long long *begin, const long long *end, fr_limb t)
{
    g1_jacobian_t acc = g1_infinity();
    for (long long k = begin[t]; k < end[t]; k++) acc = g1_add(&acc, in + k);
    out[t] = acc;
}

/* t = w * 2^seg_log + j: segment j of window w covers buckets [lo, lo + L), L = 2^(c - seg_log).
 * Writes sum_{d in segment} d * B_d. With S = sum_{d > lo} B_d and the running-sum total
 * T = sum_{d > lo} (d - lo) * B_d, that is T + lo * (S + B_lo). */
HD void msm_window_segment(g1_jacobian_t *out, const g1_jacobian_t *buckets, unsigned int c,
                           unsigned int seg_log, fr_limb t)
{
    const fr_limb per_segment = 1ULL << (c - seg_log);
    const fr_limb w = t >> seg_log;
    const fr_limb lo = (t & ((1ULL << seg_log) - 1)) * per_segment;
    const g1_jacobian_t *b = buckets + (w << c);
    g1_jacobian_t running = g1_infinity();
    g1_jacobian_t total = g1_infinity();
    for (fr_limb d = lo + per_segment - 1; d > lo; d--) {
        running = g1_add(&running, b + d);
        total = g1_add(&total, &running);
    }
    running = g1_add(&running, b + lo);
    const g1_jacobian_t shifted = g1_mul_small(&running, lo);
    out[t] = g1_add(&total, &shifted);
}

/* Canonical affine x || y limbs (arkworks xy bytes) to Montgomery form, in place. */
HD void msm_bases_to_mont(g1_affine_t *bases, fr_limb t)
{
    bases[t].x = fp_to_mont(&bases[t].x);
    bases[t].y = fp_to_mont(&bases[t].y);
}

#endif
