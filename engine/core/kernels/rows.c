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
#include <string.h>

#define ACCS 2                   /* accumulators per output, 16 float32 lanes each (one 512-bit vector) */
#define LANES 16
#define SPAN (LANES * ACCS)      /* the k's one pass adds in: accumulator a, lane j takes k = SPAN i + LANES a + j */
#define GROUP 4                  /* rows of x per pass over a row of w (accumulators: GROUP x ACCS vectors) */
#define CHUNK 64                 /* outputs per unit of the threads' split */

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

/* y (rows, out) = x (rows, in) w (out, in)^T + bias, with `threads` threads (1: on the caller's thread alone). */
void rows_linear(const float *x, long ldx, long rows, const float *w, long in, long out, const float *bias,
                 float *y, long ldy, int threads) {
    long chunks = (out + CHUNK - 1) / CHUNK;
    if (threads > chunks)
        threads = (int)chunks;
    if (threads <= 1) {
        outputs(x, ldx, rows, w, in, 0, out, bias, y, ldy);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), team = omp_get_num_threads();
        long c0 = chunks * t / team, c1 = chunks * (t + 1) / team;
        long n1 = c1 * CHUNK < out ? c1 * CHUNK : out;
        outputs(x, ldx, rows, w, in, c0 * CHUNK, n1, bias, y, ldy);
    }
}

/* The threads a parallel region of this library would use from the calling thread (torch's count, when the
   runtime is torch's). */
int rows_max_threads(void) { return omp_get_max_threads(); }
