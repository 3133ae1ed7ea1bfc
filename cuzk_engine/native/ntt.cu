/* Fr NTT kernels (bodies in ntt_gpu.h). Also compiles as C: gpu_host.c includes it. */
#include "launch.h"
#include "ntt_gpu.h"

CUZK_KERNEL(ntt_bit_reverse, (fr_limb *out, const fr_limb *in, unsigned int log_n),
            (out, in, log_n))
CUZK_KERNEL(ntt_butterfly,
            (fr_limb *a, const fr_limb *twiddles, unsigned int log_n, unsigned int stage),
            (a, twiddles, log_n, stage))
CUZK_KERNEL(fr_powers, (fr_limb *out, const fr_limb *base), (out, base))
CUZK_KERNEL(fr_scale_powers, (fr_limb *a, const fr_limb *c, const fr_limb *g), (a, c, g))
CUZK_KERNEL(fr_flag_noncanonical, (unsigned char *flags, const fr_limb *a), (flags, a))
