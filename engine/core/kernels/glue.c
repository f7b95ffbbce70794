/* The work around a step's products, per row: the RMS norm, the rotary embedding, the gated MLP's SiLU. float32.

       norm:     y[r] = w * (x[r] * 1 / sqrt(mean(x[r]^2) + eps))                  transformers' LlamaRMSNorm
       rope:     x[r, h] = x[r, h] * cos[r] + rotate_half(x[r, h]) * sin[r]  in place  apply_rotary_pos_emb
       silu_mul: y[r] = g[r] / (1 + exp(-g[r])) * u[r]                             LlamaMLP's act_fn(gate) * up

   Built once by engine/core/kernels/__init__.py as rows.c is (gcc -O3 -march=native -fopenmp -ffp-contract=fast, no
   -ffast-math) and called through ctypes by engine/core/kernels/glue.py. Why C: each of these is a dozen elements'
   work per row that torch makes in several operators of a few microseconds each (the norm alone six, 18 us for one
   row of 576 here, against 1.6 us for this call): a lone SmolLM2 step made ~1,300 operator calls, most of them these
   (docs/engine.md, "The work around the products, in C").

   A row's numbers never depend on the other rows or on the threads (threads take whole rows):
   - the norm's sum of squares: LANES accumulators, accumulator j adding x[k]^2 for k = j, j + LANES, ... in k's order
     (a fused multiply-add where the CPU has one), the last d % LANES elements added after, in order, then the
     accumulators in one fixed tree (halves, then halves of those). LANES is a constant, not the machine's vector
     width: the same order on AVX-512, AVX2 or SSE (the compiler vectorizes the lanes however wide its registers);
   - the rotary and the product g * u: elementwise, with the operations in transformers' order and no fused
     multiply-add (rope: x*cos and rotate_half(x)*sin each rounded, then added), so rope's bits are transformers';
   - SiLU's exp: Cephes' expf polynomial, the same in every lane (about 1 ulp from expf), so silu_mul differs from
     torch's in the last bits (tests/test_glue.py measures by how much). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16                 /* the norm's accumulators: its fixed order, whatever the machine */
#define PARALLEL_ROWS 32         /* fewer rows run on the calling thread (a lone step's one row: no team woken) */
#define EXACT __attribute__((optimize("fp-contract=off")))    /* each product rounded, as torch's operators do */

/* One row's sum of squares in the fixed order above. */
static float squares(const float *x, long d) {
    float acc[LANES] = {0};
    long k = 0;
    for (; k + LANES <= d; k += LANES)
        for (int j = 0; j < LANES; j++)
            acc[j] += x[k + j] * x[k + j];
    for (; k < d; k++)
        acc[k % LANES] += x[k] * x[k];
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; j++)
            acc[j] = acc[j] + acc[j + width];
    return acc[0];
}

static void norm_row(const float *x, const float *w, float *y, long d, float eps) {
    float scale = 1.0f / sqrtf(squares(x, d) / (float)d + eps);
    for (long k = 0; k < d; k++)
        y[k] = w[k] * (x[k] * scale);
}

/* x [rows, d] (row stride xs) -> y [rows, d] (row stride ys), w [d]. */
void glue_norm(const float *x, long xs, const float *w, float *y, long ys, long rows, long d, float eps,
               int threads) {
    if (rows < PARALLEL_ROWS) {
        for (long r = 0; r < rows; r++)
            norm_row(x + r * xs, w, y + r * ys, d, eps);
        return;
    }
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long r = 0; r < rows; r++)
        norm_row(x + r * xs, w, y + r * ys, d, eps);
}

/* One row's `heads` heads of `dim` values, rotated in place: the first half (a) and the second (b) of each head
   become a*cos - b*sin (torch: a*cos + (-b)*sin, the same bits) and b*cos + a*sin, cos and sin [dim]. */
EXACT __attribute__((noinline)) static void rope_row(float *x, const float *cos, const float *sin, long heads, long dim) {
    long half = dim / 2;
    for (long h = 0; h < heads; h++) {
        float *p = x + h * dim;
        for (long i = 0; i < half; i++) {
            float a = p[i], b = p[i + half];
            float first = a * cos[i], second = b * cos[i + half];
            float cross1 = -b * sin[i], cross2 = a * sin[i + half];
            p[i] = first + cross1;
            p[i + half] = second + cross2;
        }
    }
}

/* x [rows, heads * dim] (row stride xs) rotated in place; cos, sin [rows, dim] (row stride cs). */
void glue_rope(float *x, long xs, const float *cos, const float *sin, long cs, long rows, long heads, long dim,
               int threads) {
    if (rows < PARALLEL_ROWS) {
        for (long r = 0; r < rows; r++)
            rope_row(x + r * xs, cos + r * cs, sin + r * cs, heads, dim);
        return;
    }
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long r = 0; r < rows; r++)
        rope_row(x + r * xs, cos + r * cs, sin + r * cs, heads, dim);
}

#define EXP_LANES 8
typedef float vec __attribute__((vector_size(4 * EXP_LANES)));
typedef int32_t ivec __attribute__((vector_size(4 * EXP_LANES)));
typedef float vec_u __attribute__((vector_size(4 * EXP_LANES), aligned(4), may_alias));

static inline vec splat(float x) { return (vec){0} + x; }

/* attend.c has its own expv, for x <= 0 only (a softmax's), exactly 0 below -87; each C file is built and hashed
   alone (engine/core/kernels/__init__.py), so they are not one header. This one takes SiLU's whole range.
   exp(x) lane by lane (Cephes' expf: x = n ln2 + r, a degree-5 polynomial in r, times 2^n), x clamped to
   [-87, 88]: about 1 ulp from expf over the range SiLU meets (beyond it, SiLU is 0 or x to float32's precision). */
static inline vec expv(vec x) {
    ivec low = x < -87.0f, high = x > 88.0f;                                /* lanes of -1 (true) or 0 */
    x = (vec)(((ivec)x & ~(low | high)) | ((ivec)splat(-87.0f) & low) | ((ivec)splat(88.0f) & high));
    vec fx = x * 1.44269504088896341f + 0.5f;
    vec n = __builtin_convertvector(__builtin_convertvector(fx, ivec), vec);
    n = n + __builtin_convertvector((ivec)(n > fx), vec);                   /* floor: truncation minus one above */
    x = x - n * 0.693359375f;
    x = x - n * -2.12194440e-4f;
    vec y = splat(1.9875691500E-4f);
    y = y * x + 1.3981999507E-3f;
    y = y * x + 8.3334519073E-3f;
    y = y * x + 4.1665795894E-2f;
    y = y * x + 1.6666665459E-1f;
    y = y * x + 5.0000001201E-1f;
    y = y * (x * x) + x + 1.0f;
    ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
    vec scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* y = g / (1 + exp(-g)) * u over f values (the tail past the last full vector through a zero-padded one). */
static void silu_mul_row(const float *g, const float *u, float *y, long f) {
    long k = 0;
    for (; k + EXP_LANES <= f; k += EXP_LANES) {
        vec gv = *(const vec_u *)(g + k), uv = *(const vec_u *)(u + k);
        *(vec_u *)(y + k) = gv / (1.0f + expv(-gv)) * uv;
    }
    if (k < f) {
        vec gv = {0}, uv = {0}, yv;
        memcpy(&gv, g + k, sizeof(float) * (f - k));
        memcpy(&uv, u + k, sizeof(float) * (f - k));
        yv = gv / (1.0f + expv(-gv)) * uv;
        memcpy(y + k, &yv, sizeof(float) * (f - k));
    }
}

/* g, u [rows, f] (row stride gs, the same for both: gate|up side by side, or two tensors) -> y [rows, f] (ys). */
void glue_silu_mul(const float *g, const float *u, long gs, float *y, long ys, long rows, long f, int threads) {
    if (rows < PARALLEL_ROWS) {
        for (long r = 0; r < rows; r++)
            silu_mul_row(g + r * gs, u + r * gs, y + r * ys, f);
        return;
    }
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long r = 0; r < rows; r++)
        silu_mul_row(g + r * gs, u + r * gs, y + r * ys, f);
}

/* ---- A lone row's layer around its attention, in two calls (engine/core/lone.py's LonePlan) ----------------------

   The same operations as the forward makes for one row with the row kernel's products (engine/core/lean.py with
   CGlue and the bound products of engine/core/lone.py), in the same order, so the same bits: each residual add one
   float addition (torch's x + y), each norm, rope and SiLU the functions above, each product the row kernel's
   `rows_linear` (handed in as a pointer from the row kernel's library: one copy of its code). What it saves is the
   calls: between one layer's attention and the next there is nothing for Python to do. */

typedef void (*product_fn)(const float *x, long ldx, long rows, const float *w, long in, long out,
                           const float *bias, float *y, long ldy, int threads);
typedef void (*attend_fn)(const float *q, const float *k, const float *v, float *out, const long *dims, float scale,
                          int threads);

typedef struct {                 /* one layer's parameters: norms [d], products (out, in) as stored, biases or NULL */
    const float *ln1, *ln2, *qkv, *qkv_bias, *o, *o_bias, *gate_up, *gate_up_bias, *down, *down_bias;
} lone_layer_t;

typedef struct {                 /* the row's buffers, made once, and this step's rotary table */
    product_fn product;
    long d, qkv_out, rotated, dim, f, width;   /* d_model; q|k|v's outputs; heads rotated (q's and k's); head
                                                   dim; the MLP's; attention's output (o's input), heads x dim */
    float eps;
    float *x;                    /* [d] the residual stream, updated in place */
    float *h;                    /* [max(d, f)] a norm's output, then the gated activation */
    float *qkv_out_buf;          /* [qkv_out] q|k|v, q|k rotated */
    float *gate_up_buf;          /* [2 f] */
    float *delta;                /* [d] o's and down's outputs, before they are added */
    const float *cos, *sin;      /* [dim] this step's */
    attend_fn attend;            /* attend.c's attend_row (NULL: `lone_layers` is not called) */
    float *attn;                 /* [width] attention's output */
    float scale;                 /* attention's scaling */
    int attend_threads;          /* the threads attention's kv heads are dealt to; 0: the step's (`threads`) */
} lone_t;

static void add_into(float *x, const float *y, long d) {
    for (long k = 0; k < d; k++)
        x[k] = x[k] + y[k];
}

/* resid (or NULL): where the residual entering the layer is kept; then q|k|v of norm(x), q|k rotated; k and v
   copied to their slots in the K/V pool (key, value: NULL where the caller writes them). */
void lone_before(const lone_t *s, const lone_layer_t *l, float *resid, float *key, float *value, int threads) {
    if (resid)
        memcpy(resid, s->x, sizeof(float) * s->d);
    norm_row(s->x, l->ln1, s->h, s->d, s->eps);
    s->product(s->h, s->d, 1, l->qkv, s->d, s->qkv_out, l->qkv_bias, s->qkv_out_buf, s->qkv_out, threads);
    rope_row(s->qkv_out_buf, s->cos, s->sin, s->rotated, s->dim);
    long kvd = (s->qkv_out - s->width) / 2;
    if (key && value) {
        memcpy(key, s->qkv_out_buf + s->width, sizeof(float) * kvd);
        memcpy(value, s->qkv_out_buf + s->width + kvd, sizeof(float) * kvd);
    }
}

/* attn [width]: x += o(attn); x += down(silu(gate) * up) of norm(x). */
void lone_after(const lone_t *s, const lone_layer_t *l, const float *attn, int threads) {
    long d = s->d, f = s->f;
    s->product(attn, s->width, 1, l->o, s->width, d, l->o_bias, s->delta, d, threads);
    add_into(s->x, s->delta, d);
    norm_row(s->x, l->ln2, s->h, d, s->eps);
    s->product(s->h, d, 1, l->gate_up, d, 2 * f, l->gate_up_bias, s->gate_up_buf, 2 * f, threads);
    silu_mul_row(s->gate_up_buf, s->gate_up_buf + f, s->h, f);
    s->product(s->h, f, 1, l->down, f, d, l->down_bias, s->delta, d, threads);
    add_into(s->x, s->delta, d);
}

/* Every layer of a lone step in one call, where the row's keys lie in place in the K/V pool (its blocks one after
   another): per layer `lone_before` (the residual kept at resid + i * resid_stride, NULL: none; k and v written at
   offset `write` of the layer's keys and values), attend.c's attend_row over the row's n keys from offset `first`
   (a key's positions kvd = keys' width apart, its heads dim apart; its kv heads dealt to `threads`, or to
   attend_threads where set), then `lone_after`. The same functions in the same order as the layers called one by
   one from Python with attend.c's attention, so the same bits. */
void lone_layers(const lone_t *s, const lone_layer_t *layers, long count, float *resid, long resid_stride,
                 float *const *keys, float *const *values, long write, long first, long n, int threads) {
    long kvd = (s->qkv_out - s->width) / 2;
    long dims[16] = {s->width / s->dim, kvd / s->dim, 1, n, s->dim, 0, s->dim, s->qkv_out, 0, s->dim, kvd,
                     0, s->dim, kvd, 0, 0};
    for (long i = 0; i < count; i++) {
        lone_before(s, &layers[i], resid ? resid + i * resid_stride : NULL, keys[i] + write, values[i] + write,
                    threads);
        s->attend(s->qkv_out_buf, keys[i] + first, values[i] + first, s->attn, dims, s->scale,
                  s->attend_threads ? s->attend_threads : threads);
        lone_after(s, &layers[i], s->attn, threads);
    }
}

typedef struct {                 /* a lone token's ends: the embedding row it starts from, the final norm, the head */
    const float *embed;          /* [d] the token's row of the embedding */
    const float *norm;           /* [d] the final norm's weight */
    const float *head, *head_bias;     /* (vocab, d) as stored, bias or NULL */
    long vocab;
    float *logits;               /* [vocab] */
} lone_ends_t;

/* A lone token's whole step in one call, where `lone_layers` takes its layers: the token's embedding row copied into
   the residual stream, every layer (`lone_layers`), the residual entering the final norm kept at resid + count *
   resid_stride (NULL: none), the final norm, and the LM head's product into e->logits. The same functions in the same
   order as engine/core/lean.py's `_lone` makes them around `lone_layers` (F.embedding's copy, CGlue's norm, the
   head's row-kernel product), so the same bits; what it saves is Python's work between them, each operator of
   which, the first of its kind after the weights have streamed through every cache, took tens of microseconds
   (docs/engine.md, "A token in one call"). */
void lone_token(const lone_t *s, const lone_layer_t *layers, long count, const lone_ends_t *e, float *resid,
                long resid_stride, float *const *keys, float *const *values, long write, long first, long n,
                int threads) {
    memcpy(s->x, e->embed, sizeof(float) * s->d);
    lone_layers(s, layers, count, resid, resid_stride, keys, values, write, first, n, threads);
    if (resid)
        memcpy(resid + count * resid_stride, s->x, sizeof(float) * s->d);
    norm_row(s->x, e->norm, s->h, s->d, s->eps);
    s->product(s->h, s->d, 1, e->head, s->d, e->vocab, e->head_bias, e->logits, e->vocab, threads);
}

/* ---- A token's pick and description from one row of logits (engine/core/generate.py's `quick_facts`) ------------

   What describing a token needs of its row of logits x [v] (a vocabulary of tens of thousands), in two passes where
   torch made about ten operators over the row (a softmax, an argmax, a top-k, gathers, an exp, a scatter and a
   sum), each cold after the LM head streamed its weights: the k largest logits and their ids, largest first and
   the lower id first among equal ones (the first is the greedy token, as numpy's and torch's argmax give it), the
   log of the row's sum of exp(x - max), and where v > k the largest logit left out (L) and the log of the sum of
   exp(x - L) over every logit left out. The probabilities follow as exp(x - max) / sum: a softmax's, the sum in
   another order than torch's (within a few ulp). */

typedef struct { float value; long id; } scored_t;

#define BLOCK_SUM 512                                /* logits a block of float lanes sums before a double takes it */

static inline double lanes_total(vec acc) {
    double t = 0.0;
    for (int j = 0; j < EXP_LANES; j++)
        t += acc[j];
    return t;
}

static inline int before(scored_t a, scored_t b) {          /* a ranks ahead of b: larger, or equal with lower id */
    return a.value > b.value || (a.value == b.value && a.id < b.id);
}

/* A min-heap of the n best so far (its root the worst of them). */
static void sift_down(scored_t *h, long n, long i) {
    for (;;) {
        long worst = i, l = 2 * i + 1, r = l + 1;
        if (l < n && before(h[worst], h[l]))
            worst = l;
        if (r < n && before(h[worst], h[r]))
            worst = r;
        if (worst == i)
            return;
        scored_t t = h[i];
        h[i] = h[worst], h[worst] = t, i = worst;
    }
}

static int ranked(const void *a, const void *b) {
    return before(*(const scored_t *)a, *(const scored_t *)b) ? -1 : 1;
}

/* Whether any of the EXP_LANES logits at x is above `floor`. */
static inline int any_above(const float *x, float floor) {
    ivec over = *(const vec_u *)x > floor;
    long long parts[sizeof over / 8];
    memcpy(parts, &over, sizeof over);
    long long any = 0;
    for (unsigned j = 0; j < sizeof over / 8; j++)
        any |= parts[j];
    return any != 0;
}

/* The sum of exp(x - L) over the logits below L, in a pass of its own. */
static double rest_below(const float *x, long v, float left) {
    double total = 0.0;
    long i = 0;
    while (i + EXP_LANES <= v) {
        vec rest = {0};
        for (long end = i + BLOCK_SUM < v ? i + BLOCK_SUM : v; i + EXP_LANES <= end; i += EXP_LANES) {
            vec xv = *(const vec_u *)(x + i);
            rest += (vec)((ivec)expv(xv - left) & (xv < left));
        }
        total += lanes_total(rest);
    }
    for (; i < v; i++)
        total += x[i] < left ? expf(x[i] - left) : 0.0;
    return total;
}

/* The n-th largest of a[0..m) (n >= 1; a reordered; no NaNs): Hoare's quickselect, largest first. */
static float nth_largest(float *a, long m, long n) {
    long lo = 0, hi = m - 1, want = n - 1;
    while (lo < hi) {
        float pivot = a[lo + (hi - lo) / 2];
        long i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot)
                i++;
            while (a[j] < pivot)
                j--;
            if (i <= j) {
                float t = a[i];
                a[i++] = a[j], a[j--] = t;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            return a[want];
    }
    return a[want];
}

#define PICK_BLOCK 16                               /* logits a block: its largest found in vector lanes */

/* The n best logits of x[0..v) (by `before`, in any order) into best, reading most of the row only once, in
   vectors: the largest of each block of PICK_BLOCK; T, the n-th largest of those (n logits are >= T: those blocks'
   largest, so the n best are all >= T); then only the blocks whose largest reaches T, logit by logit, in id order,
   through the heap as `pick_row`'s scan. What it finds is the same n, so the same ranking. Where a row has NaNs, or
   too few blocks to gain, returns 0 and does nothing (the caller scans the row). A heap over the whole row took
   ~200 us of a 49,152-logit row here, most of a lone step's pick. */
static int best_by_blocks(const float *x, long v, long n, scored_t *best) {
    long blocks = v / PICK_BLOCK;                   /* whole blocks; the tail past them is always read */
    if (blocks < 4 * n)
        return 0;
    float *tops = malloc(sizeof(float) * 2 * blocks), *chosen = tops + blocks;
    if (!tops)
        return 0;
    ivec nan = {0};
    for (long b = 0; b < blocks; b++) {
        const float *xb = x + b * PICK_BLOCK;
        vec m = *(const vec_u *)xb;
        nan |= m != m;
        for (long j = EXP_LANES; j < PICK_BLOCK; j += EXP_LANES) {
            vec y = *(const vec_u *)(xb + j);
            ivec above = y > m;
            nan |= y != y;
            m = (vec)(((ivec)y & above) | ((ivec)m & ~above));
        }
        float t = m[0];
        for (int j = 1; j < EXP_LANES; j++)
            t = m[j] > t ? m[j] : t;
        tops[b] = chosen[b] = t;
    }
    long long parts[sizeof nan / 8], any = 0;
    memcpy(parts, &nan, sizeof nan);
    for (unsigned j = 0; j < sizeof nan / 8; j++)
        any |= parts[j];
    for (long i = blocks * PICK_BLOCK; i < v; i++)
        any |= x[i] != x[i];
    if (any) {
        free(tops);
        return 0;
    }
    float floor = nth_largest(chosen, blocks, n);
    long held = 0;
    for (long b = 0; b <= blocks; b++) {
        long lo = b * PICK_BLOCK, hi = b < blocks ? lo + PICK_BLOCK : v;
        if (b < blocks && tops[b] < floor)
            continue;
        for (long i = lo; i < hi; i++) {
            if (x[i] < floor)
                continue;
            if (held < n) {
                best[held++] = (scored_t){x[i], i};
                if (held == n)
                    for (long h = n / 2 - 1; h >= 0; h--)
                        sift_down(best, n, h);
            } else if (x[i] > best[0].value) {      /* equal: the lower id already held wins */
                best[0] = (scored_t){x[i], i};
                sift_down(best, n, 0);
            }
        }
    }
    free(tops);
    return held == n;
}

/* ids [k], vals [k]: the k largest, ranked; stats: [0] log sum exp(x - max), [1] L, [2] log sum exp(x - L) over
   the logits left out (stats[1..2] only where v > k). best: scratch of k + 1. */
void pick_row(const float *x, long v, long k, long *ids, float *vals, double *stats, scored_t *best) {
    long n = k < v ? k + 1 : v;                     /* the k kept, and the largest left out */
    long from = best_by_blocks(x, v, n, best) ? v : n;     /* where the scan below starts: v, none of it */
    if (from == n) {
        for (long j = 0; j < n; j++)
            best[j] = (scored_t){x[j], j};
        for (long j = n / 2 - 1; j >= 0; j--)
            sift_down(best, n, j);
    }
    for (long i = from; i < v; i++) {
        if (i % EXP_LANES == 0 && i + EXP_LANES <= v && !any_above(x + i, best[0].value)) {
            i += EXP_LANES - 1;                     /* none of these 8 would enter: most of a row, once warmed */
            continue;
        }
        if (x[i] > best[0].value) {                 /* equal: the lower id already held wins */
            best[0] = (scored_t){x[i], i};
            sift_down(best, n, 0);
        }
    }
    qsort(best, n, sizeof *best, ranked);
    for (long i = 0; i < k && i < n; i++)
        ids[i] = best[i].id, vals[i] = best[i].value;
    float top = best[0].value, left = n > k ? best[k].value : -INFINITY;   /* L: the largest left out */
    /* One pass: exp(x - top) for the row's sum, and the same terms below L for the rest's, whose log-sum-exp is
       then log(that sum * exp(top - L) + the logits equal to L left out) + L. Where L lies far below the top (60:
       exp(-60) of the largest term), the rest's terms could fall under expv's floor: a pass of their own. */
    int apart = n > k && top - left > 60.0f;
    double sum = 0.0, below = 0.0;
    long equal = 0, i = 0;
    while (i + EXP_LANES <= v) {                    /* float lanes over a block, each block's total in double */
        vec acc = {0}, rest = {0};
        ivec same = {0};
        for (long end = i + BLOCK_SUM < v ? i + BLOCK_SUM : v; i + EXP_LANES <= end; i += EXP_LANES) {
            vec xv = *(const vec_u *)(x + i), e = expv(xv - top);
            acc += e;
            rest += (vec)((ivec)e & (xv < left));
            same -= xv == left;                     /* a true lane is -1 */
        }
        sum += lanes_total(acc), below += lanes_total(rest);
        for (int j = 0; j < EXP_LANES; j++)
            equal += same[j];
    }
    for (; i < v; i++) {
        sum += expf(x[i] - top);
        below += x[i] < left ? expf(x[i] - top) : 0.0;
        equal += x[i] == left;
    }
    stats[0] = log(sum) + top;
    if (n <= k)
        return;
    for (long j = 0; j < k; j++)
        equal -= vals[j] == left;
    double rest = apart ? rest_below(x, v, left) : below * exp((double)top - left);
    stats[1] = left, stats[2] = log(rest + (double)equal) + left;
}
