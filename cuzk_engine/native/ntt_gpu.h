/* Radix-2 NTT over Fr, one function per GPU thread (ntt.cu wraps them in kernels, the host build
 * in loops). Data stays canonical throughout: a Montgomery product of a canonical value with a
 * Montgomery-form twiddle (w*R) is the canonical product, so no conversion pass is needed. */
#ifndef CUZK_NTT_GPU_H
#define CUZK_NTT_GPU_H

#include "fr.h"

HD fr_limb ntt_reverse_bits(fr_limb x, unsigned int log_n)
{
    if (log_n == 0) return 0;
#ifdef __CUDA_ARCH__
    return __brevll(x) >> (64 - log_n);
#else
    fr_limb r = 0;
    for (unsigned int k = 0; k < log_n; k++) r |= ((x >> k) & 1ULL) << (log_n - 1 - k);
    return r;
#endif
}

/* Out-of-place bit-reversal permutation, the input order of the decimation-in-time stages. */
HD void ntt_bit_reverse(fr_limb *out, const fr_limb *in, unsigned int log_n, fr_limb t)
{
    fr_store(out + 4 * ntt_reverse_bits(t, log_n), fr_load(in + 4 * t));
}

/* Butterfly t (of n/2) of stage `stage` (1-based; blocks of 2^stage). twiddles holds
 * omega^k, k < n/2, in Montgomery form. */
HD void ntt_butterfly(fr_limb *a, const fr_limb *twiddles, unsigned int log_n, unsigned int stage,
                      fr_limb t)
{
    const fr_limb half_log = stage - 1;
    const fr_limb j = t & ((1ULL << half_log) - 1);
    const fr_limb i0 = ((t >> half_log) << stage) + j;
    const fr_limb i1 = i0 + (1ULL << half_log);
    const fr_t w = fr_load(twiddles + 4 * (j << (log_n - stage)));
    const fr_t u = fr_load(a + 4 * i0);
    const fr_t v = fr_mul(fr_load(a + 4 * i1), w);
    fr_store(a + 4 * i0, fr_add(u, v));
    fr_store(a + 4 * i1, fr_sub(u, v));
}

/* out[t] = base^t, base and result in Montgomery form: the device twiddle table. */
HD void fr_powers(fr_limb *out, const fr_limb *base, fr_limb t)
{
    fr_store(out + 4 * t, fr_pow_u64(fr_load(base), t));
}

/* a[t] *= c * g^t (c, g Montgomery; a canonical in and out): the coset shift and the 1/n of the
 * inverse transform in one pass. */
HD void fr_scale_powers(fr_limb *a, const fr_limb *c, const fr_limb *g, fr_limb t)
{
    const fr_t factor = fr_mul(fr_load(c), fr_pow_u64(fr_load(g), t));
    fr_store(a + 4 * t, fr_mul(fr_load(a + 4 * t), factor));
}

/* flags[t] = 1 when a[t] >= r: input validation before a transform or an MSM. */
HD void fr_flag_noncanonical(unsigned char *flags, const fr_limb *a, fr_limb t)
{
    const fr_t x = fr_load(a + 4 * t);
    fr_limb borrow = 0;
    fr_sbb(x.l[0], FR_P0, &borrow);
    fr_sbb(x.l[1], FR_P1, &borrow);
    fr_sbb(x.l[2], FR_P2, &borrow);
    fr_sbb(x.l[3], FR_P3, &borrow);
    flags[t] = borrow ? 0 : 1;
}

#endif
