/* BLS12-381 base field Fp (381-bit prime), Montgomery form with R = 2^384, 6 x 64-bit limbs,
 * little-endian limb order.
 *
 * Like fr.h, one header for gcc (the ctypes test library, gpu_host.c), nvcc and NVRTC (msm.cu);
 * it reuses fr.h's HD macro and 64-bit carry/multiply-accumulate primitives. */
#ifndef CUZK_FP_H
#define CUZK_FP_H

#include "fr.h"

#define FP_LIMBS 6

typedef struct {
    fr_limb l[FP_LIMBS];
} fp_t;

#define FP_P0 0xb9feffffffffaaabULL
#define FP_P1 0x1eabfffeb153ffffULL
#define FP_P2 0x6730d2a0f6b0f624ULL
#define FP_P3 0x64774b84f38512bfULL
#define FP_P4 0x4b1ba7b6434bacd7ULL
#define FP_P5 0x1a0111ea397fe69aULL
/* -p^-1 mod 2^64, the Montgomery reduction factor. */
#define FP_INV 0x89f3fffcfffcfffdULL

HD fp_t fp_modulus(void)
{
    fp_t p = {{FP_P0, FP_P1, FP_P2, FP_P3, FP_P4, FP_P5}};
    return p;
}

/* R^2 mod p: multiplying by it moves a canonical value into Montgomery form. */
HD fp_t fp_r2(void)
{
    fp_t r2 = {{0xf4df1f341c341746ULL, 0x0a76e6a609d104f1ULL, 0x8de5476c4c95b6d5ULL,
                0x67eb88a9939d83c0ULL, 0x9a793e85b519952dULL, 0x11988fe592cae3aaULL}};
    return r2;
}

/* 1 in Montgomery form (R mod p). */
HD fp_t fp_one(void)
{
    fp_t one = {{0x760900000002fffdULL, 0xebf4000bc40c0002ULL, 0x5f48985753c758baULL,
                 0x77ce585370525745ULL, 0x5c071a97a256ec6dULL, 0x15f65ec3fa80e493ULL}};
    return one;
}

HD fp_t fp_zero(void)
{
    fp_t z = {{0, 0, 0, 0, 0, 0}};
    return z;
}

HD int fp_is_zero(const fp_t *a)
{
    fr_limb acc = 0;
    for (int i = 0; i < FP_LIMBS; i++) acc |= a->l[i];
    return acc == 0;
}

HD int fp_eq(const fp_t *a, const fp_t *b)
{
    fr_limb acc = 0;
    for (int i = 0; i < FP_LIMBS; i++) acc |= a->l[i] ^ b->l[i];
    return acc == 0;
}

/* r = a - p when a >= p (a given as 6 limbs plus a carry-out bit), else a. */
HD fp_t fp_reduce_once(const fp_t *a, fr_limb carry)
{
    const fp_t p = fp_modulus();
    fp_t d;
    fr_limb borrow = 0;
    for (int i = 0; i < FP_LIMBS; i++) d.l[i] = fr_sbb(a->l[i], p.l[i], &borrow);
    /* a >= p exactly when the subtraction did not borrow past the carry bit. */
    return (carry >= borrow) ? d : *a;
}

#if defined(FP_HOST_FAST) && defined(__x86_64__) && !defined(__CUDACC__)
#include "fp_x64.h"
#else
HD fp_t fp_add(const fp_t *a, const fp_t *b)
{
    fp_t s;
    fr_limb carry = 0;
    for (int i = 0; i < FP_LIMBS; i++) s.l[i] = fr_adc(a->l[i], b->l[i], &carry);
    return fp_reduce_once(&s, carry);
}

HD fp_t fp_sub(const fp_t *a, const fp_t *b)
{
    const fp_t p = fp_modulus();
    fp_t d;
    fr_limb borrow = 0;
    for (int i = 0; i < FP_LIMBS; i++) d.l[i] = fr_sbb(a->l[i], b->l[i], &borrow);
    if (borrow) {
        fr_limb carry = 0;
        for (int i = 0; i < FP_LIMBS; i++) d.l[i] = fr_adc(d.l[i], p.l[i], &carry);
    }
    return d;
}

/* Montgomery product a*b*R^-1 mod p (CIOS). Inputs < p give an output < p. */
HD fp_t fp_mul(const fp_t *a, const fp_t *b)
{
    const fp_t p = fp_modulus();
    fr_limb t[FP_LIMBS + 2];
    for (int i = 0; i < FP_LIMBS + 2; i++) t[i] = 0;
    for (int i = 0; i < FP_LIMBS; i++) {
        fr_limb carry = 0;
        for (int j = 0; j < FP_LIMBS; j++) t[j] = fr_mac(t[j], a->l[j], b->l[i], &carry);
        fr_limb top = 0;
        t[FP_LIMBS] = fr_adc(t[FP_LIMBS], carry, &top);
        t[FP_LIMBS + 1] = top;

        const fr_limb m = t[0] * FP_INV;
        carry = 0;
        (void)fr_mac(t[0], m, p.l[0], &carry);
        for (int j = 1; j < FP_LIMBS; j++) t[j - 1] = fr_mac(t[j], m, p.l[j], &carry);
        top = 0;
        t[FP_LIMBS - 1] = fr_adc(t[FP_LIMBS], carry, &top);
        t[FP_LIMBS] = t[FP_LIMBS + 1] + top;
    }
    fp_t r;
    for (int i = 0; i < FP_LIMBS; i++) r.l[i] = t[i];
    return fp_reduce_once(&r, t[FP_LIMBS]);
}

#endif

HD fp_t fp_dbl(const fp_t *a) { return fp_add(a, a); }

HD fp_t fp_neg(const fp_t *a)
{
    if (fp_is_zero(a)) return *a;
    const fp_t p = fp_modulus();
    return fp_sub(&p, a);
}

#ifdef FP_HAS_HOST_SQR
/* fp_x64.h's: inlined into the MSM's addition loops like its products */
#else
HD fp_t fp_sqr(const fp_t *a) { return fp_mul(a, a); }
#endif

HD fp_t fp_to_mont(const fp_t *a)
{
    const fp_t r2 = fp_r2();
    return fp_mul(a, &r2);
}

HD fp_t fp_from_mont(const fp_t *a)
{
    fp_t one = fp_zero();
    one.l[0] = 1;
    return fp_mul(a, &one);
}

#ifndef FP_HAS_HOST_INV
/* a^-1 = a^(p-2) (Fermat) for a != 0, Montgomery in and out; 0 maps to 0. Used once per batch
 * of affine additions and per MSM result (the host MSM has a faster one in fp_x64.h). */
HD fp_t fp_inv(const fp_t *a)
{
    const fr_limb e[FP_LIMBS] = {FP_P0 - 2, FP_P1, FP_P2, FP_P3, FP_P4, FP_P5};
    fp_t acc = fp_one();
    for (int limb = FP_LIMBS - 1; limb >= 0; limb--) {
        for (int bit = 63; bit >= 0; bit--) {
            acc = fp_sqr(&acc);
            if ((e[limb] >> bit) & 1) acc = fp_mul(&acc, a);
        }
    }
    return acc;
}
#endif

#endif
