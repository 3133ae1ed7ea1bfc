/* The a = 0 short-Weierstrass group law in Jacobian coordinates, written once over an abstract
 * field and instantiated per group: g1.h over Fp (y^2 = x^3 + 4), g2.h over Fp2
 * (y^2 = x^3 + 4(1 + u)). The formulas never use b, so one text serves both curves.
 *
 * Before each inclusion define JAC_GROUP (the name prefix, e.g. g1) and JAC_FIELD (the field
 * prefix, e.g. fp). The field must provide F_t and F_zero, F_one, F_is_zero, F_add, F_sub,
 * F_dbl, F_mul, F_sqr taking pointers, as fp.h and fp2.h do. No include guard: it is meant to be
 * included once per group.
 *
 * Jacobian (X, Y, Z) stands for the affine point (X/Z^2, Y/Z^3); Z = 0 is the point at infinity.
 * Affine inputs use all-zero coordinates for infinity, the same convention as arkworks'
 * uncompressed xy bytes ((0, 0) is not on either curve, so nothing real collides with it).
 * Formulas: dbl-2009-l, add-2007-bl and madd-2007-bl from the Explicit-Formulas Database (a = 0),
 * with the exceptional cases (equal or opposite inputs, infinity) handled explicitly because
 * bucket sums hit them whenever the same base lands in one bucket twice. */

#define JAC_CAT2(a, b) a##_##b
#define JAC_CAT(a, b) JAC_CAT2(a, b)
#define G_(name) JAC_CAT(JAC_GROUP, name)
#define F_(name) JAC_CAT(JAC_FIELD, name)

typedef struct {
    F_(t) x, y;
} G_(affine_t);

typedef struct {
    F_(t) x, y, z;
} G_(jacobian_t);

HD G_(jacobian_t) G_(infinity)(void)
{
    G_(jacobian_t) r;
    r.x = F_(one)();
    r.y = F_(one)();
    r.z = F_(zero)();
    return r;
}

HD int G_(is_infinity)(const G_(jacobian_t) *p) { return F_(is_zero)(&p->z); }

HD int G_(affine_is_infinity)(const G_(affine_t) *p)
{
    return F_(is_zero)(&p->x) && F_(is_zero)(&p->y);
}

HD G_(jacobian_t) G_(from_affine)(const G_(affine_t) *p)
{
    if (G_(affine_is_infinity)(p)) return G_(infinity)();
    G_(jacobian_t) r;
    r.x = p->x;
    r.y = p->y;
    r.z = F_(one)();
    return r;
}

HD_CALL G_(jacobian_t) G_(dbl)(const G_(jacobian_t) *p)
{
    if (G_(is_infinity)(p)) return *p;
    F_(t) a = F_(sqr)(&p->x);
    F_(t) b = F_(sqr)(&p->y);
    F_(t) c = F_(sqr)(&b);
    F_(t) t = F_(add)(&p->x, &b);
    t = F_(sqr)(&t);
    t = F_(sub)(&t, &a);
    t = F_(sub)(&t, &c);
    F_(t) d = F_(dbl)(&t);
    F_(t) e = F_(dbl)(&a);
    e = F_(add)(&e, &a);
    F_(t) f = F_(sqr)(&e);
    G_(jacobian_t) r;
    F_(t) d2 = F_(dbl)(&d);
    r.x = F_(sub)(&f, &d2);
    F_(t) c8 = F_(dbl)(&c);
    c8 = F_(dbl)(&c8);
    c8 = F_(dbl)(&c8);
    t = F_(sub)(&d, &r.x);
    t = F_(mul)(&e, &t);
    r.y = F_(sub)(&t, &c8);
    t = F_(mul)(&p->y, &p->z);
    r.z = F_(dbl)(&t);
    return r;
}

HD_CALL G_(jacobian_t) G_(add)(const G_(jacobian_t) *p, const G_(jacobian_t) *q)
{
    if (G_(is_infinity)(p)) return *q;
    if (G_(is_infinity)(q)) return *p;
    F_(t) z1z1 = F_(sqr)(&p->z);
    F_(t) z2z2 = F_(sqr)(&q->z);
    F_(t) u1 = F_(mul)(&p->x, &z2z2);
    F_(t) u2 = F_(mul)(&q->x, &z1z1);
    F_(t) s1 = F_(mul)(&p->y, &q->z);
    s1 = F_(mul)(&s1, &z2z2);
    F_(t) s2 = F_(mul)(&q->y, &p->z);
    s2 = F_(mul)(&s2, &z1z1);
    F_(t) h = F_(sub)(&u2, &u1);
    F_(t) rr = F_(sub)(&s2, &s1);
    if (F_(is_zero)(&h)) {
        if (F_(is_zero)(&rr)) return G_(dbl)(p);
        return G_(infinity)();
    }
    rr = F_(dbl)(&rr);
    F_(t) i = F_(dbl)(&h);
    i = F_(sqr)(&i);
    F_(t) j = F_(mul)(&h, &i);
    F_(t) v = F_(mul)(&u1, &i);
    G_(jacobian_t) r;
    F_(t) t = F_(sqr)(&rr);
    t = F_(sub)(&t, &j);
    F_(t) v2 = F_(dbl)(&v);
    r.x = F_(sub)(&t, &v2);
    t = F_(sub)(&v, &r.x);
    t = F_(mul)(&rr, &t);
    F_(t) s1j = F_(mul)(&s1, &j);
    s1j = F_(dbl)(&s1j);
    r.y = F_(sub)(&t, &s1j);
    t = F_(add)(&p->z, &q->z);
    t = F_(sqr)(&t);
    t = F_(sub)(&t, &z1z1);
    t = F_(sub)(&t, &z2z2);
    r.z = F_(mul)(&t, &h);
    return r;
}

/* p + q with q affine (Z = 1): the bucket-accumulation step. */
HD_CALL G_(jacobian_t) G_(add_mixed)(const G_(jacobian_t) *p, const G_(affine_t) *q)
{
    if (G_(affine_is_infinity)(q)) return *p;
    if (G_(is_infinity)(p)) return G_(from_affine)(q);
    F_(t) z1z1 = F_(sqr)(&p->z);
    F_(t) u2 = F_(mul)(&q->x, &z1z1);
    F_(t) s2 = F_(mul)(&q->y, &p->z);
    s2 = F_(mul)(&s2, &z1z1);
    F_(t) h = F_(sub)(&u2, &p->x);
    F_(t) rr = F_(sub)(&s2, &p->y);
    if (F_(is_zero)(&h)) {
        if (F_(is_zero)(&rr)) return G_(dbl)(p);
        return G_(infinity)();
    }
    rr = F_(dbl)(&rr);
    F_(t) hh = F_(sqr)(&h);
    F_(t) i = F_(dbl)(&hh);
    i = F_(dbl)(&i);
    F_(t) j = F_(mul)(&h, &i);
    F_(t) v = F_(mul)(&p->x, &i);
    G_(jacobian_t) r;
    F_(t) t = F_(sqr)(&rr);
    t = F_(sub)(&t, &j);
    F_(t) v2 = F_(dbl)(&v);
    r.x = F_(sub)(&t, &v2);
    t = F_(sub)(&v, &r.x);
    t = F_(mul)(&rr, &t);
    F_(t) yj = F_(mul)(&p->y, &j);
    yj = F_(dbl)(&yj);
    r.y = F_(sub)(&t, &yj);
    t = F_(add)(&p->z, &h);
    t = F_(sqr)(&t);
    t = F_(sub)(&t, &z1z1);
    r.z = F_(sub)(&t, &hh);
    return r;
}

/* k*p for a small non-negative k (bucket offsets in the window reduction), double-and-add. */
HD_CALL G_(jacobian_t) G_(mul_small)(const G_(jacobian_t) *p, fr_limb k)
{
    G_(jacobian_t) acc = G_(infinity)();
    for (int bit = 63; bit >= 0; bit--) {
        acc = G_(dbl)(&acc);
        if ((k >> bit) & 1) acc = G_(add)(&acc, p);
    }
    return acc;
}

#undef G_
#undef F_
