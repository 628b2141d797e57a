/* Weight-only int8 with one fp16 scale per group of 32 inputs (llama.cpp's Q8_0 numbers),
 * multiplied with activations quantized the same way, in integer arithmetic.
 *
 * Why: at batch 1 a decode step is bound by reading the weights. Per-row int8 (aten's
 * _weight_int8pack_mm) loses accuracy (one scale for 896-4864 inputs) and reaches about 37%
 * of the read bandwidth here; bf16 reads twice the bytes. Groups of 32 keep the error of
 * each weight within half a step of its own group (the default model's GGUF tensors are
 * Q5_0 / Q8_0 in groups of 32, so they are stored exactly), and AVX512-VNNI's vpdpbusd does
 * 64 byte products per instruction, so the kernel stays bound by bandwidth.
 *
 * Storage (engine/quant/q8.py builds it): codes u8 [N, K] = c + 128 (interleaved, below) (c in -127..127), scales
 * fp16 [N, K/32], w[n, k] = scale[n, k/32] * c[n, k]. K is a multiple of 32.
 *
 * Activations: per row and group of 32, xs = amax / 127, xi = round(x / xs) in -127..127
 * (and a second byte for the remainder, see quantize_row: about 16 bits per group in all).
 * For one group: sum_k w x ~= scale * xs * (sum_k u xi - 128 sum_k xi), u = c + 128 unsigned
 * (vpdpbusd multiplies unsigned by signed bytes). The correction -128 sum(xi) depends on the
 * activation only: it is computed once per row and group and seeds the integer accumulator.
 * Codes are stored interleaved (below), so that one 32-bit lane accumulates one whole group.
 *
 * Threads: OpenMP over output rows. Loaded after torch, this library binds to the libgomp
 * torch already loaded (same soname), so both share one thread team per calling thread.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define MS_VNNI 1
#else
#define MS_VNNI 0
#endif

#define QK 32      /* inputs per group */
#define MT 4       /* activation rows sharing one pass over a weight row */

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);   /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                            /* nearest even */
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else {                      /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) { mant <<= 1; exp--; }
            u = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int ms_q8_vnni(void) { return MS_VNNI; }

/* The interleaved layout (weights and activations alike). Groups are taken 16 at a time (a
 * "block", 512 inputs; the last block of a row may hold fewer, g). Inside a block the bytes are
 * ordered [j = 0..7][group i = 0..g-1][4 bytes]: chunk j holds bytes 4j..4j+3 of every group.
 * vpdpbusd sums 4 byte products per 32-bit lane, so 8 instructions over the 8 chunks leave
 * lane i holding group i's whole dot product: one convert and one multiply-add then scale 16
 * groups at once (a group per lane), instead of 8 lanes per group. */
#define BLOCK_GROUPS 16

static inline int64_t interleaved_at(int64_t group, int byte, int64_t groups) {
    int64_t block = group / BLOCK_GROUPS, i = group % BLOCK_GROUPS;
    int64_t g = groups - block * BLOCK_GROUPS < BLOCK_GROUPS ? groups - block * BLOCK_GROUPS : BLOCK_GROUPS;
    return block * BLOCK_GROUPS * QK + (byte / 4) * 4 * g + i * 4 + byte % 4;
}

/* Quantize one activation row in two parts: x ~= xs * (hi + lo / LO_STEPS), hi = round(x / xs)
 * in -127..127 and lo the rounded remainder in -127..127 (|x / xs - hi| <= 1/2). That keeps about
 * 16 bits of each group's range, finer than the bf16 activations themselves, so the kernel adds
 * almost no error of its own beyond the weights' (its cost is compute, which decoding has to spare;
 * the caller may skip the second part where compute is the bound, `precise` = 0).
 * xi: [2][K] interleaved (hi row, then lo row); xs [K/32]; seed [2][K/32] = -offset * sum of each
 * part (offset: what the weight codes add to c to make it unsigned, 128 for q8, 16 for q5). */
#define LO_STEPS 254

static void quantize_row(const void *x, int x_bf16, int64_t K, int offset, int8_t *xi, float *xs, int32_t *seed) {
    const int64_t groups = K / QK;
    for (int64_t g = 0; g < groups; g++) {
        float v[QK], amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            int64_t k = g * QK + j;
            v[j] = x_bf16 ? bf16_to_f32(((const uint16_t *)x)[k]) : ((const float *)x)[k];
            float a = fabsf(v[j]);
            amax = a > amax ? a : amax;
        }
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum_hi = 0, sum_lo = 0;
        for (int j = 0; j < QK; j++) {
            float scaled = v[j] * inv;
            int hi = (int)lrintf(scaled);
            hi = hi > 127 ? 127 : (hi < -127 ? -127 : hi);
            int lo = (int)lrintf((scaled - (float)hi) * (float)LO_STEPS);
            lo = lo > 127 ? 127 : (lo < -127 ? -127 : lo);
            int64_t at = interleaved_at(g, j, groups);
            xi[at] = (int8_t)hi;
            xi[K + at] = (int8_t)lo;
            sum_hi += hi;
            sum_lo += lo;
        }
        xs[g] = amax / 127.0f;
        seed[g] = -offset * sum_hi;            /* the codes are stored as c + offset */
        seed[groups + g] = -offset * sum_lo;
    }
}

#define Q5_CHUNK_BYTES 40   /* q5 layout, below */

#if MS_VNNI
static inline __m512i unpack5(const uint8_t *chunk) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i nib = _mm256_loadu_si256((const __m256i *)chunk);
    __m256i lo = _mm256_and_si256(nib, low4), hi = _mm256_and_si256(_mm256_srli_epi16(nib, 4), low4);
    uint64_t bits;
    memcpy(&bits, chunk + 32, 8);
    __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    return _mm512_or_si512(w, _mm512_maskz_set1_epi8((__mmask64)bits, 0x10));
}

/* One weight row against ROWS activation rows (a compile-time constant at each call, so the
 * accumulators stay in registers); out[m] gets the dot products. Per group lane:
 * (sum u hi - 128 sum hi) * LO_STEPS + (sum u lo - 128 sum lo), exact in int32. */
static inline __attribute__((always_inline)) void row_dot_n(const uint8_t *w, const uint16_t *wscales, int64_t K,
        const int8_t *xi, const float *xs, const int32_t *seed, const int ROWS, const int PRECISE, const int Q5,
        float *out) {
    const int64_t groups = K / QK;
    const __m512i lo_steps = _mm512_set1_epi32(LO_STEPS);
    const __m512 unit = _mm512_set1_ps(PRECISE ? 1.0f / (float)LO_STEPS : 1.0f);
    __m512 acc[MT];
    for (int m = 0; m < ROWS; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < groups; b0 += BLOCK_GROUPS) {
        const int64_t g = groups - b0 < BLOCK_GROUPS ? groups - b0 : BLOCK_GROUPS;
        const __mmask16 lanes = (__mmask16)((1u << g) - 1u);
        const __mmask64 bytes = g == BLOCK_GROUPS ? ~0ull : ((1ull << (4 * g)) - 1ull);
        __m512i wv[8];     /* q8: the block's chunks as stored; q5: unpacked (same byte order) */
        for (int j = 0; j < 8; j++)
            wv[j] = Q5 ? unpack5(w + (b0 / BLOCK_GROUPS * 8 + j) * Q5_CHUNK_BYTES)
                       : _mm512_maskz_loadu_epi8(bytes, w + b0 * QK + j * 4 * g);
        __m512 wscale = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, wscales + b0)), unit);
        for (int m = 0; m < ROWS; m++) {
            const int8_t *hi = xi + m * 2 * K + b0 * QK, *lo = hi + K;
            const int32_t *sd = seed + m * 2 * groups + b0;
            /* independent accumulation chains (hi/lo x even/odd chunks): vpdpbusd's latency
             * would otherwise serialise the products of a block */
            __m512i h0 = _mm512_maskz_loadu_epi32(lanes, sd), h1 = _mm512_setzero_si512();
            __m512i l0 = _mm512_setzero_si512(), l1 = _mm512_setzero_si512();
            if (PRECISE) l0 = _mm512_maskz_loadu_epi32(lanes, sd + groups);
            for (int j = 0; j < 8; j += 2) {
                h0 = _mm512_dpbusd_epi32(h0, wv[j], _mm512_maskz_loadu_epi8(bytes, hi + j * 4 * g));
                h1 = _mm512_dpbusd_epi32(h1, wv[j + 1], _mm512_maskz_loadu_epi8(bytes, hi + (j + 1) * 4 * g));
                if (PRECISE) {
                    l0 = _mm512_dpbusd_epi32(l0, wv[j], _mm512_maskz_loadu_epi8(bytes, lo + j * 4 * g));
                    l1 = _mm512_dpbusd_epi32(l1, wv[j + 1], _mm512_maskz_loadu_epi8(bytes, lo + (j + 1) * 4 * g));
                }
            }
            __m512i dot = _mm512_add_epi32(h0, h1);
            if (PRECISE) dot = _mm512_add_epi32(_mm512_mullo_epi32(dot, lo_steps), _mm512_add_epi32(l0, l1));
            __m512 scale = _mm512_mul_ps(wscale, _mm512_maskz_loadu_ps(lanes, xs + m * groups + b0));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[m]);
        }
    }
    for (int m = 0; m < ROWS; m++) out[m] = _mm512_reduce_add_ps(acc[m]);
}

/* dispatch to the compile-time variant: rows 1..4, precise or not, q8 or q5 rows */
static void row_dot_any(const uint8_t *w, const uint16_t *wscales, int64_t K, const int8_t *xi, const float *xs,
                        const int32_t *seed, int64_t rows, int precise, int q5, float *out) {
#define ROW_DOT_CASE(R, P, Q) case (R) * 4 + (P) * 2 + (Q): row_dot_n(w, wscales, K, xi, xs, seed, R, P, Q, out); break;
#define ROW_DOT_ROWS(R) ROW_DOT_CASE(R, 0, 0) ROW_DOT_CASE(R, 0, 1) ROW_DOT_CASE(R, 1, 0) ROW_DOT_CASE(R, 1, 1)
    switch ((rows < MT ? rows : MT) * 4 + (precise != 0) * 2 + (q5 != 0)) {
        ROW_DOT_ROWS(1) ROW_DOT_ROWS(2) ROW_DOT_ROWS(3) ROW_DOT_ROWS(4)
    }
#undef ROW_DOT_ROWS
#undef ROW_DOT_CASE
}

static void row_dot(const uint8_t *w, const uint16_t *wscales, int64_t K, const int8_t *xi, const float *xs,
                    const int32_t *seed, int64_t rows, int precise, float *out) {
    row_dot_any(w, wscales, K, xi, xs, seed, rows, precise, 0, out);
}

static void row_dot5(const uint8_t *w, const uint16_t *wscales, int64_t K, const int8_t *xi, const float *xs,
                     const int32_t *seed, int64_t rows, int precise, float *out) {
    row_dot_any(w, wscales, K, xi, xs, seed, rows, precise, 1, out);
}
#else
static void row_dot(const uint8_t *w, const uint16_t *wscales, int64_t K, const int8_t *xi, const float *xs,
                    const int32_t *seed, int64_t rows, int precise, float *out) {
    const int64_t groups = K / QK;
    for (int64_t m = 0; m < rows; m++) {
        const int8_t *hi = xi + m * 2 * K, *lo = hi + K;
        const int32_t *sd = seed + m * 2 * groups;
        float acc = 0.0f;
        for (int64_t g = 0; g < groups; g++) {
            int32_t s_hi = sd[g], s_lo = sd[groups + g];
            for (int j = 0; j < QK; j++) {
                int64_t at = interleaved_at(g, j, groups);
                s_hi += (int32_t)w[at] * (int32_t)hi[at];
                s_lo += (int32_t)w[at] * (int32_t)lo[at];
            }
            int32_t s = precise ? s_hi * LO_STEPS + s_lo : s_hi;
            acc += f16_to_f32(wscales[g]) * (precise ? 1.0f / (float)LO_STEPS : 1.0f) * xs[m * groups + g] * (float)s;
        }
        out[m] = acc;
    }
}
#endif

/* The activations of one call, prepared once for every weight row. */
typedef struct { int8_t *xi; float *xs; int32_t *seed; } activations;

static int prepare(const void *x, int x_bf16, int64_t M, int64_t K, int offset, activations *a) {
    const int64_t groups = K / QK;
    a->xi = malloc((size_t)(2 * M * K));
    a->xs = malloc(sizeof(float) * (size_t)(M * groups));
    a->seed = malloc(sizeof(int32_t) * (size_t)(2 * M * groups));
    if (!a->xi || !a->xs || !a->seed) return -2;
    for (int64_t m = 0; m < M; m++)
        quantize_row((const char *)x + m * K * (x_bf16 ? 2 : 4), x_bf16, K, offset, a->xi + 2 * m * K,
                     a->xs + m * groups, a->seed + 2 * m * groups);
    return 0;
}

static void release(activations *a) { free(a->xi); free(a->xs); free(a->seed); }

static inline void store(void *y, int y_bf16, int64_t at, float v) {
    if (y_bf16) ((uint16_t *)y)[at] = f32_to_bf16(v);
    else ((float *)y)[at] = v;
}

/* y[M, N] = x[M, K] W^T (+ bias). x and y are bf16 or float32; bias float32 or NULL.
 * codes: u8 [N, K] interleaved (see above); scales: fp16 [N, K/32]. precise: both activation
 * parts (about 16 bits); 0: the first byte only (8-bit activations, half the multiplies). */
int ms_q8_linear(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *codes,
                 const uint16_t *scales, int64_t N, const float *bias, void *y, int y_bf16, int threads,
                 int precise) {
    if (K % QK != 0 || M <= 0 || N <= 0) return -1;
    const int64_t groups = K / QK;
    activations a;
    if (prepare(x, x_bf16, M, K, 128, &a) != 0) { release(&a); return -2; }
    #pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads())
    for (int64_t n = 0; n < N; n++) {
        float out[MT];
        for (int64_t m0 = 0; m0 < M; m0 += MT) {
            int64_t rows = M - m0 < MT ? M - m0 : MT;
            row_dot(codes + n * K, scales + n * groups, K, a.xi + 2 * m0 * K, a.xs + m0 * groups,
                    a.seed + 2 * m0 * groups, rows, precise, out);
            for (int64_t r = 0; r < rows; r++) store(y, y_bf16, (m0 + r) * N + n, out[r] + (bias ? bias[n] : 0.0f));
        }
    }
    release(&a);
    return 0;
}

/* ---- q5: the same numbers when every code lies in -16..15 (the GGUF's Q5_0 tensors), packed
 * in 5 bits. Each chunk of a block (4g codes in the interleaved order above, g <= 16) is padded
 * to 64 positions and stored in 40 bytes: 32 bytes of nibbles (byte i: position i in the low
 * nibble, position i + 32 in the high one), then 8 bytes holding the fifth bit of position i
 * in bit i. Unpacked, position i is byte i again, so lane l still holds group l. Codes are c + 16. */
int64_t ms_q5_row_bytes(int64_t K) {
    const int64_t groups = K / QK;
    return ((groups + BLOCK_GROUPS - 1) / BLOCK_GROUPS) * 8 * Q5_CHUNK_BYTES;
}

#if MS_VNNI
#else
/* portable: unpack the row to q8's interleaved bytes (c + 16), then the same loop */
static void row_dot5(const uint8_t *w, const uint16_t *wscales, int64_t K, const int8_t *xi, const float *xs,
                     const int32_t *seed, int64_t rows, int precise, float *out) {
    const int64_t groups = K / QK;
    uint8_t *plain = malloc((size_t)K);
    for (int64_t b0 = 0; b0 < groups; b0 += BLOCK_GROUPS) {
        const int64_t g = groups - b0 < BLOCK_GROUPS ? groups - b0 : BLOCK_GROUPS;
        for (int j = 0; j < 8; j++) {
            const uint8_t *chunk = w + j * Q5_CHUNK_BYTES;
            uint8_t *dst = plain + b0 * QK + j * 4 * g;
            for (int64_t i = 0; i < 4 * g; i++) {
                int nibble = i < 32 ? chunk[i] & 0x0f : chunk[i - 32] >> 4;
                int high = (chunk[32 + i / 8] >> (i % 8)) & 1;
                dst[i] = (uint8_t)(nibble | (high << 4));
            }
        }
        w += 8 * Q5_CHUNK_BYTES;
    }
    row_dot(plain, wscales, K, xi, xs, seed, rows, precise, out);
    free(plain);
}
#endif

/* As ms_q8_linear, with q5-packed rows (ms_q5_row_bytes(K) bytes each). */
int ms_q5_linear(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *packed,
                 const uint16_t *scales, int64_t N, const float *bias, void *y, int y_bf16, int threads,
                 int precise) {
    if (K % QK != 0 || M <= 0 || N <= 0) return -1;
    const int64_t groups = K / QK, row_bytes = ms_q5_row_bytes(K);
    activations a;
    if (prepare(x, x_bf16, M, K, 16, &a) != 0) { release(&a); return -2; }
    #pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads())
    for (int64_t n = 0; n < N; n++) {
        float out[MT];
        for (int64_t m0 = 0; m0 < M; m0 += MT) {
            int64_t rows = M - m0 < MT ? M - m0 : MT;
            row_dot5(packed + n * row_bytes, scales + n * groups, K, a.xi + 2 * m0 * K, a.xs + m0 * groups,
                     a.seed + 2 * m0 * groups, rows, precise, out);
            for (int64_t r = 0; r < rows; r++) store(y, y_bf16, (m0 + r) * N + n, out[r] + (bias ? bias[n] : 0.0f));
        }
    }
    release(&a);
    return 0;
}

/* Rows `ids` of a q5-packed table (an embedding: rows of ms_q5_row_bytes(K) bytes, fp16 scales
 * [V, K/32]), dequantized into out [n, hidden] (bf16 or float32). A decode step looks up one row:
 * done here it costs microseconds, where unpacking with tensor ops cost about a millisecond. */
int ms_q5_rows(const uint8_t *packed, const uint16_t *scales, int64_t K, int64_t hidden, const int64_t *ids,
               int64_t n, void *out, int out_bf16) {
    const int64_t groups = K / QK, row_bytes = ms_q5_row_bytes(K);
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *row = packed + ids[r] * row_bytes;
        const uint16_t *srow = scales + ids[r] * groups;
        for (int64_t k = 0; k < hidden; k++) {
            int64_t g = k / QK, b = g / BLOCK_GROUPS, j = k % QK;
            int64_t pos = (g % BLOCK_GROUPS) * 4 + j % 4;                 /* within chunk j / 4 */
            const uint8_t *chunk = row + b * 8 * Q5_CHUNK_BYTES + (j / 4) * Q5_CHUNK_BYTES;
            int nibble = pos < 32 ? chunk[pos] & 0x0f : chunk[pos - 32] >> 4;
            int high = (chunk[32 + pos / 8] >> (pos % 8)) & 1;
            float v = f16_to_f32(srow[g]) * (float)((nibble | (high << 4)) - 16);
            store(out, out_bf16, r * hidden + k, v);
        }
    }
    return 0;
}

/* The weights as bf16 [N, K] (plain input order), for calls of many rows: there a bf16 GEMM
 * (oneDNN) beats the integer kernel, and unpacking once per call costs less than its compute.
 * q5: packed rows (ms_q5_row_bytes); else q8 rows. Each block is first brought to q8's chunk
 * bytes (q5: unpacked into 8 chunks of 64), then each group's 32 codes are gathered (4 bytes from
 * each chunk), scaled and rounded to bf16. */
static inline void group_to_bf16(const uint8_t *chunks, int64_t stride, int64_t i, int offset, float scale,
                                 uint16_t *dst) {
    uint8_t codes[QK];
    for (int j = 0; j < 8; j++) memcpy(codes + 4 * j, chunks + j * stride + 4 * i, 4);
#if MS_VNNI && defined(__AVX512BF16__)
    const __m512 s = _mm512_set1_ps(scale), off = _mm512_set1_ps((float)offset);
    for (int half = 0; half < 2; half++) {
        __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + 16 * half))));
        __m256bh b = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_sub_ps(v, off), s));
        _mm256_storeu_si256((__m256i *)(dst + 16 * half), (__m256i)b);
    }
#else
    for (int j = 0; j < QK; j++) dst[j] = f32_to_bf16(scale * (float)((int)codes[j] - offset));
#endif
}

int ms_q8_dequant_bf16(const uint8_t *codes, int q5, const uint16_t *scales, int64_t N, int64_t K, uint16_t *out,
                       int threads) {
    if (K % QK != 0) return -1;
    const int64_t groups = K / QK, row_bytes = q5 ? ms_q5_row_bytes(K) : K;
    #pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads())
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *row = codes + n * row_bytes;
        const uint16_t *srow = scales + n * groups;
        uint8_t plain[8 * 64];
        for (int64_t b0 = 0, b = 0; b0 < groups; b0 += BLOCK_GROUPS, b++) {
            const int64_t g = groups - b0 < BLOCK_GROUPS ? groups - b0 : BLOCK_GROUPS;
            const uint8_t *chunks;
            int64_t stride;
            if (q5) {
                for (int j = 0; j < 8; j++) {
                    const uint8_t *chunk = row + b * 8 * Q5_CHUNK_BYTES + j * Q5_CHUNK_BYTES;
                    for (int pos = 0; pos < 64; pos++) {
                        int nibble = pos < 32 ? chunk[pos] & 0x0f : chunk[pos - 32] >> 4;
                        plain[j * 64 + pos] = (uint8_t)(nibble | (((chunk[32 + pos / 8] >> (pos % 8)) & 1) << 4));
                    }
                }
                chunks = plain, stride = 64;
            } else {
                chunks = row + b0 * QK, stride = 4 * g;
            }
            for (int64_t i = 0; i < g; i++)
                group_to_bf16(chunks, stride, i, q5 ? 16 : 128, f16_to_f32(srow[b0 + i]), out + n * K + (b0 + i) * QK);
        }
    }
    return 0;
}
