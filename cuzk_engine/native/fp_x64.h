/* fp_add, fp_sub and fp_mul for 64-bit gcc/clang hosts: the same Montgomery arithmetic as the
 * portable bodies in fp.h, written with carry intrinsics and 128-bit products so the compiler
 * emits adc/sbb/mulx chains (about 3x faster than the portable code on the CPU MSM's critical
 * path). fp.h includes it in place of the portable bodies when FP_HOST_FAST is defined on x86-64 (the
 * CPU MSM library); the CUDA kernels and their host test build keep the portable ones. */
#ifndef CUZK_FP_X64_H
#define CUZK_FP_X64_H

#include <x86intrin.h>

typedef unsigned __int128 fp_u128;

/* a - p when that does not borrow, else a (constant time: a mask, not a branch). */
static inline fp_t fp_x64_sub_p_if_ge(const fp_t *a)
{
    static const fr_limb p[FP_LIMBS] = {FP_P0, FP_P1, FP_P2, FP_P3, FP_P4, FP_P5};
    fp_t d;
    unsigned char borrow = 0;
    for (int i = 0; i < FP_LIMBS; i++)
        borrow = _subborrow_u64(borrow, a->l[i], p[i], (unsigned long long *)&d.l[i]);
    const fr_limb keep = (fr_limb)0 - borrow; /* all ones when a < p */
    fp_t r;
    for (int i = 0; i < FP_LIMBS; i++) r.l[i] = (a->l[i] & keep) | (d.l[i] & ~keep);
    return r;
}

/* p < 2^381, so a + b < 2^383 never carries out of six limbs. */
static inline fp_t fp_add(const fp_t *a, const fp_t *b)
{
    fp_t s;
    unsigned char carry = 0;
    for (int i = 0; i < FP_LIMBS; i++)
        carry = _addcarry_u64(carry, a->l[i], b->l[i], (unsigned long long *)&s.l[i]);
    return fp_x64_sub_p_if_ge(&s);
}

static inline fp_t fp_sub(const fp_t *a, const fp_t *b)
{
    static const fr_limb p[FP_LIMBS] = {FP_P0, FP_P1, FP_P2, FP_P3, FP_P4, FP_P5};
    fp_t d;
    unsigned char borrow = 0;
    for (int i = 0; i < FP_LIMBS; i++)
        borrow = _subborrow_u64(borrow, a->l[i], b->l[i], (unsigned long long *)&d.l[i]);
    const fr_limb mask = (fr_limb)0 - borrow; /* add p back when a < b */
    unsigned char carry = 0;
    for (int i = 0; i < FP_LIMBS; i++)
        carry = _addcarry_u64(carry, d.l[i], p[i] & mask, (unsigned long long *)&d.l[i]);
    return d;
}

/* Montgomery product, CIOS with the "no-carry" shortcut: p's top limb is below 2^63 - 1, so
 * the running value fits six limbs plus the two carries of each row, and no seventh limb is
 * kept. Inputs < p give an output < p. */
static inline fp_t fp_mul(const fp_t *a, const fp_t *b)
{
    static const fr_limb p[FP_LIMBS] = {FP_P0, FP_P1, FP_P2, FP_P3, FP_P4, FP_P5};
    fr_limb t[FP_LIMBS] = {0, 0, 0, 0, 0, 0};
#pragma GCC unroll 6
    for (int i = 0; i < FP_LIMBS; i++) {
        const fr_limb bi = b->l[i];
        fp_u128 acc = (fp_u128)a->l[0] * bi + t[0];
        t[0] = (fr_limb)acc;
        fr_limb c1 = (fr_limb)(acc >> 64);
        const fr_limb k = t[0] * FP_INV;
        fp_u128 red = (fp_u128)k * p[0] + t[0];
        fr_limb c2 = (fr_limb)(red >> 64);
#pragma GCC unroll 6
        for (int j = 1; j < FP_LIMBS; j++) {
            acc = (fp_u128)a->l[j] * bi + t[j] + c1;
            t[j] = (fr_limb)acc;
            c1 = (fr_limb)(acc >> 64);
            red = (fp_u128)k * p[j] + t[j] + c2;
            t[j - 1] = (fr_limb)red;
            c2 = (fr_limb)(red >> 64);
        }
        t[FP_LIMBS - 1] = c1 + c2;
    }
    fp_t r;
    for (int i = 0; i < FP_LIMBS; i++) r.l[i] = t[i];
    return fp_x64_sub_p_if_ge(&r);
}

#endif
