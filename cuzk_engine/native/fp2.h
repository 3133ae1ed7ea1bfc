/* Fp2 = Fp[u] / (u^2 + 1), the field of G2's coordinates: c0 + c1*u, both in Montgomery form.
 * Same calling style as fp.h (pointers in, values out) so jacobian.h's group law runs over it. */
#ifndef CUZK_FP2_H
#define CUZK_FP2_H

#include "fp.h"

typedef struct {
    fp_t c0, c1;
} fp2_t;

HD fp2_t fp2_zero(void)
{
    fp2_t r;
    r.c0 = fp_zero();
    r.c1 = fp_zero();
    return r;
}

HD fp2_t fp2_one(void)
{
    fp2_t r;
    r.c0 = fp_one();
    r.c1 = fp_zero();
    return r;
}

HD int fp2_is_zero(const fp2_t *a) { return fp_is_zero(&a->c0) && fp_is_zero(&a->c1); }

HD int fp2_eq(const fp2_t *a, const fp2_t *b) { return fp_eq(&a->c0, &b->c0) && fp_eq(&a->c1, &b->c1); }

HD fp2_t fp2_add(const fp2_t *a, const fp2_t *b)
{
    fp2_t r;
    r.c0 = fp_add(&a->c0, &b->c0);
    r.c1 = fp_add(&a->c1, &b->c1);
    return r;
}

HD fp2_t fp2_sub(const fp2_t *a, const fp2_t *b)
{
    fp2_t r;
    r.c0 = fp_sub(&a->c0, &b->c0);
    r.c1 = fp_sub(&a->c1, &b->c1);
    return r;
}

HD fp2_t fp2_dbl(const fp2_t *a) { return fp2_add(a, a); }

HD fp2_t fp2_neg(const fp2_t *a)
{
    fp2_t r;
    r.c0 = fp_neg(&a->c0);
    r.c1 = fp_neg(&a->c1);
    return r;
}

/* Karatsuba: (a0 + a1 u)(b0 + b1 u) = (a0 b0 - a1 b1) + ((a0 + a1)(b0 + b1) - a0 b0 - a1 b1) u */
HD fp2_t fp2_mul(const fp2_t *a, const fp2_t *b)
{
    fp_t v0 = fp_mul(&a->c0, &b->c0);
    fp_t v1 = fp_mul(&a->c1, &b->c1);
    fp_t sa = fp_add(&a->c0, &a->c1);
    fp_t sb = fp_add(&b->c0, &b->c1);
    fp_t m = fp_mul(&sa, &sb);
    fp2_t r;
    r.c0 = fp_sub(&v0, &v1);
    m = fp_sub(&m, &v0);
    r.c1 = fp_sub(&m, &v1);
    return r;
}

/* (a0 + a1 u)^2 = (a0 + a1)(a0 - a1) + 2 a0 a1 u */
HD fp2_t fp2_sqr(const fp2_t *a)
{
    fp_t s = fp_add(&a->c0, &a->c1);
    fp_t d = fp_sub(&a->c0, &a->c1);
    fp_t p = fp_mul(&a->c0, &a->c1);
    fp2_t r;
    r.c0 = fp_mul(&s, &d);
    r.c1 = fp_dbl(&p);
    return r;
}

/* 1 / (a0 + a1 u) = (a0 - a1 u) / (a0^2 + a1^2); 0 maps to 0. */
HD fp2_t fp2_inv(const fp2_t *a)
{
    fp_t t0 = fp_sqr(&a->c0);
    fp_t t1 = fp_sqr(&a->c1);
    t0 = fp_add(&t0, &t1);
    t0 = fp_inv(&t0);
    fp2_t r;
    r.c0 = fp_mul(&a->c0, &t0);
    t1 = fp_mul(&a->c1, &t0);
    r.c1 = fp_neg(&t1);
    return r;
}

#endif
