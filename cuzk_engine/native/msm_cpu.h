/* Multi-threaded CPU Pippenger MSM, written once and instantiated per group by msm_host.c
 * (define JAC_GROUP / JAC_FIELD as for jacobian.h, plus MSM_COORD_LIMBS: 64-bit limbs per
 * coordinate). Host only (pthreads).
 *
 * sum_i s_i * P_i for canonical scalars s_i < r and affine bases P_i in canonical LE limbs
 * (all zeros = infinity), the layout of arkworks' xy bytes:
 *   1. classify: zero scalars and infinite bases are dropped; the bases whose scalar is 1 are
 *      summed directly (witness values are often 0/1: each costs one addition, not a pass
 *      per window); the rest are "general".
 *   2. per general point (split over threads by ranges): the base enters Montgomery form, its
 *      image lambda * P = G_(endomorphism)(P) joins it, and the scalar splits into two halves
 *      below 2^128 (msm_glv_split, msm_host.c), each cut into W = ceil(129 / c) signed c-bit
 *      digits in [-2^(c-1), 2^(c-1)], so a window has 2^(c-1) buckets and a negative digit
 *      adds the negated point.
 *   3. jobs (taken by threads from a shared counter): one per window, plus the ones-sum. A
 *      window job sorts its points into buckets with affine additions batched over one shared
 *      inversion, then reduces the buckets by running sums over segments of them, advanced
 *      side by side in batches of affine additions too (msm_reduce).
 *   4. the window sums are combined by Horner's rule (c doublings between windows).
 * Returns 0, or -1 when memory could not be allocated. `stats`, when not NULL, receives the
 * MSM_STAT_* counts. */

#define G_(name) JAC_CAT(JAC_GROUP, name)
#define F_(name) JAC_CAT(JAC_FIELD, name)

typedef struct {
    const fr_limb *bases;        /* n canonical affine points */
    const fr_limb *scalars;      /* n x 4 canonical */
    int64_t *general;            /* indices of the general points, then of the ones */
    int64_t m, n_ones;
    int64_t count;               /* points in the buckets: 2m, each general point and its image */
    int64_t nonzero_digits;      /* bucket additions, summed by the prepare threads */
    G_(affine_t) *points;        /* the m general points (Montgomery), then their images */
    int32_t *digits;             /* window-major: digits[w * count + k] */
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
    int64_t nonzero = 0;
    for (int64_t k = lo; k < hi; k++) {
        const int64_t i = ctx->general[k];
        ctx->points[k] = G_(load_affine)(ctx->bases + 2 * MSM_COORD_LIMBS * i);
        ctx->points[ctx->m + k] = G_(endomorphism)(&ctx->points[k]);
        fr_limb halves[2][4];
        msm_glv_split(ctx->scalars + 4 * i, halves[0], halves[1]);
        for (int h = 0; h < 2; h++) {
            int64_t carry = 0;
            for (unsigned int w = 0; w < ctx->windows; w++) {
                int64_t d = (int64_t)msm_window_digit(halves[h], w, ctx->c) + carry;
                carry = d > half;
                if (carry) d -= 2 * half;
                ctx->digits[(int64_t)w * ctx->count + h * ctx->m + k] = (int32_t)d;
                nonzero += d != 0;
            }
        }
    }
    __atomic_fetch_add(&ctx->nonzero_digits, nonzero, __ATOMIC_RELAXED);
    return NULL;
}

/* One window's buckets: affine points summed in batches that share one inversion. A batch
 * holds at most one pending addition per bucket; a point meeting a bucket that is already
 * pending waits for the next batch, and when that queue is full too (digits repeating more
 * than the batches can absorb) it goes to the bucket's Jacobian overflow sum (a mixed
 * addition), so repeated digits never serialise the batches. */
typedef struct {
    G_(affine_t) *bucket;        /* affine sums, valid where state == 1 */
    G_(jacobian_t) *overflow;    /* valid where state & 2 */
    uint8_t *state;
    uint32_t *stamp;             /* the batch a bucket is pending in (+1; 0 = never) */
    int32_t *entry_bucket;       /* per batch entry */
    G_(affine_t) *entry_point;
    F_(t) *entry_den, *entry_prefix;
    uint8_t *entry_kind;
    int32_t *wait_bucket, *retry_bucket; /* the queue for the next batch, and the one being */
    G_(affine_t) *wait_point, *retry_point; /* placed after a flush */
    int64_t half, batch, count, waiting;
    uint32_t batch_id;
} G_(msm_buckets_t);

static void G_(msm_buckets_free)(G_(msm_buckets_t) *bk)
{
    free(bk->bucket);
    free(bk->overflow);
    free(bk->state);
    free(bk->stamp);
    free(bk->entry_bucket);
    free(bk->entry_point);
    free(bk->entry_den);
    free(bk->entry_prefix);
    free(bk->entry_kind);
    free(bk->wait_bucket);
    free(bk->retry_bucket);
    free(bk->wait_point);
    free(bk->retry_point);
}

static int G_(msm_buckets_alloc)(G_(msm_buckets_t) *bk, unsigned int c)
{
    memset(bk, 0, sizeof *bk);
    bk->half = (int64_t)1 << (c - 1);
    /* long enough to spread the inversion's ~570 multiplications thin; half the bucket count
     * at most, beyond which collisions (waits, then overflow additions) cost more than the
     * inversions saved (measured at 2^14 and 2^16) */
    bk->batch = bk->half / 2 < 16 ? 16 : (bk->half / 2 > 1024 ? 1024 : bk->half / 2);
    bk->batch_id = 1;
    const size_t h = (size_t)bk->half, e = (size_t)bk->batch;
    bk->bucket = (G_(affine_t) *)malloc(sizeof(G_(affine_t)) * h);
    bk->overflow = (G_(jacobian_t) *)malloc(sizeof(G_(jacobian_t)) * h);
    bk->state = (uint8_t *)calloc(h, 1);
    bk->stamp = (uint32_t *)calloc(h, sizeof(uint32_t));
    bk->entry_bucket = (int32_t *)malloc(sizeof(int32_t) * e);
    bk->entry_point = (G_(affine_t) *)malloc(sizeof(G_(affine_t)) * e);
    bk->entry_den = (F_(t) *)malloc(sizeof(F_(t)) * e);
    bk->entry_prefix = (F_(t) *)malloc(sizeof(F_(t)) * e);
    bk->entry_kind = (uint8_t *)malloc(e);
    bk->wait_bucket = (int32_t *)malloc(sizeof(int32_t) * e);
    bk->retry_bucket = (int32_t *)malloc(sizeof(int32_t) * e);
    bk->wait_point = (G_(affine_t) *)malloc(sizeof(G_(affine_t)) * e);
    bk->retry_point = (G_(affine_t) *)malloc(sizeof(G_(affine_t)) * e);
    if (!bk->bucket || !bk->overflow || !bk->state || !bk->stamp || !bk->entry_bucket
        || !bk->entry_point || !bk->entry_den || !bk->entry_prefix || !bk->entry_kind
        || !bk->wait_bucket || !bk->retry_bucket || !bk->wait_point || !bk->retry_point) {
        G_(msm_buckets_free)(bk);
        return -1;
    }
    return 0;
}

/* Applies the pending additions acc[b] += point (b = entry_bucket, point = entry_point; acc is
 * the buckets while sorting, the running and total sums while reducing): one inversion for all
 * denominators (Montgomery's trick), then lambda, x3 = lambda^2 - x1 - x2,
 * y3 = lambda (x1 - x3) - y1. A sum that cancels leaves `state` bit 1 (non-empty) cleared. */
static void G_(msm_flush)(G_(msm_buckets_t) *bk, G_(affine_t) *acc_points, uint8_t *state,
                          int64_t count)
{
    if (count == 0) return;
    /* four interleaved product chains instead of one: consecutive entries multiply into
     * different accumulators, so the out-of-order core overlaps their Montgomery products
     * instead of waiting out each one's latency */
    F_(t) acc[MSM_LANES];
    for (int l = 0; l < MSM_LANES; l++) acc[l] = F_(one)();
    for (int64_t e = 0; e < count; e++) {
        const G_(affine_t) *a = &acc_points[bk->entry_bucket[e]];
        const G_(affine_t) *p = &bk->entry_point[e];
        if (!F_(eq)(&a->x, &p->x)) {
            bk->entry_kind[e] = MSM_ADD;
            bk->entry_den[e] = F_(sub)(&p->x, &a->x);
        } else if (F_(eq)(&a->y, &p->y)) {
            bk->entry_kind[e] = MSM_DOUBLE; /* y != 0: the prime-order groups have no 2-torsion */
            bk->entry_den[e] = F_(dbl)(&a->y);
        } else {
            bk->entry_kind[e] = MSM_CANCEL;
            bk->entry_den[e] = F_(one)();
        }
        F_(t) *lane = &acc[e % MSM_LANES];
        bk->entry_prefix[e] = *lane;
        *lane = F_(mul)(lane, &bk->entry_den[e]);
    }
    /* one inversion of the four lanes' product, then each lane's inverse from it */
    const F_(t) p01 = F_(mul)(&acc[0], &acc[1]);
    const F_(t) p23 = F_(mul)(&acc[2], &acc[3]);
    const F_(t) all = F_(mul)(&p01, &p23);
    const F_(t) inv_all = F_(inv)(&all);
    const F_(t) inv01 = F_(mul)(&inv_all, &p23);
    const F_(t) inv23 = F_(mul)(&inv_all, &p01);
    F_(t) inv[MSM_LANES];
    inv[0] = F_(mul)(&inv01, &acc[1]);
    inv[1] = F_(mul)(&inv01, &acc[0]);
    inv[2] = F_(mul)(&inv23, &acc[3]);
    inv[3] = F_(mul)(&inv23, &acc[2]);
    for (int64_t e = count - 1; e >= 0; e--) {
        F_(t) *lane = &inv[e % MSM_LANES];
        const F_(t) den_inv = F_(mul)(lane, &bk->entry_prefix[e]);
        *lane = F_(mul)(lane, &bk->entry_den[e]);
        const int32_t b = bk->entry_bucket[e];
        G_(affine_t) *a = &acc_points[b];
        if (bk->entry_kind[e] == MSM_CANCEL) {
            state[b] &= (uint8_t)~1u;
            continue;
        }
        F_(t) num;
        if (bk->entry_kind[e] == MSM_ADD) {
            num = F_(sub)(&bk->entry_point[e].y, &a->y);
        } else {
            const F_(t) xx = F_(sqr)(&a->x);
            num = F_(dbl)(&xx);
            num = F_(add)(&num, &xx);
        }
        const F_(t) lambda = F_(mul)(&num, &den_inv);
        F_(t) x3 = F_(sqr)(&lambda);
        x3 = F_(sub)(&x3, &a->x);
        x3 = F_(sub)(&x3, &bk->entry_point[e].x);
        F_(t) y3 = F_(sub)(&a->x, &x3);
        y3 = F_(mul)(&lambda, &y3);
        a->y = F_(sub)(&y3, &a->y);
        a->x = x3;
    }
}

/* bucket[b] += p: at once into an empty bucket, else as an entry of the current batch, else
 * (b already pending) queued for the next batch or, with the queue full, into the overflow.
 * Never flushes: the caller keeps count < batch before placing. */
static void G_(msm_place)(G_(msm_buckets_t) *bk, int32_t b, const G_(affine_t) *p)
{
    if (!(bk->state[b] & 1)) {
        bk->bucket[b] = *p;
        bk->state[b] |= 1;
    } else if (bk->stamp[b] != bk->batch_id) {
        bk->stamp[b] = bk->batch_id;
        bk->entry_bucket[bk->count] = b;
        bk->entry_point[bk->count] = *p;
        bk->count++;
    } else if (bk->waiting < bk->batch) {
        bk->wait_bucket[bk->waiting] = b;
        bk->wait_point[bk->waiting] = *p;
        bk->waiting++;
    } else if (bk->state[b] & 2) {
        bk->overflow[b] = G_(add_mixed)(&bk->overflow[b], p);
    } else {
        bk->overflow[b] = G_(from_affine)(p);
        bk->state[b] |= 2;
    }
}

/* Applies the batch, then opens the next one with the queued entries (at most `batch`). */
static void G_(msm_next_batch)(G_(msm_buckets_t) *bk)
{
    G_(msm_flush)(bk, bk->bucket, bk->state, bk->count);
    bk->count = 0;
    bk->batch_id++;
    int32_t *tb = bk->retry_bucket;
    G_(affine_t) *tp = bk->retry_point;
    bk->retry_bucket = bk->wait_bucket;
    bk->retry_point = bk->wait_point;
    bk->wait_bucket = tb;
    bk->wait_point = tp;
    const int64_t retries = bk->waiting;
    bk->waiting = 0;
    for (int64_t e = 0; e < retries; e++)
        G_(msm_place)(bk, bk->retry_bucket[e], &bk->retry_point[e]);
}

/* acc[k] += p for the reduction's sums: a copy into an empty sum, else a batch entry. */
static void G_(msm_accumulate)(G_(msm_buckets_t) *bk, G_(affine_t) *acc, uint8_t *state,
                               int32_t k, const G_(affine_t) *p)
{
    if (!(state[k] & 1)) {
        acc[k] = *p;
        state[k] |= 1;
        return;
    }
    bk->entry_bucket[bk->count] = k;
    bk->entry_point[bk->count] = *p;
    bk->count++;
}

/* The window's sum, sum_b (b + 1) * B_b. A single running sum (running += B_b, total +=
 * running, from the top bucket down) would cost two Jacobian additions per bucket, more than
 * sorting the points took. Instead the buckets are cut into S segments of L, whose running
 * sums advance side by side, so each of the L steps is one batch of 2S affine additions
 * sharing one inversion. In a step, total_s += running_s comes before running_s += B_b (the
 * two are independent, so they share the batch); after the L steps
 *   total_s = sum_j j * B_{sL+j},  running_s = R_s = sum_j B_{sL+j},
 * and the window's sum is sum_s (total_s + R_s) + L * sum_s s * R_s, the last sum by a short
 * Jacobian running sum over the segments. Buckets that spilled into the Jacobian overflow
 * (a digit repeated past the wait queue: a few at most) add (b + 1) * overflow_b directly. */
static int G_(msm_reduce)(G_(msm_buckets_t) *bk, G_(jacobian_t) *out)
{
    /* ~sqrt(2 * half) segments (never more than half) balance the steps' inversions against
     * the Jacobian tail; a step's 2S entries must fit a batch (which binds from c = 19) */
    int64_t segments = (int64_t)1 << ((__builtin_ctzll((unsigned long long)bk->half) + 2) / 2);
    while (2 * segments > bk->batch) segments /= 2;
    const int64_t per_segment = bk->half / segments;
    G_(affine_t) *acc = (G_(affine_t) *)malloc(sizeof(G_(affine_t)) * 2 * (size_t)segments);
    uint8_t *state = (uint8_t *)calloc(2 * (size_t)segments, 1);
    if (!acc || !state) {
        free(acc);
        free(state);
        return -1;
    }
    G_(affine_t) *running = acc, *total = acc + segments;
    uint8_t *running_state = state, *total_state = state + segments;
    for (int64_t j = per_segment - 1; j >= 0; j--) {
        bk->count = 0;
        for (int64_t s = 0; s < segments; s++) {
            if (running_state[s] & 1) G_(msm_accumulate)(bk, acc, state, (int32_t)(segments + s), &running[s]);
            const int64_t b = s * per_segment + j;
            if (bk->state[b] & 1) G_(msm_accumulate)(bk, acc, state, (int32_t)s, &bk->bucket[b]);
        }
        G_(msm_flush)(bk, acc, state, bk->count);
    }
    bk->count = 0;
    G_(jacobian_t) sum = G_(infinity)(), suffix = G_(infinity)(), weighted = G_(infinity)();
    for (int64_t s = segments - 1; s >= 0; s--) {
        if (total_state[s] & 1) sum = G_(add_mixed)(&sum, &total[s]);
        if (running_state[s] & 1) {
            sum = G_(add_mixed)(&sum, &running[s]);
            suffix = G_(add_mixed)(&suffix, &running[s]);
        }
        if (s > 0) weighted = G_(add)(&weighted, &suffix); /* R_s counted s times */
    }
    for (int64_t l = per_segment; l > 1; l /= 2) weighted = G_(dbl)(&weighted);
    sum = G_(add)(&sum, &weighted);
    for (int64_t b = 0; b < bk->half; b++) {
        if (!(bk->state[b] & 2)) continue;
        const G_(jacobian_t) spilled = G_(mul_small)(&bk->overflow[b], (fr_limb)(b + 1));
        sum = G_(add)(&sum, &spilled);
    }
    free(acc);
    free(state);
    *out = sum;
    return 0;
}

/* sum_k digits[w][k] * points[k] over the buckets of window w. */
/* Folds replicas 1..R-1 of buckets [0, used) into replica 0 (batched like the sorting; the
 * overflow sums add up directly), leaving the replicas empty. */
static void G_(msm_fold_replicas)(G_(msm_buckets_t) *bk, int64_t used, int64_t replicas)
{
    for (int64_t r = 1; r < replicas; r++) {
        for (int64_t b = 0; b < used; b++) {
            const int64_t copy = r * used + b;
            if (bk->state[copy] & 1) {
                if (bk->count == bk->batch) G_(msm_next_batch)(bk);
                G_(msm_place)(bk, (int32_t)b, &bk->bucket[copy]);
            }
            if (bk->state[copy] & 2) {
                bk->overflow[b] = (bk->state[b] & 2) ? G_(add)(&bk->overflow[b], &bk->overflow[copy])
                                                     : bk->overflow[copy];
                bk->state[b] |= 2;
            }
            bk->state[copy] = 0;
        }
    }
    while (bk->count > 0 || bk->waiting > 0) G_(msm_next_batch)(bk);
}

/* sum_k digits[w][k] * points[k] over the buckets of window w. A window whose digits reach
 * only `used` buckets (the top one: r < 2^255 leaves it a few bits, so thousands of points
 * share each bucket and would spill past the wait queue into Jacobian overflow additions)
 * spreads its points over R = half / used replicas of those buckets, point k into replica
 * k mod R, so its batches fill like any window's; the replicas are folded after. */
static int G_(msm_window)(G_(msm_ctx_t) *ctx, unsigned int w, G_(jacobian_t) *out)
{
    G_(msm_buckets_t) bk;
    if (G_(msm_buckets_alloc)(&bk, ctx->c) != 0) return -1;
    const int32_t *digits = ctx->digits + (int64_t)w * ctx->count;
    int64_t used = 0;
    for (int64_t k = 0; k < ctx->count; k++) {
        const int64_t magnitude = digits[k] > 0 ? digits[k] : -(int64_t)digits[k];
        if (magnitude > used) used = magnitude;
    }
    int64_t replicas = 1;
    while (used > 0 && 2 * replicas * used <= bk.half) replicas *= 2;
    for (int64_t k = 0; k < ctx->count; k++) {
        const int32_t d = digits[k];
        if (d == 0) continue;
        G_(affine_t) p = ctx->points[k];
        if (d < 0) p.y = F_(neg)(&p.y);
        if (bk.count == bk.batch) G_(msm_next_batch)(&bk);
        const int64_t bucket = (d > 0 ? d : -d) - 1 + used * (k & (replicas - 1));
        G_(msm_place)(&bk, (int32_t)bucket, &p);
    }
    while (bk.count > 0 || bk.waiting > 0) G_(msm_next_batch)(&bk);
    if (replicas > 1) G_(msm_fold_replicas)(&bk, used, replicas);
    const int rc = G_(msm_reduce)(&bk, out);
    G_(msm_buckets_free)(&bk);
    return rc;
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
            unsigned int c, int threads, int64_t *stats)
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
    ctx.count = 2 * ctx.m;
    ctx.c = c ? c : msm_choose_window(ctx.count, MSM_GLV_BITS);
    ctx.windows = (MSM_GLV_BITS + ctx.c - 1) / ctx.c;
    ctx.points = (G_(affine_t) *)malloc(sizeof(G_(affine_t)) * (size_t)(ctx.count > 0 ? ctx.count : 1));
    ctx.digits = (int32_t *)malloc(sizeof(int32_t) * (size_t)(ctx.count > 0 ? ctx.count : 1) * ctx.windows);
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
    if (stats) {
        /* what the benchmark reports: the shape, and the group additions it implies */
        stats[MSM_STAT_WINDOW] = ctx.c;
        stats[MSM_STAT_WINDOWS] = ctx.windows;
        stats[MSM_STAT_GENERAL] = ctx.m;
        stats[MSM_STAT_ONES] = ctx.n_ones;
        stats[MSM_STAT_BUCKET_ADDS] = ctx.nonzero_digits;
        stats[MSM_STAT_REDUCTION_ADDS] = (int64_t)ctx.windows << ctx.c; /* 2 per bucket */
        stats[MSM_STAT_DOUBLINGS] = (int64_t)(ctx.windows - 1) * ctx.c;
    }
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
