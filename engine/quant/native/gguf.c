/* GGUF's block formats run as they are stored: x [M, K] @ W.T with W's rows in Q4_K, Q5_K,
 * Q6_K, Q4_0, Q4_1, Q5_0 or Q8_0 blocks (ggml's layouts, byte for byte), never unpacked to a
 * full-precision copy.
 *
 * Why: at batch 1 a decode step is bound by reading the weights; the file's own 4.5-6.6 bits a
 * weight read faster than any 8-bit copy, and running them in place needs no copy in memory.
 *
 * Activations are quantized once per call, per block, to int8: amax / 127 per block of 256
 * inputs (with 16-input and 32-input sums of the codes, for the K formats' minimums and
 * offsets) or per block of 32 (with the codes' sum times the scale, for the 32-input formats).
 * Rounding: xi = nearest-even(x * (127 / amax)), d = amax / 127, both in float32. Then one
 * weight block against one activation block is an integer dot product of unsigned weight codes
 * (0..15, 0..31, 0..63; Q8_0 as |w| against sign(w) * x) with signed activation bytes, the
 * per-sub-block scales applied in integers, and one float multiply-add per block.
 *
 * Paths (compile time, -march=native): AVX512-VNNI (vpdpbusd / vpdpwssd on 256-bit vectors,
 * AVX512VL), AVX2 (vpmaddubsw + vpmaddwd: the same integers; no pair sum can saturate since
 * every unsigned code is below 64 or Q8_0's |w| <= 128 meets |x| <= 127), portable C.
 *
 * Several activation rows (up to ROWS at a time) run against each weight block while its codes
 * are unpacked in registers; the output rows are shared by the OpenMP team in tiles of TILE rows,
 * so each weight block is read from memory once per call. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define G_VNNI 1
#else
#define G_VNNI 0
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define G_SIMD 1
#include <immintrin.h>
#else
#define G_SIMD 0
#endif

/* ggml's type ids (GGMLQuantizationType). */
enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14 };
/* Not ggml types: rows interleaved by 16 (see "16 rows interleaved" below), ggml's id + 100. */
enum { T_Q5_0_X16 = 106, T_Q8_0_X16 = 108, T_Q4_K_X16 = 112, T_Q6_K_X16 = 114 };
#define X16 16
#define QK 32     /* inputs per block of the 32-input formats */
#define QKK 256   /* inputs per super-block of the K formats */
#define ROWS 8    /* activation rows per pass over a weight block */
#define TILE 16   /* weight rows per unit of work shared among the threads (== X16: a tile is a group) */
_Static_assert(TILE == X16, "the interleaved rows functions take one tile as one interleaved group");

static inline int is_x16(int type) {
    return type == T_Q5_0_X16 || type == T_Q8_0_X16 || type == T_Q4_K_X16 || type == T_Q6_K_X16;
}

/* The ggml type whose blocks an interleaved type holds (other types: themselves). */
static inline int x16_base(int type) { return is_x16(type) ? type - 100 : type; }

int ms_gguf_simd(void) { return G_VNNI ? 2 : (G_SIMD ? 1 : 0); }

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if G_SIMD
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else {
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
#endif
}

static int block_elems(int type) {
    const int base = x16_base(type);
    return (base == T_Q4_K || base == T_Q5_K || base == T_Q6_K) ? QKK : QK;
}

static int block_bytes(int type) {
    switch (x16_base(type)) {
    case T_Q4_0: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q8_0: return 34;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    case T_Q6_K: return 210;
    default: return 0;
    }
}

int64_t ms_gguf_row_bytes(int type, int64_t K) {
    int e = block_elems(type), b = block_bytes(type);
    return (b == 0 || K % e) ? -1 : K / e * b;
}

/* ---------------------------------------------------------------- activations */

/* One call's activations: per row, the int8 codes in input order and per block the scale;
 * per 16 inputs (K formats) the codes' sums; per 32 inputs the sum (K formats: int16) or the
 * sum times the scale (32-input formats: float). */
typedef struct {
    int8_t *q;      /* [M, K] */
    float *d;       /* [M, K / block] */
    int16_t *s16;   /* [M, K / 16] */
    int16_t *s32;   /* [M, K / 32] */
    float *sx;      /* [M, K / 32] */
    int64_t K, nb;
    int k_perm;     /* Q4_K / Q5_K on AVX-512: each 256 block's 32-input parts in the order KPERM */
} acts;

/* The order of the 32-input parts of a 256 block that the AVX-512 Q4_K / Q5_K loop reads: one
 * 64-byte load of codes holds parts 0 and 2 in its low nibbles, 1 and 3 in its high ones. */
static const int KPERM[8] = {0, 2, 1, 3, 4, 6, 5, 7};

static inline float x_at(const void *x, int bf16, int64_t i) {
    if (bf16) {
        uint32_t u = (uint32_t)((const uint16_t *)x)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return ((const float *)x)[i];
}

/* n (a multiple of 16) inputs -> codes and their sums per 16; returns the block's scale. */
#if G_SIMD
static inline float hsum8(__m256 v);

static inline __m256 load8f(const void *x, int bf16, int64_t at) {
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)x + at))), 16));
    return _mm256_loadu_ps((const float *)x + at);
}

static float quantize_block(const void *x, int bf16, int64_t at, int n, int8_t *q, int16_t *sums) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(load8f(x, bf16, at + i), magnitude));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    if (amax == 0.0f) {
        memset(q, 0, (size_t)n);
        memset(sums, 0, sizeof(int16_t) * (size_t)(n / 16));
        return 0.0f;
    }
    const float inv = 127.0f / amax;
    const __m256 vi = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (int i = 0; i < n; i += 16) {
        __m256 a = _mm256_round_ps(_mm256_mul_ps(load8f(x, bf16, at + i), vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 b = _mm256_round_ps(_mm256_mul_ps(load8f(x, bf16, at + i + 8), vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        a = _mm256_min_ps(_mm256_max_ps(a, lo), hi);
        b = _mm256_min_ps(_mm256_max_ps(b, lo), hi);
        sums[i / 16] = (int16_t)hsum8(_mm256_add_ps(a, b));  /* whole numbers: exact */
        __m256i w = _mm256_packs_epi32(_mm256_cvtps_epi32(a), _mm256_cvtps_epi32(b)); /* lanes: a0-3 b0-3 a4-7 b4-7 */
        w = _mm256_permute4x64_epi64(w, 0xd8);
        __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storeu_si128((__m128i *)(q + i), bytes);
    }
    return amax / 127.0f;
}
#else
static float quantize_block(const void *x, int bf16, int64_t at, int n, int8_t *q, int16_t *sums) {
    float v[QKK];
    for (int i = 0; i < n; i++) v[i] = x_at(x, bf16, at + i);
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(v[i]);
        amax = a > amax ? a : amax;
    }
    if (amax == 0.0f) {
        memset(q, 0, (size_t)n);
        memset(sums, 0, sizeof(int16_t) * (size_t)(n / 16));
        return 0.0f;
    }
    const float inv = 127.0f / amax;
    for (int i = 0; i < n; i++) {
        float r = nearbyintf(v[i] * inv);
        r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
        q[i] = (int8_t)r;
    }
    for (int g = 0; g < n / 16; g++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += q[16 * g + i];
        sums[g] = (int16_t)s;
    }
    return amax / 127.0f;
}
#endif

static void quantize_row(const void *x, int bf16, int64_t row, int64_t K, int eb, const acts *a) {
    const int64_t at = row * K;
    int8_t *q = a->q + at;
    for (int64_t b = 0; b < a->nb; b++)
        a->d[row * a->nb + b] = quantize_block(x, bf16, at + b * eb, eb, q + b * eb, a->s16 + row * (K / 16) + b * eb / 16);
    for (int64_t g = 0; g < K / 32; g++) {
        int s = a->s16[row * (K / 16) + 2 * g] + a->s16[row * (K / 16) + 2 * g + 1];
        a->s32[row * (K / 32) + g] = (int16_t)s;
        a->sx[row * (K / 32) + g] = (float)s * a->d[row * a->nb + g * QK / eb];
    }
    if (a->k_perm)
        for (int64_t b = 0; b < K / QKK; b++) {
            int8_t natural[QKK];
            memcpy(natural, q + b * QKK, QKK);
            for (int part = 0; part < 8; part++) memcpy(q + b * QKK + 32 * part, natural + 32 * KPERM[part], 32);
        }
}

/* ---------------------------------------------------------------- block helpers */

/* Q4_K / Q5_K: the 8 six-bit scales and 8 minimums of a super-block (ggml's packing). */
static inline void k_scales(const uint8_t *packed, uint32_t out[4]) {
    uint32_t u[3];
    memcpy(u, packed, 12);
    out[0] = u[0] & 0x3f3f3f3fu;                                          /* scales 0-3 */
    out[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);   /* scales 4-7 */
    out[2] = u[1] & 0x3f3f3f3fu;                                          /* mins 0-3 */
    out[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4); /* mins 4-7 */
}

#if G_SIMD
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hsum4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum4i(__m128i v) {
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4e));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xb1));
    return _mm_cvtsi128_si32(v);
}

static inline int hsum8i(__m256i v) {
    return hsum4i(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

/* acc + sums of 4 products u8 * s8 per 32-bit lane. */
static inline __m256i dot_us(__m256i acc, __m256i u, __m256i s) {
#if G_VNNI
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* acc + (pair sums of u8 * s8) * scale16, per 32-bit lane. */
static inline __m256i dot_us_scaled(__m256i acc, __m256i u, __m256i s, __m256i scale) {
    __m256i p = _mm256_maddubs_epi16(u, s);
#if G_VNNI
    return _mm256_dpwssd_epi32(acc, p, scale);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale));
#endif
}

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 bytes of nibbles -> 32 bytes: the low nibbles, then the high ones. */
static inline __m256i nibbles32(const uint8_t *p) {
    __m128i raw = _mm_loadu_si128((const __m128i *)p);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0f));
}

/* u | 0x10 in the bytes whose bit is set in the 32 bits at p (Q5_0's fifth bits). */
static inline __m256i with_bits32(__m256i u, const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if G_VNNI
    return _mm256_mask_add_epi8(u, (__mmask32)v, u, _mm256_set1_epi8(0x10));
#else
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)v), spread);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_or_si256(u, _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10)));
#endif
}

/* 16-bit word w (0..7) of each 128-bit half of v, broadcast over that half. */
static inline __m256i pick16(__m256i v, int lo_word, int hi_word) {
    const __m256i m = _mm256_set_m128i(_mm_set1_epi16((short)((2 * hi_word + 1) << 8 | (2 * hi_word))),
                                       _mm_set1_epi16((short)((2 * lo_word + 1) << 8 | (2 * lo_word))));
    return _mm256_shuffle_epi8(v, m);
}
#endif

/* ---------------------------------------------------------------- dot products
 * Each dot_<type>(w, nb, a, i0, NR, out) computes out[r] = row w . activation row i0 + r for
 * r < NR (NR a constant at every call, so the loops over r unroll into registers). */

#define ROW_Q(a, i) ((a)->q + (int64_t)(i) * (a)->K)
#define ROW_D(a, i) ((a)->d + (int64_t)(i) * (a)->nb)
#define ROW_S16(a, i) ((a)->s16 + (int64_t)(i) * ((a)->K / 16))
#define ROW_S32(a, i) ((a)->s32 + (int64_t)(i) * ((a)->K / 32))
#define ROW_SX(a, i) ((a)->sx + (int64_t)(i) * ((a)->K / 32))
#define INLINE static inline __attribute__((always_inline))

#if G_SIMD
/* Weights are read PREFETCH_BYTES ahead of the block in hand. A thread's rows follow each other
 * in memory, but at one row (M = 1) the hardware's stream prefetch alone left it waiting on
 * memory at every block's scales: with this, a 1.5B Q4_K_M token ran about 8% faster on one
 * thread (AVX-512 host); on an AVX2 host, 2 threads at one row over 0.5 GB of weights, Q4_K ran
 * 5-10% faster, Q6_K and Q8_0 15-17%, Q4_0 and Q5_0 (bound by their arithmetic) the same.
 * Prefetching past the matrix's end is harmless (prefetches do not fault). */
#define PREFETCH_BYTES 4096
/* Interleaved Q4_K on AVX2 (dot_q4_k_x8) prefetches too, except where the build turns it off
 * (engine/quant/native/__init__.py: VENDOR_DEFINES). On an Intel core running the AVX2 kernels,
 * a 1.5B Q4_K_M token ran 1.31x faster without it (15.5 -> 20.3 tok/s, 2 threads), while the
 * Q6_K row kernel's and the interleaved Q5_0 kernel's prefetch still paid there (without the
 * latter, a 0.5B token: 43.0-43.8 tok/s against 44.9-45.9); the AVX-512 x16 kernels never
 * prefetch. Not yet measured without it on an AMD AVX2 host, where the row kernels' prefetch
 * paid (above). */
#ifndef G_X16_Q4K_PREFETCH
#define G_X16_Q4K_PREFETCH 1
#endif
INLINE void prefetch_ahead(const uint8_t *blk, const int bytes) {
    for (int at = 0; at < bytes; at += 64) _mm_prefetch((const char *)(blk + PREFETCH_BYTES + at), _MM_HINT_T0);
}

/* Q4_K / Q5_K: the scales and minimums of a super-block as bytes sc0..7, m0..7 (k_scales in
 * vector registers; reads 16 bytes, the last 4 belong to the block's next field). */
static inline __m128i k_scales_vec(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    const __m128i low = _mm_and_si128(v, _mm_set1_epi8(0x3f));                                   /* sc0-3, m0-3 */
    const __m128i top = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(v, 6), _mm_set1_epi8(3)), 4);
    const __m128i u2 = _mm_shuffle_epi32(v, 0xaa);
    const __m128i nib = _mm_and_si128(_mm_srlv_epi32(u2, _mm_set_epi32(0, 0, 4, 0)), _mm_set1_epi8(0x0f));
    return _mm_unpacklo_epi32(low, _mm_or_si128(nib, top));
}

/* The 32-input formats share one loop: UNPACK(blk) gives the 32 unsigned codes (or |w| for
 * Q8_0, whose activations take w's sign); per block d_w * d_x * (dot + OFF * sum(x codes))
 * (the codes' offset seeds the integer sum), plus m * d_x * sum(x codes) for Q4_1's minimum.
 * Two blocks a step into two accumulators: the float adds do not wait on each other. */
#define DOT32(NAME, BYTES, UNPACK, SIGNED, OFF, HAS_MIN)                                          \
INLINE void NAME##_step(const uint8_t *w, int64_t b, const acts *a, int64_t i0, const int NR,     \
                        __m256 *acc, float *side) {                                               \
    const uint8_t *blk = w + b * (BYTES);                                                         \
    const float dw = h2f(blk);                                                                    \
    __m256i u, wv;                                                                                \
    UNPACK;                                                                                       \
    (void)wv;                                                                                     \
    for (int r = 0; r < NR; r++) {                                                                \
        __m256i xv = load32(ROW_Q(a, i0 + r) + b * QK);                                           \
        if (SIGNED) xv = _mm256_sign_epi8(xv, wv);                                                \
        const __m256i seed = (OFF) ? _mm256_castsi128_si256(_mm_cvtsi32_si128((OFF) * ROW_S32(a, i0 + r)[b])) \
                                   : _mm256_setzero_si256();                                      \
        const __m256i p = dot_us(seed, u, xv);                                                    \
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * ROW_D(a, i0 + r)[b]), acc[r]); \
        if (HAS_MIN) side[r] += h2f(blk + 2) * ROW_SX(a, i0 + r)[b];                              \
    }                                                                                             \
}                                                                                                 \
INLINE void NAME(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out) { \
    __m256 acc0[ROWS], acc1[ROWS];                                                                \
    float side[ROWS];                                                                             \
    for (int r = 0; r < NR; r++) { acc0[r] = acc1[r] = _mm256_setzero_ps(); side[r] = 0.0f; }     \
    int64_t b = 0;                                                                                \
    for (; b + 2 <= nb; b += 2) {                                                                 \
        prefetch_ahead(w + b * (BYTES), 2 * (BYTES));                                             \
        NAME##_step(w, b, a, i0, NR, acc0, side);                                                 \
        NAME##_step(w, b + 1, a, i0, NR, acc1, side);                                             \
    }                                                                                             \
    if (b < nb) NAME##_step(w, b, a, i0, NR, acc0, side);                                         \
    for (int r = 0; r < NR; r++) out[r] = hsum8(_mm256_add_ps(acc0[r], acc1[r])) + side[r];       \
}

DOT32(dot_q4_0, 18, (u = nibbles32(blk + 2), wv = u), 0, -8, 0)
DOT32(dot_q4_1, 20, (u = nibbles32(blk + 4), wv = u), 0, 0, 1)
DOT32(dot_q5_0, 22, (u = with_bits32(nibbles32(blk + 6), blk + 2), wv = u), 0, -16, 0)
DOT32(dot_q8_0, 34, (wv = load32(blk + 2), u = _mm256_abs_epi8(wv)), 1, 0, 0)

#if G_VNNI
/* AVX-512: two blocks a step (64 inputs, one vpdpbusd): lanes 0-7 block b, 8-15 block b + 1.
 * The offset / minimum terms go through the activation sums as floats (side); a last odd
 * block runs the 256-bit step. UNPACK2(A, B) sets u (and, for Q8_0, neg: w's negative bytes). */
static inline __m512i nibbles64(const uint8_t *qa, const uint8_t *qb) {
    const __m128i a = _mm_loadu_si128((const __m128i *)qa), b = _mm_loadu_si128((const __m128i *)qb);
    __m512i t = _mm512_inserti32x4(_mm512_castsi128_si512(a), a, 1);
    t = _mm512_inserti32x4(_mm512_inserti32x4(t, b, 2), b, 3);
    const __m512i shift = _mm512_set_epi32(0x00040004, 0x00040004, 0x00040004, 0x00040004, 0, 0, 0, 0,
                                           0x00040004, 0x00040004, 0x00040004, 0x00040004, 0, 0, 0, 0);
    return _mm512_and_si512(_mm512_srlv_epi16(t, shift), _mm512_set1_epi8(0x0f));
}

static inline __m128 two_halves(const uint8_t *pa, const uint8_t *pb) {
    uint16_t ha, hb;
    memcpy(&ha, pa, 2);
    memcpy(&hb, pb, 2);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)ha | (uint32_t)hb << 16)));
}

static inline __m128 two_floats(const float *p) { return _mm_castpd_ps(_mm_load_sd((const double *)p)); }

#define DOT32_512(NAME, BYTES, UNPACK2, SIGNED, OFF, HAS_MIN)                                     \
INLINE void NAME##_pair(const uint8_t *w, int64_t b, const acts *a, int64_t i0, const int NR,     \
                        __m512 *acc, __m128 *side) {                                              \
    const uint8_t *A = w + b * (BYTES), *B = A + (BYTES);                                         \
    __m512i u;                                                                                    \
    __mmask64 neg = 0;                                                                            \
    UNPACK2;                                                                                      \
    (void)neg;                                                                                    \
    const __m128 dw = two_halves(A, B);                                                           \
    const __m128 extra = HAS_MIN ? two_halves(A + 2, B + 2) : dw;                                 \
    const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);      \
    for (int r = 0; r < NR; r++) {                                                                \
        __m512i xv = _mm512_loadu_si512(ROW_Q(a, i0 + r) + b * QK);                               \
        if (SIGNED) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);               \
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xv);                     \
        const __m128 scale = _mm_mul_ps(dw, two_floats(ROW_D(a, i0 + r) + b));                    \
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),                                           \
                                 _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scale)), acc[r]); \
        if ((OFF) || HAS_MIN) side[r] = _mm_fmadd_ps(extra, two_floats(ROW_SX(a, i0 + r) + b), side[r]); \
    }                                                                                             \
}                                                                                                 \
INLINE void NAME##_512(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out) { \
    __m512 acc0[ROWS], acc1[ROWS];                                                                \
    __m128 side[ROWS];                                                                            \
    for (int r = 0; r < NR; r++) { acc0[r] = acc1[r] = _mm512_setzero_ps(); side[r] = _mm_setzero_ps(); } \
    int64_t b = 0;                                                                                \
    for (; b + 4 <= nb; b += 4) {                                                                 \
        NAME##_pair(w, b, a, i0, NR, acc0, side);                                                 \
        NAME##_pair(w, b + 2, a, i0, NR, acc1, side);                                             \
    }                                                                                             \
    if (b + 2 <= nb) { NAME##_pair(w, b, a, i0, NR, acc0, side); b += 2; }                        \
    float tail[ROWS] = {0};                                                                       \
    if (b < nb) {                                                                                 \
        __m256 acc256[ROWS];                                                                      \
        float tail_side[ROWS];                                                                    \
        for (int r = 0; r < NR; r++) { acc256[r] = _mm256_setzero_ps(); tail_side[r] = 0.0f; }   \
        NAME##_step(w, b, a, i0, NR, acc256, tail_side);                                          \
        for (int r = 0; r < NR; r++) tail[r] = hsum8(acc256[r]) + tail_side[r];                   \
    }                                                                                             \
    for (int r = 0; r < NR; r++)                                                                  \
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r])) +                          \
                 (HAS_MIN ? 1.0f : (float)(OFF)) * hsum4(side[r]) + tail[r];                      \
}

DOT32_512(dot_q4_0, 18, u = nibbles64(A + 2, B + 2), 0, -8, 0)
DOT32_512(dot_q4_1, 20, u = nibbles64(A + 4, B + 4), 0, 0, 1)
DOT32_512(dot_q5_0, 22, {
    uint32_t ha;
    uint32_t hb;
    memcpy(&ha, A + 2, 4);
    memcpy(&hb, B + 2, 4);
    u = nibbles64(A + 6, B + 6);
    u = _mm512_mask_add_epi8(u, _cvtu64_mask64((uint64_t)ha | (uint64_t)hb << 32), u, _mm512_set1_epi8(0x10));
}, 0, -16, 0)
DOT32_512(dot_q8_0, 34, {
    const __m512i wv = _mm512_inserti64x4(_mm512_castsi256_si512(load32(A + 2)), load32(B + 2), 1);
    u = _mm512_abs_epi8(wv);
    neg = _mm512_movepi8_mask(wv);
}, 1, 0, 0)
#define DOT_Q4_0 dot_q4_0_512
#define DOT_Q4_1 dot_q4_1_512
#define DOT_Q5_0 dot_q5_0_512
#define DOT_Q8_0 dot_q8_0_512
#endif

/* Q4_K and Q5_K (FIVE: the fifth bits from qh): per 64 inputs, low nibbles = sub-block 2c,
 * high nibbles = 2c + 1; the scales applied by vpmaddwd / vpdpwssd on the pair sums, the
 * minimums through the activation codes' 32-input sums. */
INLINE void dot_q45_k(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out,
                      const int FIVE) {
    const int bytes = FIVE ? 176 : 144;
    __m256 acc[ROWS];
    __m128 accm[ROWS];
    for (int r = 0; r < NR; r++) { acc[r] = _mm256_setzero_ps(); accm[r] = _mm_setzero_ps(); }
    const __m256i low4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bytes;
        prefetch_ahead(blk, bytes);
        int32_t halves16;
        memcpy(&halves16, blk, 4);
        const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(halves16)); /* d, dmin */
        const __m256i s16 = _mm256_cvtepu8_epi16(k_scales_vec(blk + 4));
        const __m256i scales = _mm256_permute2x128_si256(s16, s16, 0x00);
        const __m128i mins = _mm256_extracti128_si256(s16, 1);
        const __m256i qh = FIVE ? load32(blk + 16) : _mm256_setzero_si256();
        __m256i lo_sum[ROWS], hi_sum[ROWS];
        for (int r = 0; r < NR; r++) lo_sum[r] = hi_sum[r] = _mm256_setzero_si256();
        const uint8_t *qs = blk + (FIVE ? 48 : 16);
        for (int c = 0; c < 4; c++) {
            const __m256i raw = load32(qs + 32 * c);
            __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
            if (FIVE) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
            }
            const __m256i sa = pick16(scales, 2 * c, 2 * c), sb = pick16(scales, 2 * c + 1, 2 * c + 1);
            for (int r = 0; r < NR; r++) {
                const int8_t *xq = ROW_Q(a, i0 + r) + b * QKK + 64 * c;
                lo_sum[r] = dot_us_scaled(lo_sum[r], lo, load32(xq), sa);
                hi_sum[r] = dot_us_scaled(hi_sum[r], hi, load32(xq + 32), sb);
            }
        }
        for (int r = 0; r < NR; r++) {
            const __m128 scale = _mm_mul_ps(dd, _mm_set1_ps(ROW_D(a, i0 + r)[b]));  /* d dx, dmin dx */
            const __m128i bs = _mm_loadu_si128((const __m128i *)(ROW_S32(a, i0 + r) + b * 8));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo_sum[r], hi_sum[r])),
                                     _mm256_broadcastss_ps(scale), acc[r]);
            accm[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mins, bs)), _mm_shuffle_ps(scale, scale, 0x55),
                                   accm[r]);
        }
    }
    for (int r = 0; r < NR; r++) out[r] = hsum8(acc[r]) - hsum4(accm[r]);
}

INLINE void dot_q4_k(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out) {
    dot_q45_k(w, nb, a, i0, NR, out, 0);
}

INLINE void dot_q5_k(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out) {
    dot_q45_k(w, nb, a, i0, NR, out, 1);
}

/* Q6_K: per 128 inputs, ql's low nibbles hold inputs 0-63, its high nibbles 64-127, qh two bits
 * each; codes 0..63 with offset 32 (seeded through the 16-input activation sums); one int8
 * scale per 16 inputs (each 32-input vector takes two: its halves' pair sums). */
/* The codes of inputs 128h + 32t .. + 31 of a Q6_K block as u[t], t < 4. */
INLINE void q6_k_codes(const uint8_t *blk, const int h, __m256i u[4]) {
    const __m256i low4 = _mm256_set1_epi8(0x0f), three = _mm256_set1_epi8(3);
    const __m256i ql0 = load32(blk + 64 * h), ql1 = load32(blk + 64 * h + 32), qh = load32(blk + 128 + 32 * h);
    u[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, three), 4));
    u[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), three), 4));
    u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), three), 4));
    u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), three), 4));
}

INLINE void dot_q6_k(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out) {
    __m256 acc[ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * 210;
        prefetch_ahead(blk, 210);
        const float dw = h2f(blk + 208);
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        const __m256i halves[2] = {_mm256_permute2x128_si256(s16, s16, 0x00), _mm256_permute2x128_si256(s16, s16, 0x11)};
        __m256i even[ROWS], odd[ROWS];
        for (int r = 0; r < NR; r++) {  /* the codes' offset: -32 * sum_j scale_j * sum16_j */
            const __m256i bs = load32(ROW_S16(a, i0 + r) + b * 16);
            even[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(s16, bs), 5));
            odd[r] = _mm256_setzero_si256();
        }
        for (int h = 0; h < 2; h++) {
            __m256i u[4];
            q6_k_codes(blk, h, u);
            for (int t = 0; t < 4; t++) {
                const __m256i sc = pick16(halves[h], 2 * t, 2 * t + 1);
                for (int r = 0; r < NR; r++) {
                    const __m256i xv = load32(ROW_Q(a, i0 + r) + b * QKK + 128 * h + 32 * t);
                    if (t & 1) odd[r] = dot_us_scaled(odd[r], u[t], xv, sc);
                    else even[r] = dot_us_scaled(even[r], u[t], xv, sc);
                }
            }
        }
        for (int r = 0; r < NR; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(even[r], odd[r])),
                                     _mm256_set1_ps(dw * ROW_D(a, i0 + r)[b]), acc[r]);
    }
    for (int r = 0; r < NR; r++) out[r] = hsum8(acc[r]);
}


#if G_VNNI
/* AVX-512: 128 inputs per step. Q4_K / Q5_K: one 64-byte load of codes holds parts (2c, 2c + 2)
 * in its low nibbles and (2c + 1, 2c + 3) in its high ones (the activations are stored in that
 * order, KPERM); each 256-bit half takes its part's scale. */
INLINE void dot_q45_k_512(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out,
                          const int FIVE) {
    const int bytes = FIVE ? 176 : 144;
    __m512 acc[ROWS];
    __m128 accm[ROWS];
    for (int r = 0; r < NR; r++) { acc[r] = _mm512_setzero_ps(); accm[r] = _mm_setzero_ps(); }
    const __m512i low4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
    /* per step p: the words (scale indices) each 128-bit lane broadcasts, low / high nibbles */
    const __m512i pick[2][2] = {
        {_mm512_set_epi32(0x05040504, 0x05040504, 0x05040504, 0x05040504, 0x05040504, 0x05040504, 0x05040504, 0x05040504,
                          0x01000100, 0x01000100, 0x01000100, 0x01000100, 0x01000100, 0x01000100, 0x01000100, 0x01000100),
         _mm512_set_epi32(0x07060706, 0x07060706, 0x07060706, 0x07060706, 0x07060706, 0x07060706, 0x07060706, 0x07060706,
                          0x03020302, 0x03020302, 0x03020302, 0x03020302, 0x03020302, 0x03020302, 0x03020302, 0x03020302)},
        {_mm512_set_epi32(0x0d0c0d0c, 0x0d0c0d0c, 0x0d0c0d0c, 0x0d0c0d0c, 0x0d0c0d0c, 0x0d0c0d0c, 0x0d0c0d0c, 0x0d0c0d0c,
                          0x09080908, 0x09080908, 0x09080908, 0x09080908, 0x09080908, 0x09080908, 0x09080908, 0x09080908),
         _mm512_set_epi32(0x0f0e0f0e, 0x0f0e0f0e, 0x0f0e0f0e, 0x0f0e0f0e, 0x0f0e0f0e, 0x0f0e0f0e, 0x0f0e0f0e, 0x0f0e0f0e,
                          0x0b0a0b0a, 0x0b0a0b0a, 0x0b0a0b0a, 0x0b0a0b0a, 0x0b0a0b0a, 0x0b0a0b0a, 0x0b0a0b0a, 0x0b0a0b0a)}};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bytes;
        prefetch_ahead(blk, bytes);
        int32_t halves16;
        memcpy(&halves16, blk, 4);
        const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(halves16)); /* d, dmin */
        const __m256i s16 = _mm256_cvtepu8_epi16(k_scales_vec(blk + 4));
        const __m512i scales = _mm512_broadcast_i32x4(_mm256_castsi256_si128(s16));
        const __m128i mins = _mm256_extracti128_si256(s16, 1);
        __m512i qh = _mm512_setzero_si512();
        if (FIVE) {
            const __m256i h = load32(blk + 16);
            qh = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
        }
        __m512i lo_sum[ROWS], hi_sum[ROWS];
        for (int r = 0; r < NR; r++) lo_sum[r] = hi_sum[r] = _mm512_setzero_si512();
        const uint8_t *qs = blk + (FIVE ? 48 : 16);
        for (int p = 0; p < 2; p++) {
            const __m512i raw = _mm512_loadu_si512(qs + 64 * p);
            __m512i lo = _mm512_and_si512(raw, low4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
            if (FIVE) {  /* part j's fifth bit is bit j of qh */
                const __m512i shift_lo = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * p)), _mm256_set1_epi16((short)(4 * p + 2)), 1);
                const __m512i shift_hi = _mm512_add_epi16(shift_lo, _mm512_set1_epi16(1));
                lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift_lo), one), 4));
                hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift_hi), one), 4));
            }
            const __m512i sa = _mm512_shuffle_epi8(scales, pick[p][0]), sb = _mm512_shuffle_epi8(scales, pick[p][1]);
            for (int r = 0; r < NR; r++) {
                const int8_t *xq = ROW_Q(a, i0 + r) + b * QKK + 128 * p;
                lo_sum[r] = _mm512_dpwssd_epi32(lo_sum[r], _mm512_maddubs_epi16(lo, _mm512_loadu_si512(xq)), sa);
                hi_sum[r] = _mm512_dpwssd_epi32(hi_sum[r], _mm512_maddubs_epi16(hi, _mm512_loadu_si512(xq + 64)), sb);
            }
        }
        for (int r = 0; r < NR; r++) {
            const __m128 scale = _mm_mul_ps(dd, _mm_set1_ps(ROW_D(a, i0 + r)[b]));  /* d dx, dmin dx */
            const __m128i bs = _mm_loadu_si128((const __m128i *)(ROW_S32(a, i0 + r) + b * 8));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo_sum[r], hi_sum[r])),
                                     _mm512_broadcastss_ps(scale), acc[r]);
            accm[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mins, bs)), _mm_shuffle_ps(scale, scale, 0x55),
                                   accm[r]);
        }
    }
    for (int r = 0; r < NR; r++) out[r] = _mm512_reduce_add_ps(acc[r]) - hsum4(accm[r]);
}

/* Q6_K on AVX-512: 64 bytes of ql hold inputs 0-63 (low nibbles) and 64-127 (high) of a half;
 * each 128-bit lane is 16 inputs with one scale (vpermw spreads them). */
INLINE void dot_q6_k_512(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out) {
    __m512 acc[ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0f), three = _mm512_set1_epi8(3);
    const __m512i shift_lo = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i shift_hi = _mm512_add_epi16(shift_lo, _mm512_set1_epi16(4));
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * 210;
        prefetch_ahead(blk, 210);
        const float dw = h2f(blk + 208);
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        const __m512i s512 = _mm512_castsi256_si512(s16);
        __m512i even[ROWS], odd[ROWS];
        for (int r = 0; r < NR; r++) {  /* the codes' offset: -32 * sum_j scale_j * sum16_j */
            const __m256i bs = load32(ROW_S16(a, i0 + r) + b * 16);
            even[r] = _mm512_castsi256_si512(
                _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(s16, bs), 5)));
            odd[r] = _mm512_setzero_si512();
        }
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
            const __m256i qh256 = load32(blk + 128 + 32 * h);
            const __m512i qh = _mm512_inserti64x4(_mm512_castsi256_si512(qh256), qh256, 1);
            const __m512i lo = _mm512_or_si512(_mm512_and_si512(ql, low4),
                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift_lo), three), 4));
            const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift_hi), three), 4));
            const __m512i idx_lo = _mm512_set_epi64(0x0003000300030003LL + 0x0008000800080008LL * h, 0x0003000300030003LL + 0x0008000800080008LL * h,
                                                    0x0002000200020002LL + 0x0008000800080008LL * h, 0x0002000200020002LL + 0x0008000800080008LL * h,
                                                    0x0001000100010001LL + 0x0008000800080008LL * h, 0x0001000100010001LL + 0x0008000800080008LL * h,
                                                    0x0000000000000000LL + 0x0008000800080008LL * h, 0x0000000000000000LL + 0x0008000800080008LL * h);
            const __m512i idx_hi = _mm512_add_epi16(idx_lo, _mm512_set1_epi16(4));
            const __m512i sa = _mm512_permutexvar_epi16(idx_lo, s512), sb = _mm512_permutexvar_epi16(idx_hi, s512);
            for (int r = 0; r < NR; r++) {
                const int8_t *xq = ROW_Q(a, i0 + r) + b * QKK + 128 * h;
                even[r] = _mm512_dpwssd_epi32(even[r], _mm512_maddubs_epi16(lo, _mm512_loadu_si512(xq)), sa);
                odd[r] = _mm512_dpwssd_epi32(odd[r], _mm512_maddubs_epi16(hi, _mm512_loadu_si512(xq + 64)), sb);
            }
        }
        for (int r = 0; r < NR; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(even[r], odd[r])),
                                     _mm512_set1_ps(dw * ROW_D(a, i0 + r)[b]), acc[r]);
    }
    for (int r = 0; r < NR; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}
#define DOT_Q4_K(w, nb, a, i0, NR, out) dot_q45_k_512(w, nb, a, i0, NR, out, 0)
#define DOT_Q5_K(w, nb, a, i0, NR, out) dot_q45_k_512(w, nb, a, i0, NR, out, 1)
#define DOT_Q6_K dot_q6_k_512
#else
#define DOT_Q4_K dot_q4_k
#define DOT_Q5_K dot_q5_k
#define DOT_Q6_K dot_q6_k
#endif

#else /* portable C: the same integers, one element at a time */

/* The unsigned code of element e (0..block-1) of a block, and the block's integer offset. */
static inline int code_q4_0(const uint8_t *blk, int e) { return (blk[2 + (e & 15)] >> (e < 16 ? 0 : 4)) & 15; }
static inline int code_q4_1(const uint8_t *blk, int e) { return (blk[4 + (e & 15)] >> (e < 16 ? 0 : 4)) & 15; }
static inline int code_q5_0(const uint8_t *blk, int e) {
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    return (int)(((blk[6 + (e & 15)] >> (e < 16 ? 0 : 4)) & 15) | (((qh >> e) & 1) << 4));
}

#define DOT32(NAME, BYTES, CODE, OFF, HAS_MIN)                                                    \
INLINE void NAME(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out) { \
    for (int r = 0; r < NR; r++) {                                                                \
        const int8_t *xq = ROW_Q(a, i0 + r);                                                      \
        float sum = 0.0f;                                                                         \
        for (int64_t b = 0; b < nb; b++) {                                                        \
            const uint8_t *blk = w + b * (BYTES);                                                 \
            int s = 0;                                                                            \
            for (int e = 0; e < QK; e++) s += CODE * xq[b * QK + e];                              \
            const float dw = h2f(blk);                                                            \
            const float extra = HAS_MIN ? h2f(blk + 2) : dw * (float)(OFF);                       \
            sum += dw * ROW_D(a, i0 + r)[b] * (float)s + extra * ROW_SX(a, i0 + r)[b];           \
        }                                                                                         \
        out[r] = sum;                                                                             \
    }                                                                                             \
}

DOT32(dot_q4_0, 18, code_q4_0(blk, e), -8, 0)
DOT32(dot_q4_1, 20, code_q4_1(blk, e), 0, 1)
DOT32(dot_q5_0, 22, code_q5_0(blk, e), -16, 0)
DOT32(dot_q8_0, 34, (int)(int8_t)blk[2 + e], 0, 0)

INLINE void dot_q45_k(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out, int five) {
    const int bytes = five ? 176 : 144;
    for (int r = 0; r < NR; r++) {
        const int8_t *xq = ROW_Q(a, i0 + r);
        float sum = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * bytes, *qh = blk + 16, *qs = blk + (five ? 48 : 16);
            uint32_t sm[4];
            k_scales(blk + 4, sm);
            const uint8_t *sc = (const uint8_t *)sm, *mn = sc + 8;
            int isum = 0, imin = 0;
            for (int s = 0; s < 8; s++) {
                int part = 0;
                for (int l = 0; l < 32; l++) {
                    int u = (qs[32 * (s / 2) + l] >> (4 * (s & 1))) & 15;
                    if (five) u |= ((qh[l] >> s) & 1) << 4;
                    part += u * xq[b * QKK + 32 * s + l];
                }
                isum += sc[s] * part;
                imin += mn[s] * ROW_S32(a, i0 + r)[b * 8 + s];
            }
            const float dx = ROW_D(a, i0 + r)[b];
            sum += h2f(blk) * dx * (float)isum - h2f(blk + 2) * dx * (float)imin;
        }
        out[r] = sum;
    }
}

INLINE void dot_q4_k(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out) {
    dot_q45_k(w, nb, a, i0, NR, out, 0);
}

INLINE void dot_q5_k(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out) {
    dot_q45_k(w, nb, a, i0, NR, out, 1);
}

INLINE void dot_q6_k(const uint8_t *w, int64_t nb, const acts *a, int64_t i0, const int NR, float *out) {
    for (int r = 0; r < NR; r++) {
        const int8_t *xq = ROW_Q(a, i0 + r);
        float sum = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * 210, *ql = blk, *qh = blk + 128;
            const int8_t *sc = (const int8_t *)(blk + 192);
            int isum = 0;
            for (int j = 0; j < 16; j++) {
                int part = 0;
                for (int i = 0; i < 16; i++) {
                    const int e = 16 * j + i, h = e / 128, t = (e % 128) / 32, l = e % 32;
                    const int low = (ql[64 * h + 32 * (t & 1) + l] >> (4 * (t >> 1))) & 15;
                    const int high = (qh[32 * h + l] >> (2 * t)) & 3;
                    part += ((low | (high << 4)) - 32) * xq[b * QKK + e];
                }
                isum += sc[j] * part;
            }
            sum += h2f(blk + 208) * ROW_D(a, i0 + r)[b] * (float)isum;
        }
        out[r] = sum;
    }
}
#endif


/* The tile n0..n0 + 16 (one interleaved group) for every activation row, 4 rows a pass; DOT
 * writes a group's 16 outputs per activation row (the AVX-512 and AVX2 dot_*_x16). */
#if G_SIMD
#define ROWS_X16(NAME, DOT)                                                                       \
static void NAME(const uint8_t *w, int64_t w_stride, int64_t n0, int64_t n1, const acts *a, int64_t M, \
                 float *y, int64_t y_stride) {                                                    \
    (void)n1;                                                                                     \
    const uint8_t *g = w + n0 * w_stride;                                                         \
    int64_t i = 0;                                                                                \
    for (; i + 4 <= M; i += 4) DOT(g, a->nb, a, i, 4, y + n0, y_stride);                          \
    switch (M - i) {                                                                              \
    case 1: DOT(g, a->nb, a, i, 1, y + n0, y_stride); break;                                      \
    case 2: DOT(g, a->nb, a, i, 2, y + n0, y_stride); break;                                      \
    case 3: DOT(g, a->nb, a, i, 3, y + n0, y_stride); break;                                      \
    default: break;                                                                               \
    }                                                                                             \
}
#endif

/* Q4_K, 16 rows interleaved (T_Q4_K_X16), for decode on AVX-512. The same bytes as 16 rows of
 * Q4_K, rearranged per super-block b into one 2,304-byte group block: d[16] and dmin[16]
 * (fp16), the three 32-bit words of each row's packed scales (u0[16], u1[16], u2[16]), then the
 * codes as qs[c 4][k 8][row 16][4 bytes] (row r's Q4_K bytes 32c + 4k .. + 3). So one 64-byte
 * load holds 4 codes of each of the 16 rows: a 32-bit lane per row, one vpdpbusd against 4
 * broadcast activation bytes, and the rows' scales, minimums and d come as vectors of lanes.
 * The one-row kernel (dot_q45_k_512) instead spent most of its instructions per block
 * unpacking that row's scales and summing lanes; llama.cpp's repack (q4_K_8x8) is the same
 * idea. Rows are grouped by 16, so a tile (TILE == 16 rows) is one group. */
#if G_VNNI
#define X16_BLOCK (X16 * 144)
INLINE __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

INLINE __m512i byte_lanes(__m512i words, const int byte) {
    return _mm512_and_si512(_mm512_srli_epi32(words, 8 * byte), _mm512_set1_epi32(0xff));
}

INLINE void dot_q4_k_x16(const uint8_t *g, int64_t nb, const acts *a, int64_t i0, const int NR, float *y,
                         int64_t y_stride) {
    __m512 acc[4];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0f), m3f = _mm512_set1_epi32(0x3f3f3f3f);
    const __m512i m0f = _mm512_set1_epi32(0x0f0f0f0f), m03 = _mm512_set1_epi32(0x03030303);
    const __m512i even_bytes = _mm512_set1_epi32(0x00ff00ff);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + b * X16_BLOCK;
        const __m512i u0 = _mm512_loadu_si512(blk + 64), u1 = _mm512_loadu_si512(blk + 128),
                      u2 = _mm512_loadu_si512(blk + 192);
        const __m512i sc[2] = {_mm512_and_si512(u0, m3f),
            _mm512_or_si512(_mm512_and_si512(u2, m0f), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), m03), 4))};
        const __m512i mn[2] = {_mm512_and_si512(u1, m3f),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m0f), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), m03), 4))};
        __m512i isum[4], msum[4];
        for (int r = 0; r < NR; r++) {  /* minimums: sum_s m_s * (activation codes' sum over part s) */
            const int16_t *s32 = ROW_S32(a, i0 + r) + b * 8;
            msum[r] = _mm512_setzero_si512();
            for (int h = 0; h < 2; h++) {
                const __m512i m02 = _mm512_and_si512(mn[h], even_bytes), m13 = _mm512_and_si512(_mm512_srli_epi32(mn[h], 8), even_bytes);
                msum[r] = _mm512_dpwssd_epi32(msum[r], m02, _mm512_set1_epi32((int32_t)((uint16_t)s32[4 * h] | (uint32_t)(uint16_t)s32[4 * h + 2] << 16)));
                msum[r] = _mm512_dpwssd_epi32(msum[r], m13, _mm512_set1_epi32((int32_t)((uint16_t)s32[4 * h + 1] | (uint32_t)(uint16_t)s32[4 * h + 3] << 16)));
            }
            isum[r] = _mm512_setzero_si512();
        }
        const uint8_t *qs = blk + 256;
        for (int c = 0; c < 4; c++) {
            __m512i lo_sum[4], hi_sum[4];
            for (int r = 0; r < NR; r++) lo_sum[r] = hi_sum[r] = _mm512_setzero_si512();
            for (int k = 0; k < 8; k++) {
                const __m512i raw = _mm512_loadu_si512(qs + 64 * (8 * c + k));
                const __m512i lo = _mm512_and_si512(raw, low4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
                for (int r = 0; r < NR; r++) {
                    const int8_t *xq = ROW_Q(a, i0 + r) + b * QKK + 64 * c + 4 * k;
                    lo_sum[r] = _mm512_dpbusd_epi32(lo_sum[r], lo, bcast4(xq));
                    hi_sum[r] = _mm512_dpbusd_epi32(hi_sum[r], hi, bcast4(xq + 32));
                }
            }
            const __m512i s_lo = byte_lanes(sc[c >> 1], (2 * c) & 3), s_hi = byte_lanes(sc[c >> 1], (2 * c + 1) & 3);
            for (int r = 0; r < NR; r++)
                isum[r] = _mm512_add_epi32(isum[r], _mm512_add_epi32(_mm512_mullo_epi32(lo_sum[r], s_lo),
                                                                     _mm512_mullo_epi32(hi_sum[r], s_hi)));
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
        for (int r = 0; r < NR; r++) {
            const __m512 dx = _mm512_set1_ps(ROW_D(a, i0 + r)[b]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(d, dx), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[r]), _mm512_mul_ps(dmin, dx), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) _mm512_storeu_ps(y + (i0 + r) * y_stride, acc[r]);
}

ROWS_X16(rows_q4_k_x16, dot_q4_k_x16)

/* Q6_K, 16 rows interleaved (T_Q6_K_X16): per super-block one 3,360-byte group block: d[16]
 * (fp16), the int8 scales as sc[pair 8][row 16][2], then the codes in the order the kernel
 * reads them, per half h and k < 8 three 64-byte loads of [row 16][4 bytes]: row r's ql bytes
 * 64h + 4k .., its ql bytes 64h + 32 + 4k .. and its qh bytes 128 + 32h + 4k ... Together they
 * hold inputs 128h + 32t + 4k .. + 3 of the four quarters t: a 32-bit lane per row as for Q4_K,
 * the 16-input sums scaled by the rows' scales as lane vectors, the codes' offset 32 through
 * the activations' 16-input sums (vpdpwssd against the scales in pairs). The reads run straight
 * through the block: with ql and qh as two separate regions the same kernel ran at a third of
 * the speed, waiting on memory the hardware prefetcher did not fetch. */
#define X16_Q6_BLOCK (X16 * 210)
INLINE void dot_q6_k_x16(const uint8_t *g, int64_t nb, const acts *a, int64_t i0, const int NR, float *y,
                         int64_t y_stride) {
    __m512 acc[4];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0f), three = _mm512_set1_epi8(3);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + b * X16_Q6_BLOCK, *codes = blk + 288;
        __m512i isum[4], off[4];
        for (int r = 0; r < NR; r++) isum[r] = off[r] = _mm512_setzero_si512();
        for (int p = 0; p < 8; p++) {  /* the offset: 32 * sum_s scale_s * (activation codes' sum over s) */
            const __m512i pair = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * p)));
            for (int r = 0; r < NR; r++) {
                int32_t sums;
                memcpy(&sums, ROW_S16(a, i0 + r) + b * 16 + 2 * p, 4);
                off[r] = _mm512_dpwssd_epi32(off[r], pair, _mm512_set1_epi32(sums));
            }
        }
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 2; j++) {      /* inputs 128h + 32t + 16j .. + 15 of the four quarters t */
                __m512i sum[4][4];
                for (int t = 0; t < 4; t++)
                    for (int r = 0; r < NR; r++) sum[t][r] = _mm512_setzero_si512();
                #pragma GCC unroll 4
                for (int k = 4 * j; k < 4 * j + 4; k++) {
                    const uint8_t *step = codes + 192 * (8 * h + k);   /* ql, ql, qh */
                    const __m512i la = _mm512_loadu_si512(step), lb = _mm512_loadu_si512(step + 64);
                    const __m512i hq = _mm512_loadu_si512(step + 128);
                    const __m512i u[4] = {
                        _mm512_or_si512(_mm512_and_si512(la, low4), _mm512_slli_epi16(_mm512_and_si512(hq, three), 4)),
                        _mm512_or_si512(_mm512_and_si512(lb, low4), _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hq, 2), three), 4)),
                        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(la, 4), low4), _mm512_and_si512(hq, _mm512_set1_epi8(0x30))),
                        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lb, 4), low4),
                                        _mm512_and_si512(_mm512_srli_epi16(hq, 2), _mm512_set1_epi8(0x30)))};
                    for (int r = 0; r < NR; r++) {
                        const int8_t *xq = ROW_Q(a, i0 + r) + b * QKK + 128 * h + 4 * k;
                        for (int t = 0; t < 4; t++) sum[t][r] = _mm512_dpbusd_epi32(sum[t][r], u[t], bcast4(xq + 32 * t));
                    }
                }
                for (int t = 0; t < 4; t++) {  /* sub-block 8h + 2t + j: the low or high half of scale pair 4h + t */
                    const __m512i pair = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * (4 * h + t))));
                    const __m512i scale = j ? _mm512_srai_epi32(pair, 16) : _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16);
                    for (int r = 0; r < NR; r++) isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(sum[t][r], scale));
                }
            }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        for (int r = 0; r < NR; r++) {
            const __m512i total = _mm512_sub_epi32(isum[r], _mm512_slli_epi32(off[r], 5));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(d, _mm512_set1_ps(ROW_D(a, i0 + r)[b])), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) _mm512_storeu_ps(y + (i0 + r) * y_stride, acc[r]);
}

ROWS_X16(rows_q6_k_x16, dot_q6_k_x16)

/* Q8_0, 16 rows interleaved (T_Q8_0_X16): per 32-input block one 544-byte group block: d[16]
 * (fp16), then the codes as [k 8][row 16][4 bytes] (row r's codes 4k .. 4k + 3). A 64-byte load
 * is 4 codes of each row, flipped to unsigned (xor 0x80: w + 128) for vpdpbusd against 4
 * broadcast activation bytes; 128 times the activation codes' sum comes off per block. The
 * one-row kernel (dot_q8_0_512) spent its time reducing each row's 34-byte blocks across
 * lanes: at hidden sizes that are not whole 256-input super-blocks (Qwen2.5 0.5B's 896) nearly
 * every matrix of a Q4_K_M file, its tied head included, falls back to Q5_0 or Q8_0. */
/* Two 64-byte loads of codes (4 of each row) against 4 activation bytes each, at inputs at_a
 * and at_b of each activation row. */
INLINE void block32_x16_dots(__m512i *sum_a, __m512i *sum_b, const __m512i codes_a, const __m512i codes_b,
                             const acts *a, int64_t i0, const int NR, int64_t at_a, int64_t at_b) {
    for (int r = 0; r < NR; r++) {
        const int8_t *xq = ROW_Q(a, i0 + r);
        sum_a[r] = _mm512_dpbusd_epi32(sum_a[r], codes_a, bcast4(xq + at_a));
        sum_b[r] = _mm512_dpbusd_epi32(sum_b[r], codes_b, bcast4(xq + at_b));
    }
}

/* One 32-input group block's float step, for each activation row: the two integer sums less
 * the codes' offset times the activation codes' sum, times d_w (the block's first 32 bytes,
 * fp16 per row) and d_x. */
INLINE void block32_x16_done(__m512 *acc, const __m512i *sum_a, const __m512i *sum_b, const int offset,
                             const uint8_t *blk, const acts *a, int64_t i0, const int NR, int64_t b) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    for (int r = 0; r < NR; r++) {
        const __m512i total = _mm512_sub_epi32(_mm512_add_epi32(sum_a[r], sum_b[r]),
                                               _mm512_set1_epi32(offset * ROW_S32(a, i0 + r)[b]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(d, _mm512_set1_ps(ROW_D(a, i0 + r)[b])), acc[r]);
    }
}

#define X16_Q8_BLOCK (X16 * 34)
INLINE void dot_q8_0_x16(const uint8_t *g, int64_t nb, const acts *a, int64_t i0, const int NR, float *y,
                         int64_t y_stride) {
    __m512 acc[4];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + b * X16_Q8_BLOCK, *codes = blk + 32;
        __m512i even[4], odd[4];
        for (int r = 0; r < NR; r++) even[r] = odd[r] = _mm512_setzero_si512();
        #pragma GCC unroll 4
        for (int k = 0; k < 8; k += 2) {
            const __m512i u0 = _mm512_xor_si512(_mm512_loadu_si512(codes + 64 * k), flip);
            const __m512i u1 = _mm512_xor_si512(_mm512_loadu_si512(codes + 64 * k + 64), flip);
            block32_x16_dots(even, odd, u0, u1, a, i0, NR, b * QK + 4 * k, b * QK + 4 * k + 4);
        }
        block32_x16_done(acc, even, odd, 128, blk, a, i0, NR, b);
    }
    for (int r = 0; r < NR; r++) _mm512_storeu_ps(y + (i0 + r) * y_stride, acc[r]);
}

ROWS_X16(rows_q8_0_x16, dot_q8_0_x16)

/* Q5_0, 16 rows interleaved (T_Q5_0_X16): per block one 352-byte group block: d[16] (fp16),
 * qh[16] (each row's 32 fifth bits as a 32-bit lane), then the codes as [k 4][row 16][4 bytes]
 * (row r's qs bytes 4k .. 4k + 3: inputs 4k .. 4k + 3 in the low nibbles, 16 + 4k .. in the
 * high). Each input's fifth bit is picked per byte: vpshufb spreads the qh byte holding bits
 * 4k .. 4k + 3 (or 16 + 4k ..) over the row's 4 bytes, a test against one bit per byte makes the
 * mask that adds 16. The codes' offset 16 comes off through the activation codes' sum. */
#define X16_Q5_BLOCK (X16 * 22)
INLINE __m512i spread_byte(const int byte) {  /* each 32-bit lane's byte `byte`, four times */
    const int at = byte * 0x01010101;
    return _mm512_broadcast_i32x4(_mm_set_epi32(at + 0x0c0c0c0c, at + 0x08080808, at + 0x04040404, at));
}

INLINE void dot_q5_0_x16(const uint8_t *g, int64_t nb, const acts *a, int64_t i0, const int NR, float *y,
                         int64_t y_stride) {
    __m512 acc[4];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0f), fifth = _mm512_set1_epi8(0x10);
    const __m512i bit_of_byte[2] = {_mm512_set1_epi32(0x08040201), _mm512_set1_epi32((int)0x80402010)};
    const __m512i lo_bytes[2] = {spread_byte(0), spread_byte(1)}, hi_bytes[2] = {spread_byte(2), spread_byte(3)};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + b * X16_Q5_BLOCK, *codes = blk + 96;
        const __m512i qh = _mm512_loadu_si512(blk + 32);
        __m512i lo_sum[4], hi_sum[4];
        for (int r = 0; r < NR; r++) lo_sum[r] = hi_sum[r] = _mm512_setzero_si512();
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m512i raw = _mm512_loadu_si512(codes + 64 * k);
            __m512i lo = _mm512_and_si512(raw, low4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
            const __mmask64 lo5 = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, lo_bytes[k >> 1]), bit_of_byte[k & 1]);
            const __mmask64 hi5 = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, hi_bytes[k >> 1]), bit_of_byte[k & 1]);
            lo = _mm512_mask_add_epi8(lo, lo5, lo, fifth);
            hi = _mm512_mask_add_epi8(hi, hi5, hi, fifth);
            block32_x16_dots(lo_sum, hi_sum, lo, hi, a, i0, NR, b * QK + 4 * k, b * QK + 4 * k + 16);
        }
        block32_x16_done(acc, lo_sum, hi_sum, 16, blk, a, i0, NR, b);
    }
    for (int r = 0; r < NR; r++) _mm512_storeu_ps(y + (i0 + r) * y_stride, acc[r]);
}

ROWS_X16(rows_q5_0_x16, dot_q5_0_x16)
#endif

/* Q5_0 interleaved (T_Q5_0_X16, the layout above) on AVX2, read as two 8-row halves: each
 * 64-byte run of [row 16][4 bytes] is rows 0-7 then rows 8-15, a 32-bit lane per row. The
 * one-row kernel (dot_q5_0) spends about 28 instructions per block of 32 inputs, most of them
 * once per block (its scale, its fifth bits, its float step); here one 32-byte load is 4 codes
 * of each of 8 rows, the fifth bits are picked per byte as on AVX-512 (vpshufb, then a compare
 * in place of the mask), and the float step is one vector for 8 rows. Pair sums of a code
 * (below 32) and an activation code (|x| <= 127) are at most 7,874, so four of them add up in
 * 16 bits before one vpmaddwd widens them. Q4_K is interleaved on AVX2 too (dot_q4_k_x8 below);
 * Q6_K and Q8_0 stay row by row there: their row kernels read near memory speed at one row. */
#if G_SIMD && !G_VNNI
#define X16_Q5_BLOCK (X16 * 22)
INLINE __m256i spread_byte8(const int byte) {  /* each 32-bit lane's byte `byte`, four times */
    const int at = byte * 0x01010101;
    return _mm256_broadcastsi128_si256(_mm_set_epi32(at + 0x0c0c0c0c, at + 0x08080808, at + 0x04040404, at));
}

/* Codes with their fifth bits: bit 4 set where the (spread) qh byte has the byte's bit. */
INLINE __m256i with_fifth8(__m256i codes, __m256i spread_qh, __m256i bits) {
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread_qh, bits), bits);
    return _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}

INLINE __m256i bcast4_8(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Rows 8 * half .. + 7 of a Q5_0 group against NR activation rows. */
INLINE void dot_q5_0_x8(const uint8_t *g, int64_t nb, const acts *a, int64_t i0, const int NR, float *y,
                        int64_t y_stride, const int half) {
    __m256 acc[4];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i bits[2] = {_mm256_set1_epi32(0x08040201), _mm256_set1_epi32((int)0x80402010)};
    const __m256i lo_bytes[2] = {spread_byte8(0), spread_byte8(1)}, hi_bytes[2] = {spread_byte8(2), spread_byte8(3)};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + b * X16_Q5_BLOCK, *codes = blk + 96 + 32 * half;
        prefetch_ahead(blk, X16_Q5_BLOCK);
        const __m256i qh = load32(blk + 32 + 32 * half);
        __m256i sum[4];
        for (int r = 0; r < NR; r++) sum[r] = _mm256_setzero_si256();
        for (int k2 = 0; k2 < 4; k2 += 2) {
            __m256i pairs[4];
            for (int k = k2; k < k2 + 2; k++) {
                const __m256i raw = load32(codes + 64 * k);
                const __m256i lo = with_fifth8(_mm256_and_si256(raw, low4), _mm256_shuffle_epi8(qh, lo_bytes[k >> 1]), bits[k & 1]);
                const __m256i hi = with_fifth8(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low4),
                                               _mm256_shuffle_epi8(qh, hi_bytes[k >> 1]), bits[k & 1]);
                for (int r = 0; r < NR; r++) {
                    const int8_t *xq = ROW_Q(a, i0 + r) + b * QK + 4 * k;
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4_8(xq)),
                                                       _mm256_maddubs_epi16(hi, bcast4_8(xq + 16)));
                    pairs[r] = k == k2 ? p : _mm256_add_epi16(pairs[r], p);
                }
            }
            for (int r = 0; r < NR; r++) sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(pairs[r], ones));
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * half)));
        for (int r = 0; r < NR; r++) {
            const __m256i total = _mm256_sub_epi32(sum[r], _mm256_set1_epi32(16 * ROW_S32(a, i0 + r)[b]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, _mm256_set1_ps(ROW_D(a, i0 + r)[b])), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) _mm256_storeu_ps(y + (i0 + r) * y_stride + 8 * half, acc[r]);
}

INLINE void dot_q5_0_x16(const uint8_t *g, int64_t nb, const acts *a, int64_t i0, const int NR, float *y,
                         int64_t y_stride) {
    dot_q5_0_x8(g, nb, a, i0, NR, y, y_stride, 0);
    dot_q5_0_x8(g, nb, a, i0, NR, y, y_stride, 1);
}

ROWS_X16(rows_q5_0_x16, dot_q5_0_x16)
#endif

/* ---------------------------------------------------------------- rows of output */

typedef void (*rows_fn)(const uint8_t *w, int64_t w_stride, int64_t n0, int64_t n1, const acts *a, int64_t M,
                        float *y, int64_t y_stride);

/* Output columns n0..n1 (weight rows) for every activation row: PASS (at most ROWS) activation
 * rows at a time against each weight row of the tile, so a tile's blocks are read from memory
 * once per PASS rows. */
#define ROWS_FN(NAME, DOT, PASS)                                                                  \
static void NAME(const uint8_t *w, int64_t w_stride, int64_t n0, int64_t n1, const acts *a, int64_t M, \
                 float *y, int64_t y_stride) {                                                    \
    float out[ROWS];                                                                              \
    int64_t i = 0;                                                                                \
    for (; i + PASS <= M; i += PASS)                                                              \
        for (int64_t n = n0; n < n1; n++) {                                                       \
            DOT(w + n * w_stride, a->nb, a, i, PASS, out);                                        \
            for (int r = 0; r < PASS; r++) y[(i + r) * y_stride + n] = out[r];                    \
        }                                                                                         \
    const int rest = (int)(M - i);                                                                \
    for (int64_t n = n0; n < n1 && rest; n++) {                                                   \
        switch (rest) {                                                                           \
        case 1: DOT(w + n * w_stride, a->nb, a, i, 1, out); break;                                \
        case 2: DOT(w + n * w_stride, a->nb, a, i, 2, out); break;                                \
        case 3: DOT(w + n * w_stride, a->nb, a, i, 3, out); break;                                \
        case 4: DOT(w + n * w_stride, a->nb, a, i, 4, out); break;                                \
        case 5: DOT(w + n * w_stride, a->nb, a, i, 5, out); break;                                \
        case 6: DOT(w + n * w_stride, a->nb, a, i, 6, out); break;                                \
        default: DOT(w + n * w_stride, a->nb, a, i, 7, out); break;                               \
        }                                                                                         \
        for (int r = 0; r < rest; r++) y[(i + r) * y_stride + n] = out[r];                        \
    }                                                                                             \
}
/* The K formats' pass on AVX2: 8 rows' accumulators (two 256-bit sums and a float one per row)
 * outnumber AVX2's 16 registers, and the spills cost more than reading a block twice from
 * cache; 4 rows a pass ran batch 8 of Q4_K and Q6_K in 0.6-1.0x the time. The 32-input formats
 * keep 8 (they ran 10-20% slower at 4 from 32 rows on). */
#define K_PASS (G_VNNI ? ROWS : 4)

#ifndef DOT_Q4_0
#define DOT_Q4_0 dot_q4_0
#define DOT_Q4_1 dot_q4_1
#define DOT_Q5_0 dot_q5_0
#define DOT_Q8_0 dot_q8_0
#endif
ROWS_FN(rows_q4_0, DOT_Q4_0, ROWS)
ROWS_FN(rows_q4_1, DOT_Q4_1, ROWS)
ROWS_FN(rows_q5_0, DOT_Q5_0, ROWS)
ROWS_FN(rows_q8_0, DOT_Q8_0, ROWS)
/* Q4_K against many activation rows on AVX2 (prefill, and batches from X8_MIN_ROWS rows).
 * The row kernel spends two multiplies per 32 inputs per row (vpmaddubsw, then vpmaddwd by the
 * sub-block's scale), and AVX2 has too few registers for more than 4 activation rows a pass.
 * Here a tile's 8 weight rows are first unpacked once into codes [sub-block 8][k 8][row 8][4
 * bytes] (llama.cpp's repack idea, done per call in a scratch instead of kept in memory), so one
 * 32-byte load is 4 codes of each of 8 rows against 4 broadcast activation bytes: the 8 pair
 * sums of a sub-block (each at most 15 * 127 * 2) add up in 16 bits, and one vpmaddwd by the
 * 8 rows' scales widens them. The integers are the row kernel's; only the float sums' order
 * differs. */
#if G_SIMD && !G_VNNI
/* From this many activation rows: below, unpacking cost about what it saved (2 threads, 8960x1536
 * and 1536x8960: at 8 rows the row kernels were as fast (Q4_K) or faster (Q6_K), at 16 Q4_K ran
 * in 0.8x the time and Q6_K even; at 512 rows both in 0.55-0.65x). X8_PASS rows a pass: 2 ran
 * 512 rows in 0.85x the time of 4 (spills), and 1 reloaded each code vector per row (1.2x the
 * time at 64 rows). */
#ifndef X8_MIN_ROWS
#define X8_MIN_ROWS 16
#endif
#define X8_PASS 2
/* Activation rows 0..M against unpacked groups t (DOTS: q4k_x8_dots or q6k_x8_dots), X8_PASS a pass. */
#define X8_PASSES(DOTS, t, a, M, y, y_stride)                                                     \
    do {                                                                                          \
        int64_t i_ = 0;                                                                           \
        for (; i_ + X8_PASS <= (M); i_ += X8_PASS) DOTS(t, (a)->nb, a, i_, X8_PASS, y, y_stride); \
        if (i_ < (M)) DOTS(t, (a)->nb, a, i_, 1, y, y_stride);                                    \
    } while (0)
/* One super-block of 8 rows unpacked: codes, each sub-block's scales as (sc, sc) 16-bit pairs
 * per row lane, the minimums as (m 2i, m 2i + 1) pairs, then d and dmin per row as floats. */
typedef struct {
    __m256i codes[8][8];
    __m256i scales[8];
    __m256i mins[4];
    __m256 d, dmin;
} q4k_x8;

/* v[0..7] (a 32-bit lane per (vector, lane)) transposed: v[k] lane r = old v[r] lane k. */
INLINE void transpose8_epi32(__m256i v[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4)
        for (int j = 0; j < 2; j++) {
            u[i + j] = _mm256_unpacklo_epi64(t[i + j], t[i + j + 2]);
            u[i + j + 2] = _mm256_unpackhi_epi64(t[i + j], t[i + j + 2]);
        }
    /* u[0..3] hold rows 0-3 of lanes (0,4), (2,6), (1,5), (3,7); u[4..7] the same of rows 4-7 */
    const int order[4] = {0, 2, 1, 3};
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_permute2x128_si256(u[order[k]], u[order[k] + 4], 0x20);
        v[k + 4] = _mm256_permute2x128_si256(u[order[k]], u[order[k] + 4], 0x31);
    }
}

/* Each 32-bit lane's low (or high) 16-bit word, twice: a (sc, sc) pair from (sc 2i, sc 2i + 1). */
INLINE __m256i dup_low_words(__m256i v) { return _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(v, 0xa0), 0xa0); }
INLINE __m256i dup_high_words(__m256i v) { return _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(v, 0xf5), 0xf5); }

static void q4k_unpack8(const uint8_t *w, int64_t w_stride, int64_t b, q4k_x8 *out) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i pairs[8];  /* per row: (sc 2i, sc 2i + 1) in lanes 0-3, (m 2i, m 2i + 1) in 4-7 */
    float d[8], dmin[8];
    for (int r = 0; r < 8; r++) {
        const uint8_t *blk = w + r * w_stride + b * 144;
        d[r] = h2f(blk);
        dmin[r] = h2f(blk + 2);
        pairs[r] = _mm256_cvtepu8_epi16(k_scales_vec(blk + 4));
    }
    transpose8_epi32(pairs);
    for (int i = 0; i < 4; i++) {
        out->scales[2 * i] = dup_low_words(pairs[i]);
        out->scales[2 * i + 1] = dup_high_words(pairs[i]);
        out->mins[i] = pairs[4 + i];
    }
    for (int c = 0; c < 4; c++) {
        __m256i lo[8], hi[8];
        for (int r = 0; r < 8; r++) {
            const __m256i raw = load32(w + r * w_stride + b * 144 + 16 + 32 * c);
            lo[r] = _mm256_and_si256(raw, low4);
            hi[r] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        }
        transpose8_epi32(lo);
        transpose8_epi32(hi);
        for (int k = 0; k < 8; k++) {
            out->codes[2 * c][k] = lo[k];
            out->codes[2 * c + 1][k] = hi[k];
        }
    }
    out->d = _mm256_loadu_ps(d);
    out->dmin = _mm256_loadu_ps(dmin);
}

/* The 8 unpacked rows (nb super-blocks at t) against NR activation rows from i0: 8 outputs a row. */
INLINE void q4k_x8_dots(const q4k_x8 *t, int64_t nb, const acts *a, int64_t i0, const int NR, float *y,
                        int64_t y_stride) {
    __m256 acc[X8_PASS];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const q4k_x8 *s = t + b;
        __m256i isum[X8_PASS], msum[X8_PASS];
        for (int r = 0; r < NR; r++) isum[r] = msum[r] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i pairs[X8_PASS];
            for (int k = 0; k < 8; k++) {
                const __m256i codes = s->codes[j][k];
                for (int r = 0; r < NR; r++) {
                    const __m256i p = _mm256_maddubs_epi16(codes, bcast4_8(ROW_Q(a, i0 + r) + b * QKK + 32 * j + 4 * k));
                    pairs[r] = k == 0 ? p : _mm256_add_epi16(pairs[r], p);
                }
            }
            for (int r = 0; r < NR; r++) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(pairs[r], s->scales[j]));
        }
        for (int i = 0; i < 4; i++)
            for (int r = 0; r < NR; r++) {
                int32_t bs;
                memcpy(&bs, ROW_S32(a, i0 + r) + b * 8 + 2 * i, 4);
                msum[r] = _mm256_add_epi32(msum[r], _mm256_madd_epi16(s->mins[i], _mm256_set1_epi32(bs)));
            }
        for (int r = 0; r < NR; r++) {
            const __m256 dx = _mm256_set1_ps(ROW_D(a, i0 + r)[b]);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(s->d, dx), acc[r]);
            acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum[r]), _mm256_mul_ps(s->dmin, dx), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) _mm256_storeu_ps(y + (i0 + r) * y_stride, acc[r]);
}

/* Q4_K interleaved (T_Q4_K_X16, the AVX-512 layout above) on AVX2, read as two 8-row halves for
 * batch 1 and small batches: each 64-byte run of [row 16][4 bytes] is rows 0-7 then 8-15, so one
 * 32-byte load is 4 codes (low nibbles: sub-block 2c, high: 2c + 1) of each of 8 rows, against 4
 * broadcast activation bytes; a sub-block's 8 pair sums add up in 16 bits as above, and the
 * rows' scales, minimums and d come as lane vectors from the group block's u0, u1, u2 words.
 * The one-row kernel spends about 80 instructions per row's super-block, mostly unpacking its
 * scales and summing lanes; here 8 rows take about 260. */
#define X16_Q4K_BLOCK (X16 * 144)
/* The vpshufb mask that makes 16-bit lanes (byte b0, byte b1) of each 32-bit lane. */
static inline __m256i byte_words_mask(const int b0, const int b1) {
    const int lane = b0 | 0x80 << 8 | b1 << 16 | 0x80 << 24;
    return _mm256_add_epi32(_mm256_set1_epi32(lane), _mm256_setr_epi32(0, 0x00040004, 0x00080008, 0x000c000c,
                                                                         0, 0x00040004, 0x00080008, 0x000c000c));
}

/* A half's scales (sc[0]: bytes sc0-3 per row lane, sc[1]: sc4-7) and minimums (mn, the same). */
INLINE void q4k_x16_scales(const uint8_t *blk, const int half, __m256i sc[2], __m256i mn[2]) {
    const __m256i u0 = load32(blk + 64 + 32 * half), u1 = load32(blk + 128 + 32 * half), u2 = load32(blk + 192 + 32 * half);
    const __m256i m3f = _mm256_set1_epi8(0x3f), m0f = _mm256_set1_epi8(0x0f), m03 = _mm256_set1_epi8(3);
    sc[0] = _mm256_and_si256(u0, m3f);
    sc[1] = _mm256_or_si256(_mm256_and_si256(u2, m0f), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), m03), 4));
    mn[0] = _mm256_and_si256(u1, m3f);
    mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m0f),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), m03), 4));
}

/* Rows 8 * h0 .. 8 * (h0 + H) - 1 of a group (H halves: 2 only at one activation row, where both
 * halves in one pass read each 64-byte run once and share its broadcasts) against NR rows. */
INLINE void dot_q4_k_x8(const uint8_t *g, int64_t nb, const acts *a, int64_t i0, const int NR, float *y,
                        int64_t y_stride, const int h0, const int H) {
    __m256 acc[2][4];
    for (int h = 0; h < H; h++)
        for (int r = 0; r < NR; r++) acc[h][r] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i scale_of[4] = {byte_words_mask(0, 0), byte_words_mask(1, 1), byte_words_mask(2, 2), byte_words_mask(3, 3)};
    const __m256i min_pair[2] = {byte_words_mask(0, 1), byte_words_mask(2, 3)};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + b * X16_Q4K_BLOCK, *qs = blk + 256 + 32 * h0;
        if (G_X16_Q4K_PREFETCH) prefetch_ahead(blk, X16_Q4K_BLOCK);
        __m256i sc[2][2], mn[2][2], isum[2][4], msum[2][4];
        for (int h = 0; h < H; h++) {
            q4k_x16_scales(blk, h0 + h, sc[h], mn[h]);
            for (int r = 0; r < NR; r++) isum[h][r] = msum[h][r] = _mm256_setzero_si256();
        }
        #pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i lo_pairs[2][4], hi_pairs[2][4];
            #pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                for (int h = 0; h < H; h++) {
                    const __m256i raw = load32(qs + 64 * (8 * c + k) + 32 * h);
                    const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                    for (int r = 0; r < NR; r++) {
                        const int8_t *xq = ROW_Q(a, i0 + r) + b * QKK + 64 * c + 4 * k;
                        const __m256i pl = _mm256_maddubs_epi16(lo, bcast4_8(xq)), ph = _mm256_maddubs_epi16(hi, bcast4_8(xq + 32));
                        lo_pairs[h][r] = k == 0 ? pl : _mm256_add_epi16(lo_pairs[h][r], pl);
                        hi_pairs[h][r] = k == 0 ? ph : _mm256_add_epi16(hi_pairs[h][r], ph);
                    }
                }
            for (int h = 0; h < H; h++) {
                const __m256i s_lo = _mm256_shuffle_epi8(sc[h][c >> 1], scale_of[(2 * c) & 3]);
                const __m256i s_hi = _mm256_shuffle_epi8(sc[h][c >> 1], scale_of[(2 * c + 1) & 3]);
                for (int r = 0; r < NR; r++)
                    isum[h][r] = _mm256_add_epi32(isum[h][r], _mm256_add_epi32(_mm256_madd_epi16(lo_pairs[h][r], s_lo),
                                                                               _mm256_madd_epi16(hi_pairs[h][r], s_hi)));
            }
        }
        for (int h = 0; h < H; h++) {
            for (int i = 0; i < 4; i++) {
                const __m256i m = _mm256_shuffle_epi8(mn[h][i >> 1], min_pair[i & 1]);
                for (int r = 0; r < NR; r++) {
                    int32_t bs;
                    memcpy(&bs, ROW_S32(a, i0 + r) + b * 8 + 2 * i, 4);
                    msum[h][r] = _mm256_add_epi32(msum[h][r], _mm256_madd_epi16(m, _mm256_set1_epi32(bs)));
                }
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * (h0 + h))));
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * (h0 + h))));
            for (int r = 0; r < NR; r++) {
                const __m256 dx = _mm256_set1_ps(ROW_D(a, i0 + r)[b]);
                acc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h][r]), _mm256_mul_ps(d, dx), acc[h][r]);
                acc[h][r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum[h][r]), _mm256_mul_ps(dmin, dx), acc[h][r]);
            }
        }
    }
    for (int h = 0; h < H; h++)
        for (int r = 0; r < NR; r++) _mm256_storeu_ps(y + (i0 + r) * y_stride + 8 * (h0 + h), acc[h][r]);
}

/* Q6_K the same way: codes [sub-block of 16 inputs 16][k 4][row 8][4 bytes] with their offset
 * 32, the int8 scales as (sc, sc) lanes and, for the offset, as (sc 2i, sc 2i + 1) pairs, d per
 * row. Codes below 64 leave room for only two pair sums in 16 bits (each at most 63 * 127 * 2),
 * so a 16-input sub-block takes two vpmaddwd per row: 6 multiplies per 8 rows' 16 inputs where
 * the row kernel took 8, and fewer of every other instruction. */
typedef struct {
    __m256i codes[16][4];
    __m256i scales[16];
    __m256i pairs[8];
    __m256 d;
} q6k_x8;

static void q6k_unpack8(const uint8_t *w, int64_t w_stride, int64_t b, q6k_x8 *out) {
    for (int h = 0; h < 2; h++) {
        __m256i by_row[8][4], u[8];
        for (int r = 0; r < 8; r++) q6_k_codes(w + r * w_stride + b * 210, h, by_row[r]);
        for (int t = 0; t < 4; t++) {  /* inputs 128h + 32t ..: sub-blocks 8h + 2t and the next */
            for (int r = 0; r < 8; r++) u[r] = by_row[r][t];
            transpose8_epi32(u);
            for (int k = 0; k < 8; k++) out->codes[8 * h + 2 * t + k / 4][k % 4] = u[k];
        }
    }
    __m256i pairs[8];  /* per row: the 16 int8 scales as 16-bit (sc 2i, sc 2i + 1) pairs */
    float d[8];
    for (int r = 0; r < 8; r++) {
        const uint8_t *blk = w + r * w_stride + b * 210;
        pairs[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        d[r] = h2f(blk + 208);
    }
    transpose8_epi32(pairs);
    for (int i = 0; i < 8; i++) {
        out->scales[2 * i] = dup_low_words(pairs[i]);
        out->scales[2 * i + 1] = dup_high_words(pairs[i]);
        out->pairs[i] = pairs[i];
    }
    out->d = _mm256_loadu_ps(d);
}

INLINE void q6k_x8_dots(const q6k_x8 *t, int64_t nb, const acts *a, int64_t i0, const int NR, float *y,
                        int64_t y_stride) {
    __m256 acc[X8_PASS];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const q6k_x8 *s = t + b;
        __m256i isum[X8_PASS], offset[X8_PASS];
        for (int r = 0; r < NR; r++) isum[r] = offset[r] = _mm256_setzero_si256();
        for (int j = 0; j < 16; j++)
            for (int half = 0; half < 2; half++)
                for (int r = 0; r < NR; r++) {
                    const int8_t *xq = ROW_Q(a, i0 + r) + b * QKK + 16 * j + 8 * half;
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(s->codes[j][2 * half], bcast4_8(xq)),
                                                       _mm256_maddubs_epi16(s->codes[j][2 * half + 1], bcast4_8(xq + 4)));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, s->scales[j]));
                }
        for (int i = 0; i < 8; i++)
            for (int r = 0; r < NR; r++) {
                int32_t sums;
                memcpy(&sums, ROW_S16(a, i0 + r) + b * 16 + 2 * i, 4);
                offset[r] = _mm256_add_epi32(offset[r], _mm256_madd_epi16(s->pairs[i], _mm256_set1_epi32(sums)));
            }
        for (int r = 0; r < NR; r++) {
            const __m256i total = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(offset[r], 5));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(s->d, _mm256_set1_ps(ROW_D(a, i0 + r)[b])),
                                     acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) _mm256_storeu_ps(y + (i0 + r) * y_stride, acc[r]);
}

/* NAME: ROWWISE (the row kernel) below X8_MIN_ROWS activation rows and for a tile's rows after
 * its last whole group of 8; from X8_MIN_ROWS rows each group of 8 is unpacked (GROUP, one per
 * super-block) into a scratch of this call's, then runs X8_PASS activation rows a pass. */
#define ROWS_UNPACKED(NAME, ROWWISE, GROUP, UNPACK, DOTS)                                          \
static void ROWWISE(const uint8_t *w, int64_t w_stride, int64_t n0, int64_t n1, const acts *a, int64_t M, \
                    float *y, int64_t y_stride);                                                  \
static void NAME(const uint8_t *w, int64_t w_stride, int64_t n0, int64_t n1, const acts *a, int64_t M, \
                 float *y, int64_t y_stride) {                                                    \
    GROUP *t = M >= X8_MIN_ROWS ? aligned_alloc(32, sizeof(GROUP) * (size_t)a->nb) : NULL;        \
    int64_t n = n0;                                                                               \
    for (; t && n + 8 <= n1; n += 8) {                                                            \
        for (int64_t b = 0; b < a->nb; b++) UNPACK(w + n * w_stride, w_stride, b, t + b);         \
        X8_PASSES(DOTS, t, a, M, y + n, y_stride);                                                \
    }                                                                                             \
    free(t);                                                                                      \
    if (n < n1) ROWWISE(w, w_stride, n, n1, a, M, y, y_stride);                                   \
}
ROWS_UNPACKED(rows_q4_k, rows_q4_k_rowwise, q4k_x8, q4k_unpack8, q4k_x8_dots)
ROWS_UNPACKED(rows_q6_k, rows_q6_k_rowwise, q6k_x8, q6k_unpack8, q6k_x8_dots)

/* Interleaved Q4_K's half (8 rows) of super-block b of group g as q4k_x8: the codes are already
 * in lanes, only split into nibbles. */
static void q4k_x16_unpack8(const uint8_t *g, int64_t b, const int half, q4k_x8 *out) {
    const uint8_t *blk = g + b * X16_Q4K_BLOCK, *qs = blk + 256 + 32 * half;
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i sc[2], mn[2];
    q4k_x16_scales(blk, half, sc, mn);
    for (int j = 0; j < 8; j++) out->scales[j] = _mm256_shuffle_epi8(sc[j >> 2], byte_words_mask(j & 3, j & 3));
    for (int i = 0; i < 4; i++) out->mins[i] = _mm256_shuffle_epi8(mn[i >> 1], byte_words_mask((2 * i) & 3, (2 * i + 1) & 3));
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 8; k++) {
            const __m256i raw = load32(qs + 64 * (8 * c + k));
            out->codes[2 * c][k] = _mm256_and_si256(raw, low4);
            out->codes[2 * c + 1][k] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        }
    out->d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * half)));
    out->dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * half)));
}

/* Interleaved Q4_K's group g unpacked half by half into q4k_x8 groups, for M activation rows
 * (y: the group's first output column); 0 where the scratch could not be had. */
static int q4k_x16_unpacked(const uint8_t *g, const acts *a, int64_t M, float *y, int64_t y_stride) {
    q4k_x8 *t = aligned_alloc(32, sizeof(q4k_x8) * (size_t)a->nb);
    if (!t) return 0;
    for (int half = 0; half < 2; half++) {
        for (int64_t b = 0; b < a->nb; b++) q4k_x16_unpack8(g, b, half, t + b);
        X8_PASSES(q4k_x8_dots, t, a, M, y + 8 * half, y_stride);
    }
    free(t);
    return 1;
}

/* One group (n0..n0 + 16) of interleaved Q4_K: at one activation row both halves in one pass;
 * from X8_MIN_ROWS rows the halves unpacked once, as above; between, dot_q4_k_x8 on the stored
 * layout a half at a time, 4 rows a pass (batch 8 ran in 0.9x the time of passes of 2, though
 * 4 rows' sums spill). */
static void rows_q4_k_x16(const uint8_t *w, int64_t w_stride, int64_t n0, int64_t n1, const acts *a, int64_t M,
                          float *y, int64_t y_stride) {
    (void)n1;
    const uint8_t *g = w + n0 * w_stride;
    if (M == 1) {
        dot_q4_k_x8(g, a->nb, a, 0, 1, y + n0, y_stride, 0, 2);
        return;
    }
    if (M >= X8_MIN_ROWS && q4k_x16_unpacked(g, a, M, y + n0, y_stride)) return;
    for (int half = 0; half < 2; half++) {
        int64_t i = 0;
        for (; i + 4 <= M; i += 4) dot_q4_k_x8(g, a->nb, a, i, 4, y + n0, y_stride, half, 1);
        switch (M - i) {
        case 1: dot_q4_k_x8(g, a->nb, a, i, 1, y + n0, y_stride, half, 1); break;
        case 2: dot_q4_k_x8(g, a->nb, a, i, 2, y + n0, y_stride, half, 1); break;
        case 3: dot_q4_k_x8(g, a->nb, a, i, 3, y + n0, y_stride, half, 1); break;
        default: break;
        }
    }
}
#define ROWS_Q4_K rows_q4_k_rowwise
#define ROWS_Q6_K rows_q6_k_rowwise
#else
#define ROWS_Q4_K rows_q4_k
#define ROWS_Q6_K rows_q6_k
#endif

#ifndef DOT_Q4_K
#define DOT_Q4_K dot_q4_k
#define DOT_Q5_K dot_q5_k
#define DOT_Q6_K dot_q6_k
#endif
ROWS_FN(ROWS_Q4_K, DOT_Q4_K, K_PASS)
ROWS_FN(rows_q5_k, DOT_Q5_K, K_PASS)
ROWS_FN(ROWS_Q6_K, DOT_Q6_K, K_PASS)

static rows_fn rows_for(int type) {
    switch (type) {
    case T_Q4_0: return rows_q4_0;
    case T_Q4_1: return rows_q4_1;
    case T_Q5_0: return rows_q5_0;
    case T_Q8_0: return rows_q8_0;
    case T_Q4_K: return rows_q4_k;
    case T_Q5_K: return rows_q5_k;
    case T_Q6_K: return rows_q6_k;
#if G_SIMD
    case T_Q5_0_X16: return rows_q5_0_x16;
#endif
#if G_SIMD
    case T_Q4_K_X16: return rows_q4_k_x16;
#endif
#if G_VNNI
    case T_Q8_0_X16: return rows_q8_0_x16;
    case T_Q6_K_X16: return rows_q6_k_x16;
#endif
    default: return NULL;
    }
}

/* y[M, N] (row stride y_stride floats) = x[M, K] (float32 or bf16, contiguous) @ W.T, W's row n
 * at w + n * w_stride. Returns 0, 1 for an unknown type or a K that is not whole blocks, 2 when
 * out of memory. */
int ms_gguf_matmul(int type, const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *w, int64_t w_stride,
                   int64_t N, float *y, int64_t y_stride, int threads) {
    rows_fn rows = rows_for(type);
    const int eb = block_elems(type);
    if (rows == NULL || K % eb || K % QK || (is_x16(type) && N % X16)) return 1;
    if (M <= 0 || N <= 0) return 0;
    acts a = {.K = K, .nb = K / eb, .k_perm = G_VNNI && (type == T_Q4_K || type == T_Q5_K)};
    /* one allocation: codes, then scales and sums (each part 64-byte aligned) */
    const size_t nq = (size_t)(M * K + 63) / 64 * 64, nd = (size_t)(M * a.nb * 4 + 63) / 64 * 64,
                 n16 = (size_t)(M * (K / 16) * 2 + 32 + 63) / 64 * 64, n32 = (size_t)(M * (K / 32) * 2 + 32 + 63) / 64 * 64,
                 nx = (size_t)(M * (K / 32) * 4 + 63) / 64 * 64;
    uint8_t *scratch = aligned_alloc(64, nq + nd + n16 + n32 + nx);
    if (scratch) {
        a.q = (int8_t *)scratch;
        a.d = (float *)(scratch + nq);
        a.s16 = (int16_t *)(scratch + nq + nd);
        a.s32 = (int16_t *)(scratch + nq + nd + n16);
        a.sx = (float *)(scratch + nq + nd + n16 + n32);
    }
    int status = 0;
    if (!scratch) {
        status = 2;
    } else {
        const int64_t tiles = (N + TILE - 1) / TILE;
        #pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
        {
            #pragma omp for schedule(static)
            for (int64_t i = 0; i < M; i++) quantize_row(x, x_bf16, i, K, eb, &a);
            #pragma omp for schedule(static)
            for (int64_t t = 0; t < tiles; t++) {
                const int64_t n0 = t * TILE, n1 = n0 + TILE < N ? n0 + TILE : N;
                rows(w, w_stride, n0, n1, &a, M, y, y_stride);
            }
        }
    }
    free(scratch);
    return status;
}

/* ---------------------------------------------------------------- inside a caller's team */

/* What step.c calls: one linear's part inside the caller's parallel region. One thread
 * quantizes M bf16 rows into `scratch` (ms_gguf_team_scratch(M, K) bytes) for the part's
 * format, then every thread of the team calls ms_gguf_team_tiles, which returns after the
 * tiles' barrier. The pieces and their order are ms_gguf_matmul's, so the outputs are equal. */
int64_t ms_gguf_team_scratch(int64_t M, int64_t K) {
    const int64_t nb = K / QK;  /* the most blocks a row can have */
    return (M * K + 63) / 64 * 64 + (M * nb * 4 + 63) / 64 * 64 + 2 * ((M * (K / 16) * 2 + 32 + 63) / 64 * 64)
           + (M * (K / 32) * 4 + 63) / 64 * 64;
}

/* Activations of the same rows quantize alike for two parts when this key is equal. */
int ms_gguf_acts_key(int type) {
    return block_elems(type) * 2 + (G_VNNI && (type == T_Q4_K || type == T_Q5_K));
}

static acts team_acts(void *scratch, int64_t M, int64_t K, int type) {
    const int eb = block_elems(type);
    acts a = {.K = K, .nb = K / eb, .k_perm = G_VNNI && (type == T_Q4_K || type == T_Q5_K)};
    const int64_t nb = K / QK;
    const size_t nq = (size_t)(M * K + 63) / 64 * 64, nd = (size_t)(M * nb * 4 + 63) / 64 * 64,
                 n16 = (size_t)(M * (K / 16) * 2 + 32 + 63) / 64 * 64;
    uint8_t *base = scratch;
    a.q = (int8_t *)base;
    a.d = (float *)(base + nq);
    a.s16 = (int16_t *)(base + nq + nd);
    a.s32 = (int16_t *)(base + nq + nd + n16);
    a.sx = (float *)(base + nq + nd + 2 * n16);
    return a;
}

void ms_gguf_team_quantize(int type, const uint16_t *x, int64_t M, int64_t K, void *scratch) {
    const acts a = team_acts(scratch, M, K, type);
    for (int64_t i = 0; i < M; i++) quantize_row(x, 1, i, K, block_elems(type), &a);
}

void ms_gguf_team_tiles(int type, int64_t M, int64_t K, const uint8_t *w, int64_t w_stride, int64_t N, float *y,
                        int64_t y_stride, void *scratch) {
    const acts a = team_acts(scratch, M, K, type);
    const rows_fn rows = rows_for(type);
    const int64_t tiles = (N + TILE - 1) / TILE;
    /* guided: a thread takes half the tiles left over the team, in one contiguous run (a stream
     * the prefetchers follow), then smaller runs until none are left, so a thread the shared host
     * slowed is caught up by the other instead of waited for at the barrier. Paired with
     * schedule(static) in one process on a 2-core AVX2 host: batch 1 1.04x, 1.03x and 1.00x
     * (Qwen2.5 0.5B, 1.5B, 3B Q4_K_M), batch 8 1.05x (1.5B). A dynamic schedule (two tiles a grab) decoded a
     * Llama 3.2 1B Q4_K_M file at 0.75x: each thread's reads no longer formed one stream. */
    #pragma omp for schedule(guided)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n0 = t * TILE, n1 = n0 + TILE < N ? n0 + TILE : N;
        rows(w, w_stride, n0, n1, &a, M, y, y_stride);
    }
}


/* ---------------------------------------------------------------- 16 rows interleaved */

/* Row r's pieces of one super-block between a group's block and the row's own block (the
 * layouts above the x16 kernels): fixed-size moves, which the compiler turns
 * into loads and stores (the repack and the dequantization of every interleaved row go through
 * here). type: the ggml type (T_Q5_0, T_Q8_0, T_Q4_K or T_Q6_K). */
static inline void x16_copy(int type, uint8_t *group_blk, uint8_t *row_blk, int r, int to_group) {
#define X16_MOVE(ROW_AT, GROUP_AT, N) \
    (to_group ? memcpy(group_blk + (GROUP_AT), row_blk + (ROW_AT), N) : memcpy(row_blk + (ROW_AT), group_blk + (GROUP_AT), N))
    if (type == T_Q5_0) {
        X16_MOVE(0, 2 * r, 2);                                                            /* d */
        X16_MOVE(2, 32 + 4 * r, 4);                                                       /* qh */
        for (int k = 0; k < 4; k++) X16_MOVE(6 + 4 * k, 96 + 64 * k + 4 * r, 4);          /* codes [k] */
    } else if (type == T_Q8_0) {
        X16_MOVE(0, 2 * r, 2);                                                            /* d */
        for (int k = 0; k < 8; k++) X16_MOVE(2 + 4 * k, 32 + 64 * k + 4 * r, 4);          /* codes [k] */
    } else if (type == T_Q4_K) {
        X16_MOVE(0, 2 * r, 2);                                                            /* d */
        X16_MOVE(2, 32 + 2 * r, 2);                                                       /* dmin */
        for (int word = 0; word < 3; word++) X16_MOVE(4 + 4 * word, 64 + 64 * word + 4 * r, 4);  /* scales */
        for (int i = 0; i < 32; i++) X16_MOVE(16 + 4 * i, 256 + 64 * i + 4 * r, 4);     /* codes [c][k] */
    } else {
        X16_MOVE(208, 2 * r, 2);                                                          /* d */
        for (int p = 0; p < 8; p++) X16_MOVE(192 + 2 * p, 32 + 32 * p + 2 * r, 2);        /* scales in pairs */
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 8; k++) {                                                 /* ql, ql, qh */
                const int at = 288 + 192 * (8 * h + k) + 4 * r;
                X16_MOVE(64 * h + 4 * k, at, 4);
                X16_MOVE(64 * h + 32 + 4 * k, at + 64, 4);
                X16_MOVE(128 + 32 * h + 4 * k, at + 128, 4);
            }
    }
#undef X16_MOVE
}

/* N rows of Q5_0, Q8_0, Q4_K or Q6_K (type; N a multiple of 16, row n at w + n * w_stride) into out,
 * interleaved by 16 (rows of K / 256 * block bytes, contiguous). Returns 1 for a bad type or
 * shape. The bytes are the same; only their places change, so it is undone exactly (x16_copy
 * with to_group = 0). */
int ms_gguf_repack_x16(int type, const uint8_t *w, int64_t w_stride, int64_t N, int64_t K, uint8_t *out,
                       int threads) {
    if (!is_x16(type + 100) || N % X16 || K % block_elems(type)) return 1;  /* a type with an interleaved layout */
    const int64_t bb = block_bytes(type), nb = K / block_elems(type), row_bytes = nb * bb;
    #pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads())
    for (int64_t g = 0; g < N / X16; g++)
        for (int r = 0; r < X16; r++)
            for (int64_t b = 0; b < nb; b++)
                x16_copy(type, out + g * X16 * row_bytes + b * X16 * bb, (uint8_t *)(w + (g * X16 + r) * w_stride + b * bb),
                         r, 1);
    return 0;
}

/* ---------------------------------------------------------------- dequantization */

static void dequant_block(int type, const uint8_t *blk, float *y) {
    switch (type) {
    case T_Q4_0: case T_Q4_1: {
        const int min = type == T_Q4_1;
        const float d = h2f(blk), m = min ? h2f(blk + 2) : 0.0f;
        const uint8_t *qs = blk + (min ? 4 : 2);
        for (int j = 0; j < 16; j++) {
            const int lo = qs[j] & 15, hi = qs[j] >> 4;
            y[j] = min ? d * (float)lo + m : d * (float)(lo - 8);
            y[j + 16] = min ? d * (float)hi + m : d * (float)(hi - 8);
        }
        break;
    }
    case T_Q5_0: {
        const float d = h2f(blk);
        uint32_t qh;
        memcpy(&qh, blk + 2, 4);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((int)((blk[6 + j] & 15) | (((qh >> j) & 1) << 4)) - 16);
            y[j + 16] = d * (float)((int)((blk[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
        }
        break;
    }
    case T_Q8_0: {
        const float d = h2f(blk);
        for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)blk[2 + j];
        break;
    }
    case T_Q4_K: case T_Q5_K: {
        const int five = type == T_Q5_K;
        const float d = h2f(blk), dmin = h2f(blk + 2);
        uint32_t sm[4];
        k_scales(blk + 4, sm);
        const uint8_t *sc = (const uint8_t *)sm, *mn = sc + 8, *qh = blk + 16, *qs = blk + (five ? 48 : 16);
        for (int s = 0; s < 8; s++) {
            const float ds = d * (float)sc[s], ms = dmin * (float)mn[s];
            for (int l = 0; l < 32; l++) {
                int u = (qs[32 * (s / 2) + l] >> (4 * (s & 1))) & 15;
                if (five) u |= ((qh[l] >> s) & 1) << 4;
                y[32 * s + l] = ds * (float)u - ms;
            }
        }
        break;
    }
    case T_Q6_K: {
        const float d = h2f(blk + 208);
        const int8_t *sc = (const int8_t *)(blk + 192);
        for (int h = 0; h < 2; h++)
            for (int t = 0; t < 4; t++) {
                const uint8_t *ql = blk + 64 * h + 32 * (t & 1), *qh = blk + 128 + 32 * h;
                const float s0 = d * (float)sc[8 * h + 2 * t], s1 = d * (float)sc[8 * h + 2 * t + 1];
                float *out = y + 128 * h + 32 * t;
                for (int l = 0; l < 32; l++) {
                    const int code = (((ql[l] >> (4 * (t >> 1))) & 15) | (((qh[l] >> (2 * t)) & 3) << 4)) - 32;
                    out[l] = (l < 16 ? s0 : s1) * (float)code;
                }
            }
        break;
    }
    }
}

static inline uint16_t f2bf(float f) {  /* round to nearest even (NaN stays NaN) */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* Rows of W as float32 or bf16 into out [n, K] (row stride out_stride elements): rows ids[i]
 * (ids NULL: rows 0..n-1). Returns 1 for an unknown type / bad K, 3 for an id out of range
 * (checked against rows; nothing is written then). */
int ms_gguf_dequant(int type, const uint8_t *w, int64_t w_stride, int64_t rows, int64_t K, const int64_t *ids,
                    int64_t n, void *out, int64_t out_stride, int out_bf16, int threads) {
    const int eb = block_elems(type), bb = block_bytes(type);
    if (bb == 0 || K % eb || (is_x16(type) && rows % X16)) return 1;
    if (ids)
        for (int64_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= rows) return 3;
    const int64_t nb = K / eb;
    #pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads()) if (n * K > 65536)
    for (int64_t i = 0; i < n; i++) {
        const int64_t id = ids ? ids[i] : i;
        const uint8_t *row = w + id * w_stride;
        float buf[QKK];
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = row + b * bb;
            uint8_t stored[210];   /* an interleaved row's block, put back together */
            if (is_x16(type)) {
                x16_copy(x16_base(type), (uint8_t *)w + (id - id % X16) * w_stride + b * X16 * bb, stored,
                         (int)(id % X16), 0);
                blk = stored;
            }
            dequant_block(x16_base(type), blk, buf);
            if (out_bf16) {
                uint16_t *o = (uint16_t *)out + i * out_stride + b * eb;
                for (int e = 0; e < eb; e++) o[e] = f2bf(buf[e]);
            } else {
                memcpy((float *)out + i * out_stride + b * eb, buf, sizeof(float) * (size_t)eb);
            }
        }
    }
    return 0;
}
