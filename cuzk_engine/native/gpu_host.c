/* Host build of the GPU kernels: the same per-thread bodies as ntt.cu and msm.cu, run in loops,
 * plus element-wise entry points for the Fp and G1 arithmetic they are made of. Loaded through
 * ctypes by cuzk_engine.native.gpu_host so CPU tests can check the device code against arkworks
 * and the CPU backend without a GPU. */
#include "ntt.cu"
#include "msm.cu"

#define FP_VEC_UNARY(name, op)                                                       \
    void name(fp_t *out, const fp_t *a, fr_limb n)                                   \
    {                                                                                \
        for (fr_limb i = 0; i < n; i++) out[i] = op(a + i);                         \
    }
#define FP_VEC_BINARY(name, op)                                                      \
    void name(fp_t *out, const fp_t *a, const fp_t *b, fr_limb n)                    \
    {                                                                                \
        for (fr_limb i = 0; i < n; i++) out[i] = op(a + i, b + i);                  \
    }

FP_VEC_BINARY(fp_mul_vec, fp_mul)
FP_VEC_BINARY(fp_add_vec, fp_add)
FP_VEC_BINARY(fp_sub_vec, fp_sub)
FP_VEC_UNARY(fp_to_mont_vec, fp_to_mont)
FP_VEC_UNARY(fp_from_mont_vec, fp_from_mont)
FP_VEC_UNARY(fp_neg_vec, fp_neg)

void g1_add_vec(g1_jacobian_t *out, const g1_jacobian_t *p, const g1_jacobian_t *q, fr_limb n)
{
    for (fr_limb i = 0; i < n; i++) out[i] = g1_add(p + i, q + i);
}

void g1_add_mixed_vec(g1_jacobian_t *out, const g1_jacobian_t *p, const g1_affine_t *q,
                      fr_limb n)
{
    for (fr_limb i = 0; i < n; i++) out[i] = g1_add_mixed(p + i, q + i);
}

void g1_dbl_vec(g1_jacobian_t *out, const g1_jacobian_t *p, fr_limb n)
{
    for (fr_limb i = 0; i < n; i++) out[i] = g1_dbl(p + i);
}

void g1_mul_small_vec(g1_jacobian_t *out, const g1_jacobian_t *p, const fr_limb *k, fr_limb n)
{
    for (fr_limb i = 0; i < n; i++) out[i] = g1_mul_small(p + i, k[i]);
}
