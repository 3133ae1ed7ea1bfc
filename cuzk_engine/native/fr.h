/* BLS12-381 scalar field Fr in Montgomery form: 4 x 64-bit little-endian limbs, R = 2^256.
 *
 * One header for three compilers: gcc/clang (host library loaded through ctypes), nvcc, and
 * NVRTC (which has no libc headers). Every function is HD: `static inline` on the host and
 * `__host__ __device__ __forceinline__` under CUDA. The 64x64->128 multiply uses __int128 on
 * the host and __umul64hi on the device, so no __int128 reaches device code.
 *
 * Values passed in and out of the host library are canonical (< r, not Montgomery); kernels
 * convert with fr_to_mont / fr_from_mont at their edges.
 */
#ifndef CUZK_FR_H
#define CUZK_FR_H

#ifdef __CUDACC__
#define HD __host__ __device__ __forceinline__
#else
#define HD static inline
#endif

typedef unsigned long long fr_limb;   /* 64 bits on every target we build for */

typedef struct { fr_limb l[4]; } fr_t;

/* r = 0x73eda753299d7d483339d80809a1d80553bda402fffe5bfeffffffff00000001 */
#define FR_P0 0xffffffff00000001ULL
#define FR_P1 0x53bda402fffe5bfeULL
#define FR_P2 0x3339d80809a1d805ULL
#define FR_P3 0x73eda753299d7d48ULL
/* -r^-1 mod 2^64 */
#define FR_INV 0xfffffffeffffffffULL
/* R^2 mod r, to enter Montgomery form */
#define FR_R2_0 0xc999e990f3f29c6dULL
#define FR_R2_1 0x2b6cedcb87925c23ULL
#define FR_R2_2 0x05d314967254398fULL
#define FR_R2_3 0x0748d9d99f59ff11ULL
/* R mod r: the Montgomery form of 1 */
#define FR_R_0 0x00000001fffffffeULL
#define FR_R_1 0x5884b7fa00034802ULL
#define FR_R_2 0x998c4fefecbc4ff5ULL
#define FR_R_3 0x1824b159acc5056fULL

HD fr_limb fr_mulhi(fr_limb a, fr_limb b) {
#ifdef __CUDA_ARCH__
    return __umul64hi(a, b);
#else
    return (fr_limb)(((unsigned __int128)a * b) >> 64);
#endif
}

/* a + b + carry_in; returns the sum, writes the carry out (0 or 1). */
HD fr_limb fr_adc(fr_limb a, fr_limb b, fr_limb *carry) {
    fr_limb s = a + *carry;
    fr_limb c1 = s < a;
    fr_limb t = s + b;
    *carry = c1 + (t < s);
    return t;
}

/* a - b - borrow_in; returns the difference, writes the borrow out (0 or 1). */
HD fr_limb fr_sbb(fr_limb a, fr_limb b, fr_limb *borrow) {
    fr_limb d = a - b;
    fr_limb b1 = a < b;
    fr_limb e = d - *borrow;
    *borrow = b1 + (d < *borrow);
    return e;
}

/* acc + a*b + carry: (lo returned, hi in *carry). Cannot overflow 128 bits. */
HD fr_limb fr_mac(fr_limb acc, fr_limb a, fr_limb b, fr_limb *carry) {
    fr_limb lo = a * b;
    fr_limb hi = fr_mulhi(a, b);
    lo += acc;
    hi += lo < acc;
    lo += *carry;
    hi += lo < *carry;
    *carry = hi;
    return lo;
}

HD fr_t fr_modulus(void) {
    fr_t p = {{FR_P0, FR_P1, FR_P2, FR_P3}};
    return p;
}

HD fr_t fr_zero(void) {
    fr_t z = {{0, 0, 0, 0}};
    return z;
}

HD fr_t fr_mont_one(void) {
    fr_t o = {{FR_R_0, FR_R_1, FR_R_2, FR_R_3}};
    return o;
}

HD int fr_is_zero(fr_t a) {
    return (a.l[0] | a.l[1] | a.l[2] | a.l[3]) == 0;
}

/* Subtract r once if x >= r (x < 2r on entry); `hi` is a fifth limb above x. */
HD fr_t fr_reduce_once(fr_t x, fr_limb hi) {
    fr_limb borrow = 0;
    fr_t d;
    d.l[0] = fr_sbb(x.l[0], FR_P0, &borrow);
    d.l[1] = fr_sbb(x.l[1], FR_P1, &borrow);
    d.l[2] = fr_sbb(x.l[2], FR_P2, &borrow);
    d.l[3] = fr_sbb(x.l[3], FR_P3, &borrow);
    fr_sbb(hi, 0, &borrow);
    return borrow ? x : d;
}

HD fr_t fr_add(fr_t a, fr_t b) {
    fr_limb c = 0;
    fr_t s;
    s.l[0] = fr_adc(a.l[0], b.l[0], &c);
    s.l[1] = fr_adc(a.l[1], b.l[1], &c);
    s.l[2] = fr_adc(a.l[2], b.l[2], &c);
    s.l[3] = fr_adc(a.l[3], b.l[3], &c);
    return fr_reduce_once(s, c);
}

HD fr_t fr_sub(fr_t a, fr_t b) {
    fr_limb borrow = 0;
    fr_t d;
    d.l[0] = fr_sbb(a.l[0], b.l[0], &borrow);
    d.l[1] = fr_sbb(a.l[1], b.l[1], &borrow);
    d.l[2] = fr_sbb(a.l[2], b.l[2], &borrow);
    d.l[3] = fr_sbb(a.l[3], b.l[3], &borrow);
    if (borrow) {
        fr_limb c = 0;
        d.l[0] = fr_adc(d.l[0], FR_P0, &c);
        d.l[1] = fr_adc(d.l[1], FR_P1, &c);
        d.l[2] = fr_adc(d.l[2], FR_P2, &c);
        d.l[3] = fr_adc(d.l[3], FR_P3, &c);
    }
    return d;
}

/* Montgomery product a*b*R^-1 mod r (CIOS). Inputs < r, output < r. */
HD fr_t fr_mul(fr_t a, fr_t b) {
    const fr_limb p[4] = {FR_P0, FR_P1, FR_P2, FR_P3};
    fr_limb t[6] = {0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 4; i++) {
        fr_limb carry = 0;
        for (int j = 0; j < 4; j++) t[j] = fr_mac(t[j], a.l[i], b.l[j], &carry);
        fr_limb c2 = 0;
        t[4] = fr_adc(t[4], carry, &c2);
        t[5] = c2;

        fr_limb m = t[0] * FR_INV;
        carry = 0;
        fr_mac(t[0], m, p[0], &carry);
        for (int j = 1; j < 4; j++) t[j - 1] = fr_mac(t[j], m, p[j], &carry);
        c2 = 0;
        t[3] = fr_adc(t[4], carry, &c2);
        t[4] = t[5] + c2;
    }
    fr_t res = {{t[0], t[1], t[2], t[3]}};
    return fr_reduce_once(res, t[4]);
}

HD fr_t fr_sqr(fr_t a) { return fr_mul(a, a); }

HD fr_t fr_to_mont(fr_t a) {
    fr_t r2 = {{FR_R2_0, FR_R2_1, FR_R2_2, FR_R2_3}};
    return fr_mul(a, r2);
}

HD fr_t fr_from_mont(fr_t a) {
    fr_t one = {{1, 0, 0, 0}};
    return fr_mul(a, one);
}

/* base^e for a Montgomery-form base and a plain 64-bit exponent. */
HD fr_t fr_pow_u64(fr_t base, fr_limb e) {
    fr_t acc = fr_mont_one();
    while (e) {
        if (e & 1) acc = fr_mul(acc, base);
        base = fr_sqr(base);
        e >>= 1;
    }
    return acc;
}

HD fr_t fr_load(const fr_limb *src) {
    fr_t x = {{src[0], src[1], src[2], src[3]}};
    return x;
}

HD void fr_store(fr_limb *dst, fr_t x) {
    dst[0] = x.l[0];
    dst[1] = x.l[1];
    dst[2] = x.l[2];
    dst[3] = x.l[3];
}

#endif /* CUZK_FR_H */
