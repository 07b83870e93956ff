/* The hidden layer's share of one SGD step of one net on a CPU, for blocked.py.
 *
 * At batch size 10 the hidden layer's products are skinny (10 rows against ~10^4 columns per
 * block) and MKL reaches about 40 GFLOP/s on them even in cache, less when the weights stream
 * from memory. These kernels stream each weight (and its momentum) once per pass with the
 * batch's accumulators in registers, and fuse the backward pass's three products (gradient to
 * the input, momentum, update) into one pass over the block.
 *
 * Bits: every output element is computed by the same sequence of IEEE single-precision
 * operations (fused multiply-adds in a fixed order, then a fixed scalar sum over 16 lanes),
 * whether built for AVX-512 (one 16-float register) or AVX2 (two 8-float registers), and
 * whatever the block's alignment. Built with -fno-fast-math -ffp-contract=off (kernels.py), so
 * the compiler neither fuses nor reorders anything itself.
 *
 * Shapes (row-major, leading dimensions in floats):
 *   x  (B, n)  the block's inputs (ReLU'd conv outputs), row stride ldx
 *   w  (H, n)  the block's hidden weights, row stride ldw; v (H, n) their momentum, same stride
 *   dz (B, H)  the gradient reaching the hidden layer's sum, row stride ldz
 *   gi (B, n)  the gradient reaching x, row stride ldgi
 */
#include <immintrin.h>
#include <stddef.h>

#define LANES 16     /* floats per vector, fixed: the summation order depends on it */
#define MAX_NB 10    /* batch rows whose accumulators stay in registers in the forward pass */
#define AHEAD 1024   /* floats the forward pass prefetches ahead in its two weight rows */
#define TILE 1024    /* columns the backward pass does for all rows before the next ones */
#define ROWS 4       /* weight rows the backward pass does together (their x and gi loaded once) */
#define AHEAD_ROWS 8 /* rows ahead the backward pass prefetches */

#if defined(__AVX512F__)
typedef __m512 vf;
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vset(float s) { return _mm512_set1_ps(s); }
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vf a) { _mm512_storeu_ps(p, a); }
static inline vf vload_n(const float *p, long k) { return _mm512_maskz_loadu_ps((__mmask16)((1u << k) - 1), p); }
static inline void vstore_n(float *p, vf a, long k) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << k) - 1), a); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline void vspill(float *p, vf a) { _mm512_storeu_ps(p, a); }
const char hidden_kernels_isa[] = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
typedef struct { __m256 lo, hi; } vf;
static inline vf vzero(void) { return (vf){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline vf vset(float s) { return (vf){_mm256_set1_ps(s), _mm256_set1_ps(s)}; }
static inline vf vload(const float *p) { return (vf){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void vstore(float *p, vf a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
/* Tails go through a zeroed buffer: AMD leaves it to the CPU whether VMASKMOVPS may fault on
 * masked-off elements. The lanes past k hold zeros, as AVX-512's masked loads give. */
static inline vf vload_n(const float *p, long k) {
    float t[LANES] = {0};
    for (long l = 0; l < k; l++) t[l] = p[l];
    return vload(t);
}
static inline void vstore_n(float *p, vf a, long k) {
    float t[LANES];
    vstore(t, a);
    for (long l = 0; l < k; l++) p[l] = t[l];
}
static inline vf vfma(vf a, vf b, vf c) { return (vf){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
static inline vf vmul(vf a, vf b) { return (vf){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
static inline vf vsub(vf a, vf b) { return (vf){_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
static inline void vspill(float *p, vf a) { vstore(p, a); }
const char hidden_kernels_isa[] = "avx2";
#else
#error "hidden_kernels.c needs AVX-512F or AVX2 with FMA"
#endif

#define INLINE static inline __attribute__((always_inline))

/* The lanes of a in order: the same scalar additions for both builds. */
INLINE float lane_sum(vf a) {
    float t[LANES], s;
    vspill(t, a);
    s = t[0];
    for (int l = 1; l < LANES; l++) s += t[l];
    return s;
}

/* out[b][0] = x[b] . w0, out[b][1] = x[b] . w1 for b < nb (nb a constant after inlining). */
INLINE void forward_pair(const int nb, long n, const float *x, long ldx, const float *w0, const float *w1,
                         const float *next0, const float *next1, float *out, long ldo) {
    vf a0[MAX_NB], a1[MAX_NB];
#pragma GCC unroll 16
    for (int b = 0; b < MAX_NB; b++) if (b < nb) a0[b] = a1[b] = vzero();
    long d = 0;
    for (; d + LANES <= n; d += LANES) {
        long p = d + AHEAD;  /* past the row's end: the start of the next pair's rows (within them) */
        if (p < n) {
            _mm_prefetch((const char *)(w0 + p), _MM_HINT_T0);
            _mm_prefetch((const char *)(w1 + p), _MM_HINT_T0);
        } else if (p - n < n) {
            _mm_prefetch((const char *)(next0 + (p - n)), _MM_HINT_T0);
            _mm_prefetch((const char *)(next1 + (p - n)), _MM_HINT_T0);
        }
        vf u0 = vload(w0 + d), u1 = vload(w1 + d);
#pragma GCC unroll 16
        for (int b = 0; b < MAX_NB; b++) if (b < nb) {
            vf xb = vload(x + b * ldx + d);
            a0[b] = vfma(xb, u0, a0[b]);
            a1[b] = vfma(xb, u1, a1[b]);
        }
    }
    if (d < n) {
        long k = n - d;
        vf u0 = vload_n(w0 + d, k), u1 = vload_n(w1 + d, k);
#pragma GCC unroll 16
        for (int b = 0; b < MAX_NB; b++) if (b < nb) {
            vf xb = vload_n(x + b * ldx + d, k);
            a0[b] = vfma(xb, u0, a0[b]);
            a1[b] = vfma(xb, u1, a1[b]);
        }
    }
#pragma GCC unroll 16
    for (int b = 0; b < MAX_NB; b++) if (b < nb) {
        out[b * ldo] = lane_sum(a0[b]);
        out[b * ldo + 1] = lane_sum(a1[b]);
    }
}

/* out (B, H), row stride ldo: out[b][h] = sum over the n columns of x[b][d] * w[h][d]. */
void hidden_forward(int B, int H, long n, const float *x, long ldx, const float *w, long ldw, float *out, long ldo) {
    float pair[MAX_NB][2];
    for (int b0 = 0; b0 < B; b0 += MAX_NB) {
        int nb = B - b0 < MAX_NB ? B - b0 : MAX_NB;
        const float *xb = x + b0 * ldx;
        for (int h = 0; h < H; h += 2) {
            const float *w0 = w + h * ldw, *w1 = h + 1 < H ? w0 + ldw : w0;  /* a last odd row twice */
            const float *next = h + 2 < H ? w0 + 2 * ldw : w0;
            const float *next1 = h + 3 < H ? next + ldw : next;
            switch (nb) {
#define CASE(k) case k: forward_pair(k, n, xb, ldx, w0, w1, next, next1, &pair[0][0], 2); break;
                CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10)
#undef CASE
            }
            for (int b = 0; b < nb; b++) {
                out[(b0 + b) * ldo + h] = pair[b][0];
                if (h + 1 < H) out[(b0 + b) * ldo + h + 1] = pair[b][1];
            }
        }
    }
}

/* Columns d..d+k (k = LANES where full) of rows h..h+nr: their gradient to x (added to gi),
 * then their momentum and update. */
INLINE void backward_vector(const int full, const int nr, long k, int B, int H, int h, long d, const float *x, long ldx,
                            const float *dz, long ldz, float *w, float *v, long ldw, float *gi, long ldgi,
                            vf vm, vf vlr) {
    vf u[ROWS], m[ROWS], g[ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++) if (r < nr) {
        float *wr = w + (h + r) * ldw + d, *vr = v + (h + r) * ldw + d;
        if (h + r + AHEAD_ROWS < H) {
            _mm_prefetch((const char *)(wr + AHEAD_ROWS * ldw), _MM_HINT_T0);
            _mm_prefetch((const char *)(vr + AHEAD_ROWS * ldw), _MM_HINT_T0);
        }
        u[r] = full ? vload(wr) : vload_n(wr, k);
        m[r] = full ? vload(vr) : vload_n(vr, k);
        g[r] = vzero();
    }
    for (int b = 0; b < B; b++) {
        const float *xb = x + b * ldx + d;
        float *gb = gi + b * ldgi + d;
        vf xv = full ? vload(xb) : vload_n(xb, k);
        vf gv = full ? vload(gb) : vload_n(gb, k);
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) if (r < nr) {
            vf z = vset(dz[b * ldz + h + r]);
            gv = vfma(z, u[r], gv);
            g[r] = vfma(z, xv, g[r]);
        }
        if (full) vstore(gb, gv); else vstore_n(gb, gv, k);
    }
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++) if (r < nr) {
        float *wr = w + (h + r) * ldw + d, *vr = v + (h + r) * ldw + d;
        m[r] = vfma(vm, m[r], vmul(vlr, g[r]));
        u[r] = vsub(u[r], m[r]);
        if (full) { vstore(vr, m[r]); vstore(wr, u[r]); } else { vstore_n(vr, m[r], k); vstore_n(wr, u[r], k); }
    }
}

/* Rows h..h+nr over the columns t0..end. */
INLINE void backward_rows(const int nr, int B, int H, int h, long t0, long end, const float *x, long ldx,
                          const float *dz, long ldz, float *w, float *v, long ldw, float *gi, long ldgi, vf vm, vf vlr) {
    long d = t0;
    for (; d + LANES <= end; d += LANES)
        backward_vector(1, nr, LANES, B, H, h, d, x, ldx, dz, ldz, w, v, ldw, gi, ldgi, vm, vlr);
    if (d < end)
        backward_vector(0, nr, end - d, B, H, h, d, x, ldx, dz, ldz, w, v, ldw, gi, ldgi, vm, vlr);
}

void hidden_backward(int B, int H, long n, const float *x, long ldx, const float *dz, long ldz, float *w, float *v,
                     long ldw, float *gi, long ldgi, float momentum, float lr) {
    vf vm = vset(momentum), vlr = vset(lr);
    for (long t0 = 0; t0 < n; t0 += TILE) {
        long end = n - t0 < TILE ? n : t0 + TILE;
        for (int b = 0; b < B; b++)
            for (long d = t0; d < end; d++) gi[b * ldgi + d] = 0.0f;
        for (int h = 0; h < H; h += ROWS) {
            int nr = H - h < ROWS ? H - h : ROWS;
            switch (nr) {
#define CASE(k) case k: backward_rows(k, B, H, h, t0, end, x, ldx, dz, ldz, w, v, ldw, gi, ldgi, vm, vlr); break;
                CASE(1) CASE(2) CASE(3) CASE(4)
#undef CASE
            }
        }
    }
}
