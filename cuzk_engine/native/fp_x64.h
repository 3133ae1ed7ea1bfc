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

#if defined(__ADX__) && defined(__BMI2__)
/* The same CIOS product in assembly: mulx leaves the flags alone and adcx / adox carry on two
 * independent flags (CF, OF), so each row's low and high halves add in two interleaved chains
 * the compiler cannot produce from C. Seven registers rotate: after a row's reduction its low
 * limb is zero and the accumulator moves down one register instead of being copied. */
static const fr_limb fp_x64_modulus[FP_LIMBS + 1] = {FP_P0, FP_P1, FP_P2, FP_P3, FP_P4, FP_P5,
                                                     FP_INV};

/* t += a * b[i], then t = (t + m p) / 2^64 with m = t0 * -p^-1; T0..T6 name the rotation */
#define FP_X64_ROW(i, T0, T1, T2, T3, T4, T5, T6)                                           \
    "movq " #i "*8(%[b]), %%rdx\n\t"                                                        \
    "xorl %%eax, %%eax\n\t"                                                                 \
    "mulxq 0(%[a]), %[lo], %[hi]\n\t adoxq %[lo], %[" #T0 "]\n\t adcxq %[hi], %[" #T1 "]\n\t"  \
    "mulxq 8(%[a]), %[lo], %[hi]\n\t adoxq %[lo], %[" #T1 "]\n\t adcxq %[hi], %[" #T2 "]\n\t"  \
    "mulxq 16(%[a]), %[lo], %[hi]\n\t adoxq %[lo], %[" #T2 "]\n\t adcxq %[hi], %[" #T3 "]\n\t" \
    "mulxq 24(%[a]), %[lo], %[hi]\n\t adoxq %[lo], %[" #T3 "]\n\t adcxq %[hi], %[" #T4 "]\n\t" \
    "mulxq 32(%[a]), %[lo], %[hi]\n\t adoxq %[lo], %[" #T4 "]\n\t adcxq %[hi], %[" #T5 "]\n\t" \
    "mulxq 40(%[a]), %[lo], %[" #T6 "]\n\t adoxq %[lo], %[" #T5 "]\n\t"                     \
    "adcxq %%rax, %[" #T6 "]\n\t adoxq %%rax, %[" #T6 "]\n\t"                               \
    "movq %[" #T0 "], %%rdx\n\t"                                                            \
    "imulq 48(%[m]), %%rdx\n\t"                                                             \
    "xorl %%eax, %%eax\n\t"                                                                 \
    "mulxq 0(%[m]), %[lo], %[hi]\n\t adoxq %[lo], %[" #T0 "]\n\t adcxq %[hi], %[" #T1 "]\n\t"  \
    "mulxq 8(%[m]), %[lo], %[hi]\n\t adoxq %[lo], %[" #T1 "]\n\t adcxq %[hi], %[" #T2 "]\n\t"  \
    "mulxq 16(%[m]), %[lo], %[hi]\n\t adoxq %[lo], %[" #T2 "]\n\t adcxq %[hi], %[" #T3 "]\n\t" \
    "mulxq 24(%[m]), %[lo], %[hi]\n\t adoxq %[lo], %[" #T3 "]\n\t adcxq %[hi], %[" #T4 "]\n\t" \
    "mulxq 32(%[m]), %[lo], %[hi]\n\t adoxq %[lo], %[" #T4 "]\n\t adcxq %[hi], %[" #T5 "]\n\t" \
    "mulxq 40(%[m]), %[lo], %[hi]\n\t adoxq %[lo], %[" #T5 "]\n\t adcxq %[hi], %[" #T6 "]\n\t" \
    "adoxq %%rax, %[" #T6 "]\n\t"

static inline __attribute__((always_inline)) fp_t fp_mul(const fp_t *a, const fp_t *b)
{
    fr_limb r0, r1, r2, r3, r4, r5, r6, lo, hi;
    __asm__("xorl %k[r0], %k[r0]\n\t xorl %k[r1], %k[r1]\n\t xorl %k[r2], %k[r2]\n\t"
            "xorl %k[r3], %k[r3]\n\t xorl %k[r4], %k[r4]\n\t xorl %k[r5], %k[r5]\n\t"
            FP_X64_ROW(0, r0, r1, r2, r3, r4, r5, r6)
            FP_X64_ROW(1, r1, r2, r3, r4, r5, r6, r0)
            FP_X64_ROW(2, r2, r3, r4, r5, r6, r0, r1)
            FP_X64_ROW(3, r3, r4, r5, r6, r0, r1, r2)
            FP_X64_ROW(4, r4, r5, r6, r0, r1, r2, r3)
            FP_X64_ROW(5, r5, r6, r0, r1, r2, r3, r4)
            : [r0] "=&r"(r0), [r1] "=&r"(r1), [r2] "=&r"(r2), [r3] "=&r"(r3), [r4] "=&r"(r4),
              [r5] "=&r"(r5), [r6] "=&r"(r6), [lo] "=&r"(lo), [hi] "=&r"(hi)
            : [a] "r"(a->l), [b] "r"(b->l), [m] "r"(fp_x64_modulus), "m"(*a), "m"(*b)
            : "rax", "rdx", "cc");
    /* after six rows the accumulator sits in r6, r0, ..., r4 */
    fp_t r = {{r6, r0, r1, r2, r3, r4}};
    return fp_x64_sub_p_if_ge(&r);
}
#undef FP_X64_ROW

/* the compiler does not inline a call of the product through a one-line wrapper: forced, as
 * the squarings are a sixth of a batched affine addition's products */
#define FP_HAS_HOST_SQR 1
static inline __attribute__((always_inline)) fp_t fp_sqr(const fp_t *a) { return fp_mul(a, a); }

/* a^-1 for the host MSM: the binary extended Euclidean algorithm on the Montgomery
 * representative A = aR (X = A^-1 mod p), then X * R^3 through one Montgomery product gives
 * a^-1 R. Variable time (the MSM's operands are public), about 2.5x faster than Fermat's 570
 * products, which cost ~10% of a whole `prove` at 2^14 (one inversion per batch of additions).
 * 0 maps to 0, as in fp.h. */
#define FP_HAS_HOST_INV 1

static inline int fp_x64_is_one_plain(const fp_t *a)
{
    return a->l[0] == 1 && (a->l[1] | a->l[2] | a->l[3] | a->l[4] | a->l[5]) == 0;
}

static inline int fp_x64_geq(const fp_t *a, const fp_t *b)
{
    for (int i = FP_LIMBS - 1; i >= 0; i--)
        if (a->l[i] != b->l[i]) return a->l[i] > b->l[i];
    return 1;
}

static inline void fp_x64_sub_plain(fp_t *a, const fp_t *b)
{
    unsigned char borrow = 0;
    for (int i = 0; i < FP_LIMBS; i++)
        borrow = _subborrow_u64(borrow, a->l[i], b->l[i], (unsigned long long *)&a->l[i]);
}

/* Strips u's trailing zero bits (u odd afterwards; u != 0) and divides x by the same power
 * of two mod p: x + k p with k = x * (-p^-1) mod 2^s is divisible by 2^s (Montgomery's step). */
static inline void fp_x64_strip(fp_t *u, fp_t *x)
{
    static const fr_limb p[FP_LIMBS] = {FP_P0, FP_P1, FP_P2, FP_P3, FP_P4, FP_P5};
    while (!(u->l[0] & 1)) {
        unsigned int s = u->l[0] ? (unsigned int)__builtin_ctzll(u->l[0]) : 63;
        if (s > 63) s = 63;
        for (int i = 0; i < FP_LIMBS - 1; i++) u->l[i] = (u->l[i] >> s) | (u->l[i + 1] << (64 - s));
        u->l[FP_LIMBS - 1] >>= s;
        const fr_limb k = (x->l[0] * FP_INV) & ((((fr_limb)1) << s) - 1);
        fr_limb t[FP_LIMBS + 1];
        fp_u128 acc = 0;
        for (int i = 0; i < FP_LIMBS; i++) {
            acc += (fp_u128)k * p[i] + x->l[i];
            t[i] = (fr_limb)acc;
            acc >>= 64;
        }
        t[FP_LIMBS] = (fr_limb)acc;
        fp_t r;
        for (int i = 0; i < FP_LIMBS; i++) r.l[i] = (t[i] >> s) | (t[i + 1] << (64 - s));
        *x = fp_x64_sub_p_if_ge(&r); /* (x + k p) / 2^s < 2p */
    }
}

static inline fp_t fp_inv(const fp_t *a)
{
    static const fp_t r3 = {{0xed48ac6bd94ca1e0ULL, 0x315f831e03a7adf8ULL, 0x9a53352a615e29ddULL,
                             0x34c04e5e921e1761ULL, 0x2512d43565724728ULL, 0x0aa6346091755d4dULL}};
    if ((a->l[0] | a->l[1] | a->l[2] | a->l[3] | a->l[4] | a->l[5]) == 0) return *a;
    fp_t u = *a, v = {{FP_P0, FP_P1, FP_P2, FP_P3, FP_P4, FP_P5}};
    fp_t x1 = {{1, 0, 0, 0, 0, 0}}, x2 = {{0, 0, 0, 0, 0, 0}};
    for (;;) { /* x1 A = u and x2 A = v (mod p), u and v odd after each strip */
        fp_x64_strip(&u, &x1);
        if (fp_x64_is_one_plain(&u)) return fp_mul(&x1, &r3);
        fp_x64_strip(&v, &x2);
        if (fp_x64_is_one_plain(&v)) return fp_mul(&x2, &r3);
        if (fp_x64_geq(&u, &v)) {
            fp_x64_sub_plain(&u, &v);
            x1 = fp_sub(&x1, &x2);
        } else {
            fp_x64_sub_plain(&v, &u);
            x2 = fp_sub(&x2, &x1);
        }
    }
}
#else
/* Montgomery product, CIOS with the "no-carry" shortcut: p's top limb is below 2^63 - 1, so
 * the running value fits six limbs plus the two carries of each row, and no seventh limb is
 * kept. Inputs < p give an output < p. */
static inline __attribute__((always_inline)) fp_t fp_mul(const fp_t *a, const fp_t *b)
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

#endif
