/* A few rows times a float32 weight matrix, each weight read once: the products of a lone decode step.

       y[r, n] = sum_k x[r, k] * w[n, k]  (+ bias[n])      x (rows, in), w (out, in) as the checkpoint stores it

   Built once by engine/core/kernels/__init__.py (gcc -O3 -march=native -fopenmp -ffp-contract=fast, no
   -ffast-math) and called through ctypes with the tensors' addresses; docs/engine.md, "Alone at the floor", says
   why a kernel and what it measured.

   Each output's sum runs in ONE FIXED ORDER, whatever the number of rows, the output's neighbours or the thread
   that computes it: ACCS accumulators of LANES lanes, lane j of accumulator a adding x[k] * w[k] for
   k = LANES a + j, then k + SPAN, k + 2 SPAN, ... in k's order (a fused multiply-add where the CPU has one; the
   tail past the last full SPAN padded with zeros), then the accumulators and their lanes added in one fixed tree
   (total). So a row's result is bitwise the same alone, among up to eight rows, in any block of outputs (q|k|v side
   by side or apart) and with any number of threads (tests/test_row_kernel.py checks it).

   The weights stream once per call, one output row of w at a time (one sequential stream per thread: four rows
   read in step streamed at half the speed here, docs/engine.md), each loaded vector of w multiplied into every
   row's accumulators (rows in groups of up to GROUP, the row of w read again from the cache for the next group).
   Threads take fixed contiguous ranges of CHUNK outputs; the parallel region is the OpenMP runtime's already in
   the process (torch's libgomp, loaded first), so the team is torch's own: no second pool of threads. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* The vector: one register of the widest kind this machine has (the library is built for it, -march=native), so
   the order below is this machine's; AVX-512's 16 float32 lanes, AVX's 8, else SSE's (or a generic vector's) 4. */
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
#define ACCS 2                   /* accumulators per output, LANES float32 lanes each (one vector register) */
#define SPAN (LANES * ACCS)      /* the k's one pass adds in: accumulator a, lane j takes k = SPAN i + LANES a + j */
#define GROUP 4                  /* rows of x per pass over a row of w (accumulators: GROUP x ACCS vectors) */
#define CHUNK 16                 /* outputs per unit of the threads' split: a cache line of y. 64 split 576 outputs
                                    (SmolLM2's o and down) 4:5 between two threads, the second 1.11x the even half */

typedef float vec __attribute__((vector_size(4 * LANES)));
typedef float vec_u __attribute__((vector_size(4 * LANES), aligned(4), may_alias));   /* unaligned loads */

static inline vec load(const float *p) { return *(const vec_u *)p; }

/* The accumulators and their lanes added in one fixed order: accumulators pairwise, then halves of the lanes... */
static inline float total(const vec *acc) {
    vec a[ACCS];
    for (int i = 0; i < ACCS; i++)
        a[i] = acc[i];
    for (int width = ACCS / 2; width >= 1; width /= 2)
        for (int i = 0; i < width; i++)
            a[i] = a[i] + a[i + width];
    float s[LANES];
    memcpy(s, &a[0], sizeof s);
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; j++)
            s[j] = s[j] + s[j + width];
    return s[0];
}

/* Output n of rows [0, rows), rows <= GROUP (a constant where it is inlined). */
static inline __attribute__((always_inline)) void one_output(const float *x, long ldx, int rows, const float *w,
                                                             long in, long n, const float *bias, float *y,
                                                             long ldy) {
    const float *wn = w + n * in;
    vec acc[GROUP][ACCS];
    for (int r = 0; r < rows; r++)
        for (int a = 0; a < ACCS; a++)
            acc[r][a] = (vec){0};
    long k = 0;
    for (; k + SPAN <= in; k += SPAN)
        for (int a = 0; a < ACCS; a++) {
            vec wv = load(wn + k + LANES * a);
            for (int r = 0; r < rows; r++)
                acc[r][a] += load(x + r * ldx + k + LANES * a) * wv;    /* one FMA (-ffp-contract=fast) */
        }
    if (k < in) {                                        /* the tail, padded with zeros: the same lanes' order */
        float wt[SPAN] = {0}, xt[SPAN];
        memcpy(wt, wn + k, sizeof(float) * (in - k));
        for (int r = 0; r < rows; r++) {
            memset(xt, 0, sizeof xt);
            memcpy(xt, x + r * ldx + k, sizeof(float) * (in - k));
            for (int a = 0; a < ACCS; a++)
                acc[r][a] += load(xt + LANES * a) * load(wt + LANES * a);
        }
    }
    for (int r = 0; r < rows; r++) {
        float s = total(acc[r]);
        y[r * ldy + n] = bias ? s + bias[n] : s;
    }
}

/* Outputs [n0, n1) of every row, one row of w at a time, GROUP rows of x a pass over it. */
static void outputs(const float *x, long ldx, long rows, const float *w, long in, long n0, long n1,
                    const float *bias, float *y, long ldy) {
    for (long n = n0; n < n1; n++)
        for (long r = 0; r < rows; r += GROUP) {
            const float *xr = x + r * ldx;
            float *yr = y + r * ldy;
            switch (rows - r < GROUP ? rows - r : GROUP) {  /* constants, so the accumulators stay in registers */
            case 1: one_output(xr, ldx, 1, w, in, n, bias, yr, ldy); break;
            case 2: one_output(xr, ldx, 2, w, in, n, bias, yr, ldy); break;
            case 3: one_output(xr, ldx, 3, w, in, n, bias, yr, ldy); break;
            default: one_output(xr, ldx, 4, w, in, n, bias, yr, ldy); break;
            }
        }
}

/* Outputs [n0, n1) of every row: `outputs` here, `tiled_outputs` below. */
typedef void (*ranges)(const float *x, long ldx, long rows, const float *w, long in, long n0, long n1,
                       const float *bias, float *y, long ldy);

/* fn over all `out` outputs with `threads` threads (1: on the caller's thread alone), each thread a fixed contiguous
   range of whole units of `unit` outputs: a thread computes each of its outputs whole, never part of a sum. */
static void split(ranges fn, long unit, const float *x, long ldx, long rows, const float *w, long in, long out,
                  const float *bias, float *y, long ldy, int threads) {
    long units = (out + unit - 1) / unit;
    if (threads > units)
        threads = (int)units;
    if (threads <= 1) {
        fn(x, ldx, rows, w, in, 0, out, bias, y, ldy);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), team = omp_get_num_threads();
        long n0 = units * t / team * unit, n1 = units * (t + 1) / team * unit;
        fn(x, ldx, rows, w, in, n0, n1 < out ? n1 : out, bias, y, ldy);
    }
}

/* y (rows, out) = x (rows, in) w (out, in)^T + bias, with `threads` threads (1: on the caller's thread alone). */
void rows_linear(const float *x, long ldx, long rows, const float *w, long in, long out, const float *bias,
                 float *y, long ldy, int threads) {
    split(outputs, CHUNK, x, ldx, rows, w, in, out, bias, y, ldy, threads);
}

/* The threads a parallel region of this library would use from the calling thread (torch's count, when the
   runtime is torch's). */
int rows_max_threads(void) { return omp_get_max_threads(); }

/* ---- Many rows: the same order per output, blocked like a matrix product (engine/core/invariant.py's products).

   tiles_linear computes what rows_linear computes, bitwise, for any number of rows: each output's sum is the same
   ACCS x LANES accumulators fed in k's order and added up by `total`'s tree (as `fold` below, lane for lane), so a
   row's result is the same alone, among 20 or 2,048 rows, in whichever tile and on whichever thread.

   What changes is only which sums run side by side: a register tile of TR rows x TN outputs (TR x TN x ACCS
   accumulators, 24 of AVX-512's 32 registers; 12 of AVX's 16), each loaded vector of x used TN times and each of w
   TR times (with AVX-512, 7 loads per 12 multiply-adds where rows_linear's GROUP x 1 takes 5 per 4; both operands held in registers, see
   `tile`); a block of BLOCK_BYTES of weights kept in L2 while every group of TR rows of a block of ROW_BYTES of
   rows passes over it; threads over contiguous ranges of output tiles, never along k. */
#if defined(__AVX512F__)
#define TR 4                     /* rows of a register tile: 4 x 3 x ACCS = 24 accumulators of AVX-512's 32 registers */
#else
#define TR 2                     /* 2 x 3 x ACCS = 12 of AVX's (or SSE's) 16, beside TN vectors of w and one of x */
#endif
#define TN 3                     /* outputs of a register tile */
#define BLOCK_BYTES (192 * 1024) /* weights of the outputs every group of rows passes over in turn (L2 here) */
#define ROW_BYTES (256 * 1024)   /* rows every block of weights passes over in turn (L2 here, beside the weights) */

typedef float vec8 __attribute__((vector_size(32)));
typedef float vec4 __attribute__((vector_size(16)));
typedef float vec2 __attribute__((vector_size(8)));

/* `total` in vector halves: the same additions of the same lanes (lane j with lane j + width, width LANES / 2,
   ..., 2, 1). */
static inline float fold(const vec *acc) {
    vec a[ACCS];
    for (int i = 0; i < ACCS; i++)
        a[i] = acc[i];
    for (int width = ACCS / 2; width >= 1; width /= 2)
        for (int i = 0; i < width; i++)
            a[i] = a[i] + a[i + width];
#if LANES == 16
    vec8 h8 = __builtin_shufflevector(a[0], a[0], 0, 1, 2, 3, 4, 5, 6, 7)
            + __builtin_shufflevector(a[0], a[0], 8, 9, 10, 11, 12, 13, 14, 15);
#elif LANES == 8
    vec8 h8 = a[0];
#endif
#if LANES >= 8
    vec4 h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
#else
    vec4 h4 = a[0];
#endif
    vec2 h2 = __builtin_shufflevector(h4, h4, 0, 1) + __builtin_shufflevector(h4, h4, 2, 3);
    return h2[0] + h2[1];
}

/* Outputs [n, n + cols) of rows [0, rows), rows <= TR and cols <= TN (constants where it is inlined). */
static inline __attribute__((always_inline)) void tile(const float *x, long ldx, int rows, const float *w, long in,
                                                       long n, int cols, const float *bias, float *y, long ldy) {
    const float *wn = w + n * in;
    vec acc[TR][TN][ACCS];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            for (int a = 0; a < ACCS; a++)
                acc[r][c][a] = (vec){0};
    long k = 0;
    for (; k + SPAN <= in; k += SPAN)
        for (int a = 0; a < ACCS; a++) {
            vec wv[TN];
            for (int c = 0; c < cols; c++) {
                wv[c] = load(wn + c * in + k + LANES * a);
                __asm__("" : "+v"(wv[c]));   /* held in registers, both: gcc would otherwise load one of the two */
            }                                /* again as each multiply-add's memory operand (twice the loads) */
            for (int r = 0; r < rows; r++) {
                vec xv = load(x + r * ldx + k + LANES * a);
                __asm__("" : "+v"(xv));
                for (int c = 0; c < cols; c++)
                    acc[r][c][a] += xv * wv[c];                     /* one FMA, as one_output's */
            }
        }
    if (k < in) {                                        /* the tail, padded with zeros, as one_output pads it */
        float wt[TN][SPAN], xt[SPAN];
        for (int c = 0; c < cols; c++) {
            memset(wt[c], 0, sizeof wt[c]);
            memcpy(wt[c], wn + c * in + k, sizeof(float) * (in - k));
        }
        for (int r = 0; r < rows; r++) {
            memset(xt, 0, sizeof xt);
            memcpy(xt, x + r * ldx + k, sizeof(float) * (in - k));
            for (int c = 0; c < cols; c++)
                for (int a = 0; a < ACCS; a++)
                    acc[r][c][a] += load(xt + LANES * a) * load(wt[c] + LANES * a);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float s = fold(acc[r][c]);
            y[r * ldy + n + c] = bias ? s + bias[n + c] : s;
        }
}

#define TILE(R, C) tile(x, ldx, R, w, in, n, C, bias, y, ldy)
#define TILE_COLS(R) switch (cols) { case 1: TILE(R, 1); break; case 2: TILE(R, 2); break; default: TILE(R, 3); }

/* One register tile, its row and output counts made constants for the compiler. */
static void tile_of(const float *x, long ldx, int rows, const float *w, long in, long n, int cols,
                    const float *bias, float *y, long ldy) {
    switch (rows) {
    case 1: TILE_COLS(1); break;
#if TR == 4
    case 2: TILE_COLS(2); break;
    case 3: TILE_COLS(3); break;
    default: TILE_COLS(4); break;
#else
    default: TILE_COLS(2); break;
#endif
    }
}

/* Outputs [n0, n1) of every row: a block of ROW_BYTES of rows at a time (kept in L2 while every block of outputs
   passes over it), a block of BLOCK_BYTES of weights at a time (kept in L2 while every group of TR rows of the row
   block passes over it), TN outputs a register tile. */
static void tiled_outputs(const float *x, long ldx, long rows, const float *w, long in, long n0, long n1,
                          const float *bias, float *y, long ldy) {
    long block = BLOCK_BYTES / (4 * in) / TN * TN, row_block = ROW_BYTES / (4 * in) / TR * TR;
    block = block < TN ? TN : block;
    row_block = row_block < TR ? TR : row_block;
    for (long m0 = 0; m0 < rows; m0 += row_block) {
        long m1 = m0 + row_block < rows ? m0 + row_block : rows;
        for (long b0 = n0; b0 < n1; b0 += block) {
            long b1 = b0 + block < n1 ? b0 + block : n1;
            for (long r = m0; r < m1; r += TR) {
                int tr = m1 - r < TR ? (int)(m1 - r) : TR;
                for (long n = b0; n < b1; n += TN)
                    tile_of(x + r * ldx, ldx, tr, w, in, n, b1 - n < TN ? (int)(b1 - n) : TN, bias, y + r * ldy, ldy);
            }
        }
    }
}

/* As rows_linear, bitwise, for any number of rows: threads take contiguous ranges of TN-output tiles. */
void tiles_linear(const float *x, long ldx, long rows, const float *w, long in, long out, const float *bias,
                  float *y, long ldy, int threads) {
    split(tiled_outputs, TN, x, ldx, rows, w, in, out, bias, y, ldy, threads);
}

/* ---- Many rows on weights packed once in panels: the same order per output, each sum in two halves.

   An output's ACCS = 2 accumulators never meet until `fold`: accumulator 0 takes the first LANES k's of every span,
   accumulator 1 the last LANES. So each can run alone over its half of the span's k's, in k's order, and the two be
   folded after: the same sums as rows_linear's, bitwise, with half the accumulators live at a time. That frees the
   registers for a tile of PR rows x PN outputs (12 accumulators of AVX's 16, beside PN vectors of w and one of x):
   each loaded vector of w used PR times and each of x PN times, 7 loads per 12 multiply-adds where `tile` takes 5
   per 6; docs/engine.md, "Room products on panels", has what it measured.

   The layout that makes each half one contiguous stream: a panel of PN outputs (or PR rows of x) holds, for half a
   and span i, the PN rows' LANES floats of k = SPAN i + LANES a ... side by side ([a][i][c][LANES]), the tail past
   the last full span padded with zeros as one_output pads it, a short last panel with zero rows. The weights are
   packed once (`panels_pack`, a copy the size of the weights: engine/core/small_batch.py keeps it in place of
   oneDNN's); the rows of x are packed at each call into a buffer of the calling thread, every thread of the team
   packing a share. Threads over contiguous ranges of output panels, never along k. */
#define PR 4                     /* rows of x in a panel (and in a register tile) */
#define PN 3                     /* outputs in a panel of weights (and in a register tile) */

/* Spans of SPAN k's in a row of `in`, the last padded. */
static long spans(long in) { return (in + SPAN - 1) / SPAN; }

/* Floats in the packed copy of an (out, in) weight: whole panels of PN outputs (RowKernel.pack allocates it). */
long panels_floats(long in, long out) { return (out + PN - 1) / PN * PN * spans(in) * SPAN; }

/* The first n (<= width) rows of src (row stride ld) as one panel of `width` rows: dst[a][i][c][LANES]. */
static void pack_panel(const float *src, long ld, int n, int width, long in, float *dst) {
    long s = spans(in);
    for (int a = 0; a < ACCS; a++)
        for (long i = 0; i < s; i++)
            for (int c = 0; c < width; c++) {
                float *d = dst + ((a * s + i) * width + c) * LANES;
                long k = i * SPAN + a * LANES, have = c < n ? in - k : 0;
                have = have < 0 ? 0 : have > LANES ? LANES : have;
                memcpy(d, src + c * ld + k, sizeof(float) * have);
                memset(d + have, 0, sizeof(float) * (LANES - have));
            }
}

/* w (out, in) packed into wp (panels_floats(in, out) floats), with `threads` threads. */
void panels_pack(const float *w, long in, long out, float *wp, int threads) {
    long panels = (out + PN - 1) / PN, size = PN * spans(in) * SPAN;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long p = 0; p < panels; p++)
        pack_panel(w + p * PN * in, in, out - p * PN < PN ? (int)(out - p * PN) : PN, PN, in, wp + p * size);
}

/* Outputs [n, n + cols) of a panel's `rows` rows (constants where inlined): each half's PR x PN accumulators over
   its s spans in k's order, then each output's two folded as `total` adds them. */
static inline __attribute__((always_inline)) void panel_tile(const float *xp, const float *wp, long s, int rows,
                                                             int cols, const float *bias, float *y, long ldy,
                                                             long n) {
    vec half[ACCS][PR][PN];
    for (int a = 0; a < ACCS; a++) {
        vec acc[PR][PN];
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < PN; c++)
                acc[r][c] = (vec){0};
        const float *xa = xp + a * s * PR * LANES, *wa = wp + a * s * PN * LANES;
        for (long i = 0; i < s; i++) {
            vec wv[PN];
            for (int c = 0; c < PN; c++) {
                wv[c] = load(wa + (i * PN + c) * LANES);
                __asm__("" : "+v"(wv[c]));          /* held in registers, as in `tile` */
            }
            for (int r = 0; r < rows; r++) {
                vec xv = load(xa + (i * PR + r) * LANES);
                __asm__("" : "+v"(xv));
                for (int c = 0; c < PN; c++)
                    acc[r][c] += xv * wv[c];                        /* one FMA, as one_output's */
            }
        }
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < PN; c++)
                half[a][r][c] = acc[r][c];
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            vec pair[ACCS] = {half[0][r][c], half[1][r][c]};
            float v = fold(pair);
            y[r * ldy + n + c] = bias ? v + bias[n + c] : v;
        }
}

/* One register tile, its row count made a constant for the compiler. */
static void panel_tile_of(const float *xp, const float *wp, long s, int rows, int cols, const float *bias, float *y,
                          long ldy, long n) {
    switch (rows) {
    case 1: panel_tile(xp, wp, s, 1, cols, bias, y, ldy, n); break;
    case 2: panel_tile(xp, wp, s, 2, cols, bias, y, ldy, n); break;
    case 3: panel_tile(xp, wp, s, 3, cols, bias, y, ldy, n); break;
    default: panel_tile(xp, wp, s, PR, cols, bias, y, ldy, n); break;
    }
}

/* The calling thread's buffer for packed rows of x, grown as needed (kept: a room's steps reuse it). */
static __thread float *rows_buffer;
static __thread long rows_capacity;

static float *rows_space(long floats) {
    if (floats > rows_capacity) {
        free(rows_buffer);
        rows_buffer = aligned_alloc(64, (size_t)((floats * 4 + 63) / 64 * 64));
        rows_capacity = rows_buffer ? floats : 0;
    }
    return rows_buffer;
}

/* As rows_linear, bitwise, for any number of rows, on wp = the weight packed by panels_pack. Returns 0, or -1 where
   no memory could be had for the packed rows (nothing written). Blocked as tiles_linear: ROW_BYTES of packed rows
   kept while BLOCK_BYTES of panels pass over them. */
int panels_linear(const float *x, long ldx, long rows, const float *wp, long in, long out, const float *bias,
                  float *y, long ldy, int threads) {
    long s = spans(in), xsize = PR * s * SPAN, wsize = PN * s * SPAN;
    long rpanels = (rows + PR - 1) / PR, panels = (out + PN - 1) / PN;
    float *xp = rows_space(rpanels * xsize);
    if (!xp)
        return -1;
    long block = BLOCK_BYTES / (4 * wsize), row_block = ROW_BYTES / (4 * xsize);
    block = block < 1 ? 1 : block;
    row_block = row_block < 1 ? 1 : row_block;
    if (threads > panels)
        threads = (int)panels;
#pragma omp parallel num_threads(threads > 1 ? threads : 1)
    {
        int t = omp_get_thread_num(), team = omp_get_num_threads();
#pragma omp for schedule(static)
        for (long q = 0; q < rpanels; q++)
            pack_panel(x + q * PR * ldx, ldx, rows - q * PR < PR ? (int)(rows - q * PR) : PR, PR, in, xp + q * xsize);
        long p0 = panels * t / team, p1 = panels * (t + 1) / team;
        for (long q0 = 0; q0 < rpanels; q0 += row_block) {
            long q1 = q0 + row_block < rpanels ? q0 + row_block : rpanels;
            for (long b0 = p0; b0 < p1; b0 += block) {
                long b1 = b0 + block < p1 ? b0 + block : p1;
                for (long q = q0; q < q1; q++)
                    for (long p = b0; p < b1; p++)
                        panel_tile_of(xp + q * xsize, wp + p * wsize, s, rows - q * PR < PR ? (int)(rows - q * PR) : PR,
                                      out - p * PN < PN ? (int)(out - p * PN) : PN, bias, y + q * PR * ldy, ldy,
                                      p * PN);
            }
        }
    }
    return 0;
}
