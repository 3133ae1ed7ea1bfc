/* BLS12-381 G2 (y^2 = x^3 + 4(1 + u) over Fp2) in Jacobian coordinates, Montgomery form:
 * g2_affine_t, g2_jacobian_t, g2_dbl, g2_add, g2_add_mixed, ... from the same group law as G1
 * (jacobian.h). */
#ifndef CUZK_G2_H
#define CUZK_G2_H

#include "fp2.h"
#include "g1.h" /* HD_CALL */

#define JAC_GROUP g2
#define JAC_FIELD fp2
#include "jacobian.h"
#undef JAC_GROUP
#undef JAC_FIELD

#endif
