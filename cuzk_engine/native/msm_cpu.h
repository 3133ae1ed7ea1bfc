/* Multi-threaded CPU Pippenger MSM, written once and instantiated per group by msm_host.c
 * (define JAC_GROUP / JAC_FIELD as for jacobian.h, plus MSM_COORD_LIMBS: 64-bit limbs per
 * coordinate). Host only (pthreads).
 *
 * sum_i s_i * P_i for canonical scalars s_i < r and affine bases P_i in canonical LE limbs
 * (all zeros = infinity), the layout of arkworks' xy bytes:
 *   1. classify: zero scalars and infinite bases are dropped; the bases whose scalar is 1 are
 *      summed directly (the witness is mostly 0/1: each costs one addition, not a pass per
 *      window); the rest are "general".
 *   2. per general point (split over threads by ranges): the base enters Montgomery form and the
 *      scalar is cut into W = ceil(256 / c) signed c-bit digits in [-2^(c-1), 2^(c-1)], so a
 *      window has 2^(c-1) buckets and a negative digit adds the negated point.
 *   3. jobs (taken by threads from a shared counter): one per window, plus the ones-sum. A
 *      window job sorts its points into buckets with affine additions batched over one shared
 *      inversion, then reduces the buckets by a running sum.
 *   4. the window sums are combined by Horner's rule (c doublings between windows).
 * Returns 0, or -1 when memory could not be allocated. */

#define G_(name) JAC_CAT(JAC_GROUP, name)
#define F_(name) JAC_CAT(JAC_FIELD, name)

typedef struct {
    const fr_limb *bases;        /* n canonical affine points */
    const fr_limb *scalars;      /* n x 4 canonical */
    int64_t *general;            /* indices of the general points, then of the ones */
    int64_t m, n_ones;
    G_(affine_t) *points;        /* m general points, Montgomery */
    int32_t *digits;             /* window-major: digits[w * m + k] */
    unsigned int c, windows;
    G_(jacobian_t) *sums;        /* windows + 1: the window sums, then the ones-sum */
    int threads;
    int next_job;
    int failed;
} G_(msm_ctx_t);

typedef struct {
    G_(msm_ctx_t) *ctx;
    int id;
} G_(msm_arg_t);

static G_(affine_t) G_(load_affine)(const fr_limb *src)
{
    G_(affine_t) p;
    p.x = F_(load_mont)(src);
    p.y = F_(load_mont)(src + MSM_COORD_LIMBS);
    return p;
}

static int G_(base_is_zero)(const fr_limb *src)
{
    fr_limb acc = 0;
    for (int i = 0; i < 2 * MSM_COORD_LIMBS; i++) acc |= src[i];
    return acc == 0;
}

static void *G_(msm_prepare)(void *raw)
{
    G_(msm_arg_t) *arg = (G_(msm_arg_t) *)raw;
    G_(msm_ctx_t) *ctx = arg->ctx;
    const int64_t lo = ctx->m * arg->id / ctx->threads;
    const int64_t hi = ctx->m * (arg->id + 1) / ctx->threads;
    const int64_t half = (int64_t)1 << (ctx->c - 1);
    for (int64_t k = lo; k < hi; k++) {
        const int64_t i = ctx->general[k];
        ctx->points[k] = G_(load_affine)(ctx->bases + 2 * MSM_COORD_LIMBS * i);
        const fr_limb *s = ctx->scalars + 4 * i;
        int64_t carry = 0;
        for (unsigned int w = 0; w < ctx->windows; w++) {
            int64_t d = (int64_t)msm_window_digit(s, w, ctx->c) + carry;
            carry = d > half;
            if (carry) d -= 2 * half;
            ctx->digits[(int64_t)w * ctx->m + k] = (int32_t)d;
        }
    }
    return NULL;
}

/* sum_k digits[w][k] * points[k] over the buckets of window w. */
static int G_(msm_window)(G_(msm_ctx_t) *ctx, unsigned int w, G_(jacobian_t) *out)
{
    const int64_t half = (int64_t)1 << (ctx->c - 1);
    G_(jacobian_t) *buckets = (G_(jacobian_t) *)malloc(sizeof(G_(jacobian_t)) * (size_t)half);
    if (!buckets) return -1;
    for (int64_t b = 0; b < half; b++) buckets[b] = G_(infinity)();
    const int32_t *digits = ctx->digits + (int64_t)w * ctx->m;
    for (int64_t k = 0; k < ctx->m; k++) {
        const int32_t d = digits[k];
        if (d > 0) {
            buckets[d - 1] = G_(add_mixed)(&buckets[d - 1], &ctx->points[k]);
        } else if (d < 0) {
            G_(affine_t) neg = ctx->points[k];
            neg.y = F_(neg)(&neg.y);
            buckets[-d - 1] = G_(add_mixed)(&buckets[-d - 1], &neg);
        }
    }
    /* sum_b (b + 1) * B_b: the running sum adds B_b once for every bucket at or below it */
    G_(jacobian_t) running = G_(infinity)();
    G_(jacobian_t) total = G_(infinity)();
    for (int64_t b = half - 1; b >= 0; b--) {
        running = G_(add)(&running, &buckets[b]);
        total = G_(add)(&total, &running);
    }
    free(buckets);
    *out = total;
    return 0;
}

static void G_(msm_ones)(G_(msm_ctx_t) *ctx, G_(jacobian_t) *out)
{
    G_(jacobian_t) acc = G_(infinity)();
    const int64_t *ones = ctx->general + ctx->m;
    for (int64_t k = 0; k < ctx->n_ones; k++) {
        const G_(affine_t) p = G_(load_affine)(ctx->bases + 2 * MSM_COORD_LIMBS * ones[k]);
        acc = G_(add_mixed)(&acc, &p);
    }
    *out = acc;
}

static void *G_(msm_work)(void *raw)
{
    G_(msm_ctx_t) *ctx = ((G_(msm_arg_t) *)raw)->ctx;
    for (;;) {
        const int job = __atomic_fetch_add(&ctx->next_job, 1, __ATOMIC_RELAXED);
        if (job < (int)ctx->windows) {
            if (G_(msm_window)(ctx, (unsigned int)job, &ctx->sums[job]) != 0)
                __atomic_store_n(&ctx->failed, 1, __ATOMIC_RELAXED);
        } else if (job == (int)ctx->windows) {
            G_(msm_ones)(ctx, &ctx->sums[job]);
        } else {
            return NULL;
        }
    }
}

/* Runs fn on `threads` threads (the calling one included) and waits for them. */
static void G_(msm_parallel)(G_(msm_ctx_t) *ctx, void *(*fn)(void *))
{
    G_(msm_arg_t) args[MSM_MAX_THREADS];
    pthread_t ids[MSM_MAX_THREADS];
    int started[MSM_MAX_THREADS] = {0};
    for (int t = 0; t < ctx->threads; t++) {
        args[t].ctx = ctx;
        args[t].id = t;
    }
    for (int t = 1; t < ctx->threads; t++) started[t] = pthread_create(&ids[t], NULL, fn, &args[t]) == 0;
    fn(&args[0]);
    for (int t = 1; t < ctx->threads; t++) {
        if (started[t]) pthread_join(ids[t], NULL);
        else fn(&args[t]); /* could not start a thread: do its share here */
    }
}

static void G_(store_affine)(fr_limb *out, const G_(jacobian_t) *p)
{
    if (G_(is_infinity)(p)) {
        for (int i = 0; i < 2 * MSM_COORD_LIMBS; i++) out[i] = 0;
        return;
    }
    F_(t) zinv = F_(inv)(&p->z);
    F_(t) zinv2 = F_(sqr)(&zinv);
    F_(t) x = F_(mul)(&p->x, &zinv2);
    F_(t) zinv3 = F_(mul)(&zinv2, &zinv);
    F_(t) y = F_(mul)(&p->y, &zinv3);
    F_(store_canonical)(out, &x);
    F_(store_canonical)(out + MSM_COORD_LIMBS, &y);
}

int G_(msm)(fr_limb *out, const fr_limb *bases, const fr_limb *scalars, int64_t n,
            unsigned int c, int threads)
{
    int rc = -1;
    G_(msm_ctx_t) ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.bases = bases;
    ctx.scalars = scalars;
    ctx.threads = threads < 1 ? 1 : (threads > MSM_MAX_THREADS ? MSM_MAX_THREADS : threads);
    ctx.general = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (!ctx.general) return -1;
    /* general indices fill from the front, ones from the back (then moved up behind them) */
    int64_t back = n;
    for (int64_t i = 0; i < n; i++) {
        const fr_limb *s = scalars + 4 * i;
        if ((s[0] | s[1] | s[2] | s[3]) == 0 || G_(base_is_zero)(bases + 2 * MSM_COORD_LIMBS * i))
            continue;
        if (s[0] == 1 && (s[1] | s[2] | s[3]) == 0) ctx.general[--back] = i;
        else ctx.general[ctx.m++] = i;
    }
    ctx.n_ones = n - back;
    memmove(ctx.general + ctx.m, ctx.general + back, sizeof(int64_t) * (size_t)ctx.n_ones);
    ctx.c = c ? c : msm_choose_window(ctx.m);
    ctx.windows = (256 + ctx.c - 1) / ctx.c;
    ctx.points = (G_(affine_t) *)malloc(sizeof(G_(affine_t)) * (size_t)(ctx.m > 0 ? ctx.m : 1));
    ctx.digits = (int32_t *)malloc(sizeof(int32_t) * (size_t)(ctx.m > 0 ? ctx.m : 1) * ctx.windows);
    ctx.sums = (G_(jacobian_t) *)malloc(sizeof(G_(jacobian_t)) * (ctx.windows + 1));
    if (!ctx.points || !ctx.digits || !ctx.sums) goto done;
    G_(msm_parallel)(&ctx, G_(msm_prepare));
    G_(msm_parallel)(&ctx, G_(msm_work));
    if (ctx.failed) goto done;
    G_(jacobian_t) acc = ctx.sums[ctx.windows - 1];
    for (int w = (int)ctx.windows - 2; w >= 0; w--) {
        for (unsigned int i = 0; i < ctx.c; i++) acc = G_(dbl)(&acc);
        acc = G_(add)(&acc, &ctx.sums[w]);
    }
    acc = G_(add)(&acc, &ctx.sums[ctx.windows]);
    G_(store_affine)(out, &acc);
    rc = 0;
done:
    free(ctx.general);
    free(ctx.points);
    free(ctx.digits);
    free(ctx.sums);
    return rc;
}

#undef G_
#undef F_
