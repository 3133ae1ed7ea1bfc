/* Host (CPU) vector kernels over Fr, built from fr.h with the system C compiler and loaded
 * through ctypes. Every array is n x 4 little-endian 64-bit limbs of canonical values; the
 * Montgomery form stays inside each call. The kernels hold no global state, so Python may run
 * several of them at once in threads (ctypes releases the GIL for the duration of a call).
 */
#include <stdint.h>
#include <stdlib.h>
#include "fr.h"

static void to_mont_all(fr_limb *a, int64_t n) {
    for (int64_t i = 0; i < n; i++) fr_store(a + 4 * i, fr_to_mont(fr_load(a + 4 * i)));
}

static void from_mont_all(fr_limb *a, int64_t n) {
    for (int64_t i = 0; i < n; i++) fr_store(a + 4 * i, fr_from_mont(fr_load(a + 4 * i)));
}

static void bit_reverse(fr_limb *a, int64_t n, int log_n) {
    for (int64_t i = 0; i < n; i++) {
        int64_t j = 0;
        for (int k = 0; k < log_n; k++) j |= ((i >> k) & 1) << (log_n - 1 - k);
        if (j > i) {
            for (int w = 0; w < 4; w++) {
                fr_limb t = a[4 * i + w];
                a[4 * i + w] = a[4 * j + w];
                a[4 * j + w] = t;
            }
        }
    }
}

/* In-place radix-2 decimation-in-time NTT: a[k] <- sum_j a[j] * omega^(jk).
 * omega must be a primitive 2^log_n-th root of unity (canonical). Returns 0, or -1 when the
 * twiddle table cannot be allocated. */
int fr_ntt(fr_limb *a, int log_n, const fr_limb *omega) {
    int64_t n = (int64_t)1 << log_n;
    if (n == 1) return 0;
    fr_t *tw = (fr_t *)malloc(sizeof(fr_t) * (size_t)(n / 2));
    if (!tw) return -1;
    fr_t w = fr_to_mont(fr_load(omega));
    tw[0] = fr_mont_one();
    for (int64_t i = 1; i < n / 2; i++) tw[i] = fr_mul(tw[i - 1], w);

    to_mont_all(a, n);
    bit_reverse(a, n, log_n);
    for (int s = 1; s <= log_n; s++) {
        int64_t half = (int64_t)1 << (s - 1);
        int64_t stride = n >> s;  /* twiddle index step for this stage */
        for (int64_t start = 0; start < n; start += 2 * half) {
            for (int64_t j = 0; j < half; j++) {
                fr_limb *x = a + 4 * (start + j);
                fr_limb *y = a + 4 * (start + j + half);
                fr_t u = fr_load(x);
                fr_t v = fr_mul(fr_load(y), tw[j * stride]);
                fr_store(x, fr_add(u, v));
                fr_store(y, fr_sub(u, v));
            }
        }
    }
    from_mont_all(a, n);
    free(tw);
    return 0;
}

/* a[i] <- a[i] * c */
void fr_scale(fr_limb *a, int64_t n, const fr_limb *c) {
    fr_t cm = fr_to_mont(fr_load(c));
    for (int64_t i = 0; i < n; i++) fr_store(a + 4 * i, fr_mul(fr_load(a + 4 * i), cm));
}

/* a[i] <- a[i] * g^i  (moves evaluations onto / off the coset g*H) */
void fr_scale_powers(fr_limb *a, int64_t n, const fr_limb *g) {
    fr_t gm = fr_to_mont(fr_load(g));
    fr_t acc = fr_mont_one();
    for (int64_t i = 0; i < n; i++) {
        fr_store(a + 4 * i, fr_mul(fr_load(a + 4 * i), acc));
        acc = fr_mul(acc, gm);
    }
}

/* out[i] <- (a[i] * b[i] - c[i]) * z; out may alias any input. This is the quotient step of
 * Groth16's H: on a coset the vanishing polynomial is the constant z^-1. */
void fr_abc_quotient(fr_limb *out, const fr_limb *a, const fr_limb *b, const fr_limb *c,
                     int64_t n, const fr_limb *z) {
    fr_t zm = fr_to_mont(fr_load(z));
    for (int64_t i = 0; i < n; i++) {
        /* mont(a) * b = a*b (canonical), so one conversion per element suffices */
        fr_t ab = fr_mul(fr_to_mont(fr_load(a + 4 * i)), fr_load(b + 4 * i));
        fr_store(out + 4 * i, fr_mul(fr_sub(ab, fr_load(c + 4 * i)), zm));
    }
}

/* out[i] <- a[i] * b[i] */
void fr_mul_vec(fr_limb *out, const fr_limb *a, const fr_limb *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        fr_t am = fr_to_mont(fr_load(a + 4 * i));
        fr_store(out + 4 * i, fr_mul(am, fr_load(b + 4 * i)));
    }
}

/* One Poseidon permutation (x^5 S-box, width 3) with the trace its values-only gadget records:
 * per S-box its input x, x^2, x^4 and x^5; after every `compact_every`-th partial round lanes
 * 1 and 2 (the values re-allocated there); then the output state. `state` (3), `constants`
 * (3 per round) and `mds` (3 x 3, row-major) are canonical; so is every element written to
 * `trace`, which holds `capacity` elements. Returns the number of elements written, or -1
 * (writing nothing) when they would not fit. */
int64_t fr_poseidon_trace(fr_limb *trace, int64_t capacity, const fr_limb *state,
                          const fr_limb *constants, const fr_limb *mds, int full_rounds,
                          int partial_rounds, int compact_every) {
    if (compact_every < 1 ||
        4 * (3 * (int64_t)full_rounds + partial_rounds) + 2 * (partial_rounds / compact_every) + 3
            > capacity)
        return -1;
    fr_t s[3], m[9];
    for (int i = 0; i < 3; i++) s[i] = fr_to_mont(fr_load(state + 4 * i));
    for (int i = 0; i < 9; i++) m[i] = fr_to_mont(fr_load(mds + 4 * i));
    int half = full_rounds / 2;
    int64_t pos = 0;
    for (int r = 0; r < full_rounds + partial_rounds; r++) {
        for (int i = 0; i < 3; i++)
            s[i] = fr_add(s[i], fr_to_mont(fr_load(constants + 4 * (3 * r + i))));
        int full = r < half || r >= half + partial_rounds;
        for (int i = 0; i < (full ? 3 : 1); i++) {
            fr_t x2 = fr_sqr(s[i]), x4 = fr_sqr(x2), x5 = fr_mul(x4, s[i]);
            fr_store(trace + 4 * pos++, fr_from_mont(s[i]));
            fr_store(trace + 4 * pos++, fr_from_mont(x2));
            fr_store(trace + 4 * pos++, fr_from_mont(x4));
            fr_store(trace + 4 * pos++, fr_from_mont(x5));
            s[i] = x5;
        }
        if (!full && (r - half) % compact_every == compact_every - 1) {
            fr_store(trace + 4 * pos++, fr_from_mont(s[1]));
            fr_store(trace + 4 * pos++, fr_from_mont(s[2]));
        }
        fr_t t[3];
        for (int j = 0; j < 3; j++)
            t[j] = fr_add(fr_add(fr_mul(m[3 * j], s[0]), fr_mul(m[3 * j + 1], s[1])),
                          fr_mul(m[3 * j + 2], s[2]));
        s[0] = t[0]; s[1] = t[1]; s[2] = t[2];
    }
    for (int i = 0; i < 3; i++) fr_store(trace + 4 * pos++, fr_from_mont(s[i]));
    return pos;
}
