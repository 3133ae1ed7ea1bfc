/* BLS12-381 G1 (y^2 = x^3 + 4 over Fp) in Jacobian coordinates, coordinates in Montgomery form.
 *
 * Jacobian (X, Y, Z) stands for the affine point (X/Z^2, Y/Z^3); Z = 0 is the point at infinity.
 * Affine inputs use all-zero coordinates for infinity, the same convention as arkworks'
 * uncompressed xy bytes ((0, 0) is not on the curve, so nothing real collides with it).
 * Formulas: dbl-2009-l, add-2007-bl and madd-2007-bl from the Explicit-Formulas Database (a = 0),
 * with the exceptional cases (equal or opposite inputs, infinity) handled explicitly because
 * bucket sums hit them whenever the same base lands in one bucket twice. */
#ifndef CUZK_G1_H
#define CUZK_G1_H

#include "fp.h"

/* The point formulas are large (a dozen inlined Montgomery products each); forcing them inline
 * into every caller multiplies the PTX size and NVRTC time, so on the device they stay calls. */
#ifdef __CUDACC__
#define HD_CALL __host__ __device__ __noinline__
#else
#define HD_CALL static
#endif

typedef struct {
    fp_t x, y;
} g1_affine_t;

typedef struct {
    fp_t x, y, z;
} g1_jacobian_t;

HD g1_jacobian_t g1_infinity(void)
{
    g1_jacobian_t r;
    r.x = fp_one();
    r.y = fp_one();
    r.z = fp_zero();
    return r;
}

HD int g1_is_infinity(const g1_jacobian_t *p) { return fp_is_zero(&p->z); }

HD int g1_affine_is_infinity(const g1_affine_t *p)
{
    return fp_is_zero(&p->x) && fp_is_zero(&p->y);
}

HD g1_jacobian_t g1_from_affine(const g1_affine_t *p)
{
    if (g1_affine_is_infinity(p)) return g1_infinity();
    g1_jacobian_t r;
    r.x = p->x;
    r.y = p->y;
    r.z = fp_one();
    return r;
}

HD_CALL g1_jacobian_t g1_dbl(const g1_jacobian_t *p)
{
    if (g1_is_infinity(p)) return *p;
    fp_t a = fp_sqr(&p->x);
    fp_t b = fp_sqr(&p->y);
    fp_t c = fp_sqr(&b);
    fp_t t = fp_add(&p->x, &b);
    t = fp_sqr(&t);
    t = fp_sub(&t, &a);
    t = fp_sub(&t, &c);
    fp_t d = fp_dbl(&t);
    fp_t e = fp_dbl(&a);
    e = fp_add(&e, &a);
    fp_t f = fp_sqr(&e);
    g1_jacobian_t r;
    fp_t d2 = fp_dbl(&d);
    r.x = fp_sub(&f, &d2);
    fp_t c8 = fp_dbl(&c);
    c8 = fp_dbl(&c8);
    c8 = fp_dbl(&c8);
    t = fp_sub(&d, &r.x);
    t = fp_mul(&e, &t);
    r.y = fp_sub(&t, &c8);
    t = fp_mul(&p->y, &p->z);
    r.z = fp_dbl(&t);
    return r;
}

HD_CALL g1_jacobian_t g1_add(const g1_jacobian_t *p, const g1_jacobian_t *q)
{
    if (g1_is_infinity(p)) return *q;
    if (g1_is_infinity(q)) return *p;
    fp_t z1z1 = fp_sqr(&p->z);
    fp_t z2z2 = fp_sqr(&q->z);
    fp_t u1 = fp_mul(&p->x, &z2z2);
    fp_t u2 = fp_mul(&q->x, &z1z1);
    fp_t s1 = fp_mul(&p->y, &q->z);
    s1 = fp_mul(&s1, &z2z2);
    fp_t s2 = fp_mul(&q->y, &p->z);
    s2 = fp_mul(&s2, &z1z1);
    fp_t h = fp_sub(&u2, &u1);
    fp_t rr = fp_sub(&s2, &s1);
    if (fp_is_zero(&h)) {
        if (fp_is_zero(&rr)) return g1_dbl(p);
        return g1_infinity();
    }
    rr = fp_dbl(&rr);
    fp_t i = fp_dbl(&h);
    i = fp_sqr(&i);
    fp_t j = fp_mul(&h, &i);
    fp_t v = fp_mul(&u1, &i);
    g1_jacobian_t r;
    fp_t t = fp_sqr(&rr);
    t = fp_sub(&t, &j);
    fp_t v2 = fp_dbl(&v);
    r.x = fp_sub(&t, &v2);
    t = fp_sub(&v, &r.x);
    t = fp_mul(&rr, &t);
    fp_t s1j = fp_mul(&s1, &j);
    s1j = fp_dbl(&s1j);
    r.y = fp_sub(&t, &s1j);
    t = fp_add(&p->z, &q->z);
    t = fp_sqr(&t);
    t = fp_sub(&t, &z1z1);
    t = fp_sub(&t, &z2z2);
    r.z = fp_mul(&t, &h);
    return r;
}

/* p + q with q affine (Z = 1): the bucket-accumulation step. */
HD_CALL g1_jacobian_t g1_add_mixed(const g1_jacobian_t *p, const g1_affine_t *q)
{
    if (g1_affine_is_infinity(q)) return *p;
    if (g1_is_infinity(p)) return g1_from_affine(q);
    fp_t z1z1 = fp_sqr(&p->z);
    fp_t u2 = fp_mul(&q->x, &z1z1);
    fp_t s2 = fp_mul(&q->y, &p->z);
    s2 = fp_mul(&s2, &z1z1);
    fp_t h = fp_sub(&u2, &p->x);
    fp_t rr = fp_sub(&s2, &p->y);
    if (fp_is_zero(&h)) {
        if (fp_is_zero(&rr)) return g1_dbl(p);
        return g1_infinity();
    }
    rr = fp_dbl(&rr);
    fp_t hh = fp_sqr(&h);
    fp_t i = fp_dbl(&hh);
    i = fp_dbl(&i);
    fp_t j = fp_mul(&h, &i);
    fp_t v = fp_mul(&p->x, &i);
    g1_jacobian_t r;
    fp_t t = fp_sqr(&rr);
    t = fp_sub(&t, &j);
    fp_t v2 = fp_dbl(&v);
    r.x = fp_sub(&t, &v2);
    t = fp_sub(&v, &r.x);
    t = fp_mul(&rr, &t);
    fp_t yj = fp_mul(&p->y, &j);
    yj = fp_dbl(&yj);
    r.y = fp_sub(&t, &yj);
    t = fp_add(&p->z, &h);
    t = fp_sqr(&t);
    t = fp_sub(&t, &z1z1);
    r.z = fp_sub(&t, &hh);
    return r;
}

/* k*p for a small non-negative k (bucket offsets in the window reduction), double-and-add. */
HD_CALL g1_jacobian_t g1_mul_small(const g1_jacobian_t *p, fr_limb k)
{
    g1_jacobian_t acc = g1_infinity();
    for (int bit = 63; bit >= 0; bit--) {
        acc = g1_dbl(&acc);
        if ((k >> bit) & 1) acc = g1_add(&acc, p);
    }
    return acc;
}

#endif
