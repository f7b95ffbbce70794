/* Attention whose order for a query row is fixed: softmax(q.k * scale) v over the row's keys, float32.

       out[b, t, h] = sum_j softmax_j(q[b, h, t] . k[b, h / G, j] * scale) v[b, h / G, j]     G = heads / kv heads

   Built once by engine/core/kernels/__init__.py (as rows.c: gcc -O3 -march=native -fopenmp -ffp-contract=fast, no
   -ffast-math) and called through ctypes by engine/core/kernels/attend.py; engine/core/invariant.py says why.

   A query's sum runs in ONE FIXED ORDER, whatever the other rows, the query's place in a prefill chunk or a decode
   step, and the thread that computes it:
   - the row's keys are read from its first real key (`first`: the first key its last query reads; a batch's rows
     are left-padded) in blocks of KEY_BLOCK keys counted from there, block after block in key order, an online
     softmax carried from block to block (flash attention's split, fixed);
   - a score is q[0] k[0] + q[1] k[1] + ... in d's order (one fused multiply-add chain per key, the block's keys side
     by side in vector lanes); the block's largest score, its weights p = exp(score - running max) (expv: the
     same polynomial in every lane) and their sum (16 lanes in one fixed tree, `total`, whatever the vector), then
     acc = acc * exp(old max - new max) + sum_j p_j v_j, j in key order; the keys a query does not read (masked,
     or past the row's end) weigh exactly 0, a block with none read is skipped: the same bits as a row alone.
   Threads take (row, kv head, tile of QTILE queries) items, dealt round, never a split of the keys, on torch's
   OpenMP team. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The vector: one register of the widest kind the target has (built with -march=native: this machine's), AVX-512's
   16 float32 lanes, AVX's 8, else SSE's (or a generic vector's) 4; a build may name LANES itself (-DLANES=16 on an
   AVX2 machine: gcc splits each vector in two), as tests/test_invariant_attention.py does to compare the widths on
   one CPU. Nothing a query computes depends on it (the order above is in keys and d, and the weights' sum keeps 16
   lanes, `total`), only how many registers the tiles below take. */
#ifndef LANES
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
#endif
#if defined(__AVX512F__)
#define REGISTERS 32             /* vector registers: AVX-512's zmm */
#else
#define REGISTERS 16             /* AVX's ymm, SSE's xmm */
#endif
#define KEY_BLOCK 64             /* keys per block: the split along the keys, the same for every row */
#define VECS (KEY_BLOCK / LANES) /* vectors of scores per block */
#define SUM_LANES 16             /* lanes the block's weights are added in (`total`), whatever the vector */
#define PARTS (SUM_LANES / LANES)            /* vectors that hold those lanes */
#define QTILE 16                 /* query rows per item: they share each block's transposed keys */
#define QUERIES 4                /* query heads carried through a block side by side */
/* Vectors of scores per query in flight (`scores`): QUERIES x CHUNK accumulators, plus CHUNK keys and the queries'
   QUERIES values, within the registers (16 + 8 of 32; 8 + 6 of 16: 16 accumulators there spilled, 6.90x SDPA's
   prefill on an AVX2 machine, docs/engine.md). */
#define CHUNK (REGISTERS == 32 && VECS % 4 == 0 ? 4 : 2)

typedef float vec __attribute__((vector_size(4 * LANES)));
typedef int32_t ivec __attribute__((vector_size(4 * LANES)));
typedef float vec_u __attribute__((vector_size(4 * LANES), aligned(4), may_alias));

static inline vec load(const float *p) { return *(const vec_u *)p; }
static inline void store(float *p, vec x) { *(vec_u *)p = x; }
static inline vec splat(float x) { return (vec){0} + x; }

/* a * b + c, one rounding where the CPU has a fused multiply-add: said, not left to gcc's contraction, which fused
   this sum in an AVX2 build of 8 lanes and not in one of 16 (each vector split in two), and the bits parted. */
static inline float mul_add(float a, float b, float c) {
#if defined(__FP_FAST_FMAF)                                                /* gcc's: the target has one */
    return __builtin_fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

/* exp(x) lane by lane for x <= 0 (Cephes' expf: x = n ln2 + r, a degree-5 polynomial in r, times 2^n); exactly 0
   below -87 (and for -inf): a key not read weighs nothing. About 1 ulp from expf. */
static inline vec expv(vec x) {
    ivec tiny = x < -87.0f;                                                 /* lanes of -1 (true) or 0 */
    x = (vec)(((ivec)x & ~tiny) | ((ivec)splat(-87.0f) & tiny));
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
    y = y * scale;
    return (vec)((ivec)y & ~tiny);
}

/* SUM_LANES lanes added in one fixed tree, halves, then halves of those... (lane j and lane j + 8 first), whatever
   the vector: the lanes are PARTS vectors (lane j of part i is lane LANES i + j), so the tree's steps are the parts
   pairwise while there are more than one, then the lanes of the last: the same additions as one 16-lane vector's. */
static inline float total(const vec *parts) {
    vec a[PARTS];
    memcpy(a, parts, sizeof a);
    for (int width = PARTS / 2; width >= 1; width /= 2)
        for (int i = 0; i < width; i++)
            a[i] = a[i] + a[i + width];
    float s[LANES];
    memcpy(s, &a[0], sizeof s);
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; j++)
            s[j] = s[j] + s[j + width];
    return s[0];
}

typedef struct {                 /* the shapes and strides (in floats) of one call */
    long heads, kv_heads, t, s, d;
    long qb, qh, qt;             /* q [B, H, T, D], d's stride 1 */
    long kb, kh, ks;             /* keys [B, KVH, S, D], d's stride 1 */
    long vb, vh, vs;             /* values as keys */
    long mb, mt;                 /* mask bytes [B, T, S] (1: read), s's stride 1; NULL: causal over the last T */
    float scale;
    long rows;                   /* B: never read by the arithmetic (tests/test_invariant_attention.py's mutation) */
} shape_t;

typedef struct { float top, sum; float *acc; } state_t;     /* one query head's running softmax */

/* Whether query t of row b reads key j. */
static inline int reads(const shape_t *p, const uint8_t *mask, long b, long t, long j) {
    return mask ? mask[b * p->mb + t * p->mt + j] != 0 : j <= p->s - p->t + t;
}

#define INLINE static inline __attribute__((always_inline))

/* HOLD(x): x loaded into a register once and used from there. Without it gcc folds the load into each multiply-add
   that reads x (one load per query, not one per key vector), and the loops run at the speed of their loads: the
   scores' and the values' loops about 1.3x as long on an AVX2 machine (docs/engine.md). Only where a vector is one
   register of the build; a build of wider vectors than the target's (-DLANES=16 on AVX2: two registers each) gets
   what gcc does. Nothing computed changes. */
#if defined(__x86_64__) && ((defined(__AVX512F__) && LANES <= 16) || (defined(__AVX__) && LANES <= 8) || LANES <= 4)
#define HOLD(x) __asm__("" : "+v"(x))
#else
#define HOLD(x) ((void)0)
#endif

/* score[i][j] = (q[i] . key j) * scale for the block's KEY_BLOCK keys: one multiply-add chain in d's order per key,
   the keys side by side in vector lanes (kt [D][KEY_BLOCK]: the block's keys, transposed). */
INLINE void scores(const shape_t *p, const float *const *q, const float *kt, float score[QUERIES][KEY_BLOCK]) {
    for (int c0 = 0; c0 < VECS; c0 += CHUNK) {                              /* CHUNK vectors of keys at a time */
        vec acc[QUERIES][CHUNK];
        for (int i = 0; i < QUERIES; i++)
            for (int c = 0; c < CHUNK; c++)
                acc[i][c] = (vec){0};
        for (long d = 0; d < p->d; d++)
            for (int c = 0; c < CHUNK; c++) {
                vec k = load(kt + d * KEY_BLOCK + (c0 + c) * LANES);
                HOLD(k);
                for (int i = 0; i < QUERIES; i++)
                    acc[i][c] = acc[i][c] + q[i][d] * k;
            }
        for (int i = 0; i < QUERIES; i++)
            for (int c = 0; c < CHUNK; c++)
                store(score[i] + (c0 + c) * LANES, acc[i][c] * p->scale);
    }
}

/* Causal (no mask): the block's keys j < upto are read, the rest set to -inf, in vectors; returns the largest score
   read. The same scores and the same maximum as `reads` key by key (a maximum does not depend on its order). */
INLINE float causal_top(float *score, long upto) {
    vec lane, tops = splat(-INFINITY), none = splat(-INFINITY);
    for (int j = 0; j < LANES; j++)
        lane[j] = (float)j;
    for (int c = 0; c < VECS; c++) {
        vec x = load(score + c * LANES);
        ivec keep = lane + (float)(c * LANES) < (float)upto;                /* lanes of -1 (read) or 0 */
        x = (vec)(((ivec)x & keep) | ((ivec)none & ~keep));
        store(score + c * LANES, x);
        ivec above = x > tops;
        tops = (vec)(((ivec)x & above) | ((ivec)tops & ~above));
    }
    float top = -INFINITY;
    for (int j = 0; j < LANES; j++)
        top = tops[j] > top ? tops[j] : top;
    return top;
}

/* One query's scores turned into its weights in place (0 for the keys it does not read), its running max and sum
   moved on; returns what its sums so far are scaled by (1 where it reads none of the block's n keys). */
INLINE float weigh(const shape_t *p, const uint8_t *mask, long b, long t, long n, long j0, float *score,
                   state_t *st) {
    float top = -INFINITY;
    if (mask) {
        for (long j = 0; j < KEY_BLOCK; j++) {
            if (j >= n || !reads(p, mask, b, t, j0 + j))
                score[j] = -INFINITY;
            top = score[j] > top ? score[j] : top;
        }
    } else
        top = causal_top(score, p->s - p->t + t - j0 + 1 < n ? p->s - p->t + t - j0 + 1 : n);
    if (top == -INFINITY) {                                                 /* none read: the state as it is */
        memset(score, 0, sizeof(float) * KEY_BLOCK);
        return 1.0f;
    }
    float new_top = st->top > top ? st->top : top;
    float shrink = st->top == -INFINITY ? 0.0f : expf(st->top - new_top);
    vec sums[PARTS];                                                        /* SUM_LANES lanes: keys j mod 16 */
    for (int i = 0; i < PARTS; i++)
        sums[i] = (vec){0};
    for (int c = 0; c < VECS; c++) {
        vec w = expv(load(score + c * LANES) - new_top);
        store(score + c * LANES, w);
        sums[c % PARTS] = sums[c % PARTS] + w;
    }
    st->sum = mul_add(st->sum, shrink, total(sums));
    st->top = new_top;
    return shrink;
}

/* acc = acc * shrink + sum_j weight_j v_j over the block's n keys in key order (d's lanes are independent). */
INLINE void add_values(const shape_t *p, const float *v, long n, float score[QUERIES][KEY_BLOCK],
                       const float *shrink, state_t *const *st) {
    for (long d = 0; d < p->d; d += 2 * LANES) {
        vec part[QUERIES][2];
        for (int i = 0; i < QUERIES; i++)
            part[i][0] = part[i][1] = (vec){0};
        int both = d + LANES < p->d;
        for (long j = 0; j < n; j++) {
            vec v0 = load(v + j * p->vs + d), v1 = both ? load(v + j * p->vs + d + LANES) : (vec){0};
            HOLD(v0);
            HOLD(v1);
            for (int i = 0; i < QUERIES; i++) {
                part[i][0] = part[i][0] + score[i][j] * v0;
                part[i][1] = part[i][1] + score[i][j] * v1;
            }
        }
        for (int i = 0; i < QUERIES; i++) {
            store(st[i]->acc + d, load(st[i]->acc + d) * shrink[i] + part[i][0]);
            if (both)
                store(st[i]->acc + d + LANES, load(st[i]->acc + d + LANES) * shrink[i] + part[i][1]);
        }
    }
}

/* QUERIES query heads against one block of keys, side by side (each query's operations the same as if alone:
   QUERIES only gives the CPU independent chains to run at once): kt [D][KEY_BLOCK] (the block's keys, transposed),
   v the block's first value row, n keys in the block (the rest zeros), j0 the block's first key; query i is row t[i]
   of q[i], its state st[i]. A tile's spare slots repeat a real query into a scratch state. */
static void one_block(const shape_t *p, const uint8_t *mask, long b, const long *t, const float *const *q,
                      const float *kt, const float *v, long n, long j0, state_t *const *st) {
    float score[QUERIES][KEY_BLOCK], shrink[QUERIES];
    scores(p, q, kt, score);
    for (int i = 0; i < QUERIES; i++)
        shrink[i] = weigh(p, mask, b, t[i], n, j0, score[i], st[i]);
    add_values(p, v, n, score, shrink, st);
}

/* The first key the row's last query reads: where its blocks start. */
static long first_key(const shape_t *p, const uint8_t *mask, long b) {
    if (!mask)
        return 0;
    for (long j = 0; j < p->s; j++)
        if (mask[b * p->mb + (p->t - 1) * p->mt + j])
            return j;
    return 0;
}

/* One past the last key any of queries [t0, t1) of row b reads: the blocks after it are skipped (none read). */
static long end_key(const shape_t *p, const uint8_t *mask, long b, long t0, long t1) {
    if (!mask)
        return p->s - p->t + t1;
    long end = 0;
    for (long t = t0; t < t1; t++)
        for (long j = p->s - 1; j >= end; j--)
            if (mask[b * p->mb + t * p->mt + j]) {
                end = j + 1;
                break;
            }
    return end;
}

typedef float vec8_t __attribute__((vector_size(32)));
typedef float vec8_u __attribute__((vector_size(32), aligned(4), may_alias));

/* kt [D][KEY_BLOCK] = the block's n keys k [n][D] (a key's stride ks) transposed, zeros past n: 8 x 8 tiles of vector
   shuffles (unpack, shuffle, lane swap: the usual 8 x 8 transpose; D a multiple of 16), a tile's rows past n zeros
   (never read: the row's last key may be the pool's last), the columns past the last tile zeros. (A decode step's
   last block is nearly always short, and was transposed element by element.) Only where the keys are copied
   changes with the way: every score reads the same kt. */
static void transpose_keys(float *kt, const float *k, long ks, long n, long d) {
    long tiles = (n + 7) / 8 * 8;
    if (tiles < KEY_BLOCK)
        for (long e = 0; e < d; e++)
            memset(kt + e * KEY_BLOCK + tiles, 0, sizeof(float) * (KEY_BLOCK - tiles));
    for (long j = 0; j < tiles; j += 8)
        for (long e = 0; e < d; e += 8) {
            vec8_t r[8], t[8], u[8];
            for (int i = 0; i < 8; i++)                                 /* r[i][x] = key j + i, dim e + x */
                r[i] = j + i < n ? (vec8_t)*(const vec8_u *)(k + (j + i) * ks + e) : (vec8_t){0};
            for (int i = 0; i < 8; i += 2) {
                t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
                t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
            }
            for (int i = 0; i < 8; i += 4) {
                u[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
                u[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
                u[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
                u[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
            }
            for (int i = 0; i < 4; i++) {                               /* row x of the tile: dim e + x */
                *(vec8_u *)(kt + (e + i) * KEY_BLOCK + j) = __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
                *(vec8_u *)(kt + (e + i + 4) * KEY_BLOCK + j) = __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
            }
        }
}

/* Item (b, g, tile): queries [t0, t1) of every query head kv head g serves. st: (t1 - t0) * G states. */
static void one_item(const shape_t *p, const float *q, const float *k, const float *v, const uint8_t *mask,
                     float *out, long b, long g, long t0, long t1, float *kt, state_t *st, float *spare_acc) {
    state_t spare[QUERIES];
    long group = p->heads / p->kv_heads, s = p->s, d = p->d;
    long block = KEY_BLOCK;                                                 /* keys per block, whatever the shapes */
    const float *kg = k + b * p->kb + g * p->kh, *vg = v + b * p->vb + g * p->vh;
    for (long i = 0; i < (t1 - t0) * group; i++) {
        st[i].top = -INFINITY, st[i].sum = 0.0f;
        memset(st[i].acc, 0, sizeof(float) * d);
    }
    long end = end_key(p, mask, b, t0, t1);
    for (long j0 = first_key(p, mask, b); j0 < end; j0 += block) {
        long n = s - j0 < block ? s - j0 : block;
        transpose_keys(kt, kg + j0 * p->ks, p->ks, n, d);
        long count = (t1 - t0) * group;                                     /* query heads, QUERIES at a time */
        for (long first = 0; first < count; first += QUERIES) {
            long t[QUERIES];
            const float *qs[QUERIES];
            state_t *sts[QUERIES];
            for (long i = 0; i < QUERIES; i++) {
                long at = first + i < count ? first + i : count - 1, h = at % group;
                t[i] = t0 + at / group;
                qs[i] = q + b * p->qb + (g * group + h) * p->qh + t[i] * p->qt;
                sts[i] = first + i < count ? &st[at] : &spare[i];
                if (first + i >= count)
                    *sts[i] = st[at], spare[i].acc = spare_acc + i * d, memcpy(spare_acc + i * d, st[at].acc,
                                                                                 sizeof(float) * d);
            }
            one_block(p, mask, b, t, qs, kt, vg + j0 * p->vs, n, j0, sts);
        }
    }
    for (long t = t0; t < t1; t++)                                          /* out [B, T, H, D] */
        for (long h = 0; h < group; h++) {
            state_t *one = &st[(t - t0) * group + h];
            float *o = out + ((b * p->t + t) * p->heads + g * group + h) * d;
            for (long e = 0; e < d; e++)
                o[e] = one->sum > 0.0f ? one->acc[e] / one->sum : 0.0f;
        }
}

/* The call: out [B, T, H, D] contiguous; d a multiple of 16 (every width's LANES); threads as torch's count. */
void attend(const float *q, const float *k, const float *v, const uint8_t *mask, float *out, long batch,
            const long *dims, float scale, int threads) {
    shape_t p = {dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], dims[7], dims[8], dims[9],
                 dims[10], dims[11], dims[12], dims[13], dims[14], dims[15], scale, batch};
    long tiles = (p.t + QTILE - 1) / QTILE, items = batch * p.kv_heads * tiles, group = p.heads / p.kv_heads;
    #pragma omp parallel num_threads(threads)
    {
        float *kt = aligned_alloc(64, sizeof(float) * p.d * KEY_BLOCK);
        state_t st[QTILE * 64];
        float *accs = aligned_alloc(64, sizeof(float) * p.d * QTILE * group);
        float *spare_acc = aligned_alloc(64, sizeof(float) * p.d * QUERIES);
        for (long i = 0; i < QTILE * group; i++)
            st[i].acc = accs + i * p.d;
        #pragma omp for schedule(static, 1)                 /* dealt round: a causal tile's work grows with t */
        for (long item = 0; item < items; item++) {
            long b = item / (p.kv_heads * tiles), g = item / tiles % p.kv_heads, t0 = item % tiles * QTILE;
            one_item(&p, q, k, v, mask, out, b, g, t0, t0 + QTILE < p.t ? t0 + QTILE : p.t, kt, st, spare_acc);
        }
        free(spare_acc);
        free(accs);
        free(kt);
    }
}

/* One row's queries (B = 1, typically a lone decode step's T = 1): the items `attend` would hand its threads, so the
   same bits, without allocations per call (scratch grows once per thread). With threads > 1 and more than one item
   (a kv head each, for T < QTILE) the items are dealt to the team as `attend` deals them; with 1, in turn on the
   calling thread, no parallel region (a team's fork and join cost as much as a short row's work with its keys in
   cache). In a lone step its keys are not: the products before it streamed the weights through every cache, and one
   thread reading a layer's keys and values (768 bytes a key each here) waits on memory; two read them side by side
   (docs/engine.md, "The last tenths"). dims as attend's; out [1, T, H, D]. Called from
   engine/core/kernels/attend.py and, through its address, from glue.c's lone_layers (a lone step's layers in one
   call). */
static void row_items(const shape_t *p, const float *q, const float *k, const float *v, float *out, long i0,
                      long step) {
    static __thread float *scratch;
    static __thread long have;
    long group = p->heads / p->kv_heads, tiles = (p->t + QTILE - 1) / QTILE;
    long need = p->d * KEY_BLOCK + p->d * QTILE * group + p->d * QUERIES;
    if (need > have) {
        free(scratch);
        scratch = aligned_alloc(64, sizeof(float) * ((need + 15) / 16 * 16));
        have = scratch ? need : 0;
    }
    if (!scratch)
        return;
    float *kt = scratch, *accs = kt + p->d * KEY_BLOCK, *spare_acc = accs + p->d * QTILE * group;
    state_t st[QTILE * 64];
    for (long i = 0; i < QTILE * group; i++)
        st[i].acc = accs + i * p->d;
    for (long item = i0; item < p->kv_heads * tiles; item += step) {
        long g = item / tiles, t0 = item % tiles * QTILE;
        one_item(p, q, k, v, NULL, out, 0, g, t0, t0 + QTILE < p->t ? t0 + QTILE : p->t, kt, st, spare_acc);
    }
}

void attend_row(const float *q, const float *k, const float *v, float *out, const long *dims, float scale,
                int threads) {
    shape_t p = {dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], dims[7], dims[8], dims[9],
                 dims[10], dims[11], dims[12], dims[13], dims[14], dims[15], scale, 1};
    long items = p.kv_heads * ((p.t + QTILE - 1) / QTILE);
    if (threads > items)
        threads = (int)items;
    if (threads <= 1) {
        row_items(&p, q, k, v, out, 0, 1);
        return;
    }
    #pragma omp parallel num_threads(threads)
    row_items(&p, q, k, v, out, omp_get_thread_num(), omp_get_num_threads());
}
