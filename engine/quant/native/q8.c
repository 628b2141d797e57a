/* Weight-only int8 with one fp16 scale per group of 32 inputs (llama.cpp's Q8_0 numbers),
 * multiplied with activations quantized the same way, in integer arithmetic.
 *
 * Why: at batch 1 a decode step is bound by reading the weights. Per-row int8 (aten's
 * _weight_int8pack_mm) loses accuracy (one scale for 896-4864 inputs) and reaches about 37%
 * of the read bandwidth here; bf16 reads twice the bytes. Groups of 32 keep the error of
 * each weight within half a step of its own group (the default model's GGUF tensors are
 * Q5_0 / Q8_0 in groups of 32, so they are stored exactly), and AVX512-VNNI's vpdpbusd does
 * 64 byte products per instruction, so the kernel stays bound by bandwidth. CPUs with AVX2 only
 * take another path to the same integers (MS_AVX2, below).
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
 * Tiles: several activation rows (a batched step, verified drafts) against several weight rows
 * at a time, so that each load feeds several products (tile_dot).
 *
 * Threads: OpenMP over output columns. Loaded after torch, this library binds to the libgomp
 * torch already loaded (same soname), so both share one thread team per calling thread.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "bf16.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define MS_VNNI 1
#else
#define MS_VNNI 0
#endif
/* CPUs with AVX2 but no AVX512-VNNI (AMD Zen 2/3, most desktop Intel): 32-byte vectors, and
 * no byte dot product that cannot saturate (vpmaddubsw's pair sums of u8 * s8 do). There the
 * two activation parts go in as one 16-bit number, hi * LO_STEPS + lo (at most 32385: it fits),
 * the codes are widened to 16 bits and vpmaddwd multiplies them: the same integers per group
 * as the VNNI path's two byte products, in about 3 instructions per 16 weights (the tile below). */
#if !MS_VNNI && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MS_AVX2 1
#else
#define MS_AVX2 0
#endif
#if MS_VNNI || MS_AVX2
#include <immintrin.h>
#endif

#define QK 32      /* inputs per group */

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

/* Which vector path this build runs: 2 AVX512-VNNI, 1 AVX2, 0 the portable C loop (slow). */
int ms_q8_simd(void) { return MS_VNNI ? 2 : (MS_AVX2 ? 1 : 0); }

/* The interleaved layout (weights and activations alike). Groups are taken 16 at a time (a
 * "block", 512 inputs; the last block of a row may hold fewer, g). Inside a block the bytes are
 * ordered [j = 0..7][group i = 0..g-1][4 bytes]: chunk j holds bytes 4j..4j+3 of every group.
 * vpdpbusd sums 4 byte products per 32-bit lane, so 8 instructions over the 8 chunks leave
 * lane i holding group i's whole dot product: one convert and one multiply-add then scale 16
 * groups at once (a group per lane), instead of 8 lanes per group. */
#define BLOCK_GROUPS 16
/* Per activation row, the scales and seeds take ROW_GROUPS(groups) entries and the codes
 * ROW_GROUPS(groups) * QK: one per group and input, except in the AVX2 build, which pads a
 * ragged last block to 16 groups with zeros (quantize_row16). */
#if MS_AVX2
#define ROW_GROUPS(groups) ((((groups) + BLOCK_GROUPS - 1) / BLOCK_GROUPS) * BLOCK_GROUPS)
#else
#define ROW_GROUPS(groups) (groups)
#endif
#define ROW_CODES(K) (ROW_GROUPS((K) / QK) * QK)

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

#if !MS_VNNI && !MS_AVX2   /* (vector builds run quantize_row_vec, below: the same numbers) */

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

#endif

#define Q5_CHUNK_BYTES 40   /* q5 layout, below */

#if MS_VNNI
/* quantize_row in vectors: the same float operations lane by lane (one multiply, nearest-even
 * rounding, clamps), so the codes are bit-identical to the loop above. A decode step quantizes
 * about 180k activations per row; the scalar loop cost ~0.1 ms per row and linear. */
static inline __m512 load16(const void *x, int x_bf16, int64_t k) {
    if (!x_bf16) return _mm512_loadu_ps((const float *)x + k);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)x + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static void quantize_row_vec(const void *x, int x_bf16, int64_t K, int offset, int8_t *xi, float *xs, int32_t *seed) {
    const int64_t groups = K / QK;
    const __m512i top = _mm512_set1_epi32(127), bottom = _mm512_set1_epi32(-127);
    const __m512 lo_steps = _mm512_set1_ps((float)LO_STEPS);
    for (int64_t g = 0; g < groups; g++) {
        __m512 v0 = load16(x, x_bf16, g * QK), v1 = load16(x, x_bf16, g * QK + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m512 s0 = _mm512_mul_ps(v0, inv), s1 = _mm512_mul_ps(v1, inv);
        __m512i h0 = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(s0), top), bottom);
        __m512i h1 = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(s1), top), bottom);
        __m512i l0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(s0, _mm512_cvtepi32_ps(h0)), lo_steps));
        __m512i l1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(s1, _mm512_cvtepi32_ps(h1)), lo_steps));
        l0 = _mm512_max_epi32(_mm512_min_epi32(l0, top), bottom);
        l1 = _mm512_max_epi32(_mm512_min_epi32(l1, top), bottom);
        int8_t hb[QK], lb[QK];
        _mm_storeu_si128((__m128i *)hb, _mm512_cvtepi32_epi8(h0));
        _mm_storeu_si128((__m128i *)(hb + 16), _mm512_cvtepi32_epi8(h1));
        _mm_storeu_si128((__m128i *)lb, _mm512_cvtepi32_epi8(l0));
        _mm_storeu_si128((__m128i *)(lb + 16), _mm512_cvtepi32_epi8(l1));
        const int64_t at = interleaved_at(g, 0, groups), stride = interleaved_at(g, 4, groups) - at;
        for (int j = 0; j < 8; j++) {
            memcpy(xi + at + j * stride, hb + 4 * j, 4);
            memcpy(xi + K + at + j * stride, lb + 4 * j, 4);
        }
        xs[g] = amax / 127.0f;
        seed[g] = -offset * _mm512_reduce_add_epi32(_mm512_add_epi32(h0, h1));
        seed[groups + g] = -offset * _mm512_reduce_add_epi32(_mm512_add_epi32(l0, l1));
    }
}
#define QUANTIZE_ROW(x, b, K, o, xi, xs, sd, precise) ((void)(precise), quantize_row_vec(x, b, K, o, xi, xs, sd))
#elif MS_AVX2
/* quantize_row in 8-lane vectors: the same float operations lane by lane (bit-identical codes). */
static inline __m256 load8(const void *x, int x_bf16, int64_t k) {
    if (!x_bf16) return _mm256_loadu_ps((const float *)x + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __m256i clamp127(__m256i v) {
    return _mm256_max_epi32(_mm256_min_epi32(v, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
}

static inline int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* AVX2 rows: per group, the same hi and lo as quantize_row (same float operations lane by lane),
 * stored as one int16 each, v = hi * LO_STEPS + lo (precise) or hi. The AVX2 tile widens 32
 * weight codes (8 groups of a chunk) with vpunpcklbw / vpunpckhbw, which work per 128-bit lane:
 * the low unpack holds positions 0-7 and 16-23, the high one 8-15 and 24-31. Each chunk half of
 * the activations is stored in that order (row_position), so one vpmaddwd pairs them with the
 * codes. A row holds ROW_CODES(K) int16 (a ragged last block padded with zeros). The group's
 * scale (times 1 / LO_STEPS when precise) and seed (-offset * sum v) are stored per group. */
static inline int64_t row_position(int64_t group, int e) {
    const int64_t block = group / BLOCK_GROUPS, i = group % BLOCK_GROUPS;
    const int64_t p = 4 * (i % 8) + e % 4;                      /* position in the chunk half */
    const int64_t in_half = (p % 16 >= 8 ? 16 : 0) + (p / 16) * 8 + p % 8;
    return block * BLOCK_GROUPS * QK + (e / 4) * 64 + (i / 8) * 32 + in_half;
}

static void quantize_row16(const void *x, int x_bf16, int64_t K, int offset, int8_t *xi, float *xs, int32_t *seed,
                           int precise) {
    const int64_t groups = K / QK, padded = ROW_GROUPS(groups);
    const __m256 lo_steps = _mm256_set1_ps((float)LO_STEPS);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i hi_weight = _mm256_set1_epi32(precise ? LO_STEPS : 1);
    const float unit = precise ? 1.0f / (float)LO_STEPS : 1.0f;
    int16_t *out = (int16_t *)xi;
    if (padded > groups) {   /* the ragged last block: zeros where no group is */
        const int64_t last = groups / BLOCK_GROUPS * BLOCK_GROUPS;
        memset(out + last * QK, 0, sizeof(int16_t) * (size_t)(BLOCK_GROUPS * QK));
        for (int64_t g = groups; g < padded; g++) xs[g] = 0.0f, seed[g] = 0;
    }
    for (int64_t g = 0; g < groups; g++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int q = 0; q < 4; q++) {
            v[q] = load8(x, x_bf16, g * QK + 8 * q);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[q]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i part[4], sum = _mm256_setzero_si256();
        for (int q = 0; q < 4; q++) {
            __m256 scaled = _mm256_mul_ps(v[q], inv);
            __m256i hi = clamp127(_mm256_cvtps_epi32(scaled));
            part[q] = _mm256_mullo_epi32(hi, hi_weight);
            if (precise) {
                __m256 rest = _mm256_mul_ps(_mm256_sub_ps(scaled, _mm256_cvtepi32_ps(hi)), lo_steps);
                part[q] = _mm256_add_epi32(part[q], clamp127(_mm256_cvtps_epi32(rest)));
            }
            sum = _mm256_add_epi32(sum, part[q]);
        }
        int16_t codes[QK];   /* packs work per 128-bit half: a 64-bit permute puts them in order */
        _mm256_storeu_si256((__m256i *)codes, _mm256_permute4x64_epi64(_mm256_packs_epi32(part[0], part[1]), 0xd8));
        _mm256_storeu_si256((__m256i *)(codes + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(part[2], part[3]), 0xd8));
        for (int j = 0; j < 8; j++) memcpy(out + row_position(g, 4 * j), codes + 4 * j, 8);   /* 4 in a row */
        xs[g] = amax / 127.0f * unit;
        seed[g] = -offset * hsum8i(sum);
    }
}
#define QUANTIZE_ROW quantize_row16
#else
#define QUANTIZE_ROW(x, b, K, o, xi, xs, sd, precise) ((void)(precise), quantize_row(x, b, K, o, xi, xs, sd))
#endif

#if MS_VNNI
/* A q5 chunk's 64 codes (c + 16) as bytes. The 32 nibble bytes go to both halves of a vector
 * (a broadcast load: no vector-port uop), the upper half's words shift right by 4, both keep
 * their low nibbles, and an add under the fifth bits' mask puts 16 where those are set: 3
 * vector-port uops per chunk (an insert, a masked broadcast from a register and an or took
 * 6-7; at one or two rows the q5 kernel was bound by them). */
static inline __m512i unpack5(const uint8_t *chunk) {
    const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i nibbles = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)chunk));
    const __m512i low = _mm512_and_si512(_mm512_srlv_epi16(nibbles, shifts), _mm512_set1_epi8(0x0f));
    uint64_t bits;
    memcpy(&bits, chunk + 32, 8);
    return _mm512_mask_add_epi8(low, _cvtu64_mask64(bits), low, _mm512_set1_epi8(0x10));
}

#define MAX_ROWS 4   /* tile bounds (below) */
#define MAX_COLS 4
#define PREFETCH_TILES 4   /* measured best of 1-32 (T0 into L1 did not help) */

/* Loads of a block's bytes / lanes: plain loads in a full block (g = 16), masked ones in a
 * ragged last block. A masked load costs a vector-port uop besides the load, which the tile's
 * vpdpbusd need (in a synthetic loop masked loads cost the multiplies about a third of their rate). */
static inline __m512i load_bytes(const void *p, __mmask64 bytes, const int FULL) {
    return FULL ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(bytes, p);
}

static inline __m512i load_lanes(const int32_t *p, __mmask16 lanes, const int FULL) {
    return FULL ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi32(lanes, p);
}

/* Chunk j of the block starting at group b0 of one weight row (q8: as stored; q5: unpacked to
 * the same byte order). */
static inline __m512i weight_chunk(const uint8_t *w, int64_t b0, int j, int64_t g, __mmask64 bytes, const int Q5,
                                   const int FULL) {
    return Q5 ? unpack5(w + (b0 / BLOCK_GROUPS * 8 + j) * Q5_CHUNK_BYTES) : load_bytes(w + b0 * QK + j * 4 * g, bytes, FULL);
}

/* One block (g groups at b0; FULL: g = 16) of a ROWS x COLS tile (tile_dot, below) into acc.
 * A ragged last block (g < 16; K = 896 has 28 groups: 43% of its work) loads whole vectors too,
 * reading on into the next chunk, row or the padding after the activation buffers (PAD_BYTES);
 * a weight chunk whose 64 bytes would run past its row (which may end the tensor) is loaded
 * masked. Lanes g..15 then sum products of other groups' bytes: their scales are loaded as 0,
 * so they add 0. */
static inline __attribute__((always_inline)) void tile_block(const uint8_t *w, int64_t w_stride,
        const uint16_t *wscales, int64_t K, const int8_t *xi, const float *xs, const int32_t *seed, int64_t b0,
        int64_t g, const int ROWS, const int COLS, const int PRECISE, const int Q5, const int FULL, const int PREFETCH,
        __m512 acc[MAX_ROWS][MAX_COLS]) {
    const int64_t groups = K / QK;
    const __m512i lo_steps = _mm512_set1_epi32(LO_STEPS);
    const __m512 unit = _mm512_set1_ps(PRECISE ? 1.0f / (float)LO_STEPS : 1.0f);
    const __mmask16 lanes = FULL ? (__mmask16)0xffff : (__mmask16)((1u << g) - 1u);
    const __mmask64 bytes = FULL ? ~0ull : ((1ull << (4 * g)) - 1ull);
    __m512i hi[MAX_ROWS][MAX_COLS], lo[MAX_ROWS][MAX_COLS];
    _Pragma("GCC unroll 16")
    for (int r = 0; r < ROWS; r++) {
        const int32_t *sd = seed + r * 2 * groups + b0;
        __m512i s_hi = load_lanes(sd, lanes, FULL);
        __m512i s_lo = PRECISE ? load_lanes(sd + groups, lanes, FULL) : s_hi;
        _Pragma("GCC unroll 16")
        for (int c = 0; c < COLS; c++) {
            hi[r][c] = s_hi;
            if (PRECISE) lo[r][c] = s_lo;
        }
    }
    _Pragma("GCC unroll 16")
    for (int j = 0; j < 8; j++) {
        __m512i a_hi[MAX_ROWS], a_lo[MAX_ROWS];
        _Pragma("GCC unroll 16")
        for (int r = 0; r < ROWS; r++) {
            const int8_t *row = xi + r * 2 * K + b0 * QK + j * 4 * g;
            a_hi[r] = _mm512_loadu_si512(row);   /* a ragged block reads on: see tile_block */
            if (PRECISE) a_lo[r] = _mm512_loadu_si512(row + K);
        }
        _Pragma("GCC unroll 16")
        for (int c = 0; c < COLS; c++) {
            const uint8_t *wc = w + c * w_stride;
            /* the tiles that follow lie right after this one: fetch the same chunk of the one
             * PREFETCH_TILES ahead into L2 now (COLS rows read side by side defeat the
             * hardware's stream prefetch: without this, 2-4 rows ran at ~60% of the bandwidth) */
            if (PREFETCH) _mm_prefetch((const char *)(Q5 ? wc + (b0 / BLOCK_GROUPS * 8 + j) * Q5_CHUNK_BYTES
                                           : wc + b0 * QK + j * 4 * g) + PREFETCH_TILES * COLS * w_stride,
                         _MM_HINT_T1);
            const __m512i wv = weight_chunk(wc, b0, j, g, bytes, Q5, FULL || 4 * g * j + 64 <= 32 * g);
            _Pragma("GCC unroll 16")
            for (int r = 0; r < ROWS; r++) {
                hi[r][c] = _mm512_dpbusd_epi32(hi[r][c], wv, a_hi[r]);
                if (PRECISE) lo[r][c] = _mm512_dpbusd_epi32(lo[r][c], wv, a_lo[r]);
            }
        }
    }
    __m512 wscale[MAX_COLS];
    _Pragma("GCC unroll 16")
    for (int c = 0; c < COLS; c++) {
        const uint16_t *ws = wscales + c * groups + b0;
        const __m256i half = FULL ? _mm256_loadu_si256((const __m256i *)ws) : _mm256_maskz_loadu_epi16(lanes, ws);
        wscale[c] = _mm512_mul_ps(_mm512_cvtph_ps(half), unit);
    }
    _Pragma("GCC unroll 16")
    for (int r = 0; r < ROWS; r++) {
        const float *xr = xs + r * groups + b0;
        const __m512 xsr = FULL ? _mm512_loadu_ps(xr) : _mm512_maskz_loadu_ps(lanes, xr);
        _Pragma("GCC unroll 16")
        for (int c = 0; c < COLS; c++) {
            __m512i dot = hi[r][c];
            if (PRECISE) dot = _mm512_add_epi32(_mm512_mullo_epi32(dot, lo_steps), lo[r][c]);
            acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(wscale[c], xsr), acc[r][c]);
        }
    }
}

/* The lane sums of 16 vectors at once: lane 4j + i of the result is the sum of v[4i + j]'s lanes.
 * Why: a tile's 16 accumulators summed one by one took ~8 shuffles and adds each, as many
 * instructions as the products of a short row (K = 896: 16 vpdpbusd per accumulator). Here the
 * vectors are added pairwise in a butterfly -- lane l with l + 8, then l + 4, l + 2, l + 1 --
 * which are exactly the additions _mm512_reduce_add_ps makes, in its order, so every sum has the
 * same bits; ~45 instructions for all 16. */
static inline __m512 sums16(const __m512 v[16]) {
    __m512 halves[8], quarters[4], pairs[2];
    _Pragma("GCC unroll 8")
    for (int k = 0; k < 8; k++)   /* lanes 0-7: v[2k]'s l + (l + 8); 8-15: v[2k + 1]'s */
        halves[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                                  _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xee));
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; k++)   /* 128-bit lane j: v[4k + j]'s l + (l + 4) */
        quarters[k] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[2 * k], halves[2 * k + 1], 0x88),
                                    _mm512_shuffle_f32x4(halves[2 * k], halves[2 * k + 1], 0xdd));
    _Pragma("GCC unroll 2")
    for (int k = 0; k < 2; k++)   /* + (l + 2) */
        pairs[k] = _mm512_add_ps(_mm512_shuffle_ps(quarters[2 * k], quarters[2 * k + 1], 0x44),
                                 _mm512_shuffle_ps(quarters[2 * k], quarters[2 * k + 1], 0xee));
    return _mm512_add_ps(_mm512_shuffle_ps(pairs[0], pairs[1], 0x88),   /* + (l + 1) */
                         _mm512_shuffle_ps(pairs[0], pairs[1], 0xdd));
}

/* ROWS activation rows against COLS weight rows (compile-time constants at each call, so the
 * accumulators stay in registers): each activation chunk loaded serves COLS weight rows and
 * each weight chunk ROWS activation rows, so a tile does ROWS*COLS products per ROWS+COLS loads
 * (one weight row at a time was bound by loading activations once several rows share a call).
 * out[r * COLS + c] gets the dot products. Per group lane, exact in int32:
 * (sum u hi - 128 sum hi) * LO_STEPS + (sum u lo - 128 sum lo); then, per lane and block,
 * acc += float(dot) * (wscale * xs), and one horizontal sum at the end, in the same order for
 * every tile shape, so a row's result does not depend on which rows or columns share its tile. */
static inline __attribute__((always_inline)) void tile_dot(const uint8_t *w, int64_t w_stride,
        const uint16_t *wscales, int64_t K, const int8_t *xi, const float *xs, const int32_t *seed,
        const int ROWS, const int COLS, const int PRECISE, const int Q5, const int PREFETCH, float *out) {
    const int64_t groups = K / QK;
    __m512 acc[MAX_ROWS][MAX_COLS];   /* fixed sizes (not VLAs), so they stay in registers */
    _Pragma("GCC unroll 16")
    for (int r = 0; r < ROWS; r++)
        _Pragma("GCC unroll 16")
        for (int c = 0; c < COLS; c++) acc[r][c] = _mm512_setzero_ps();
    int64_t b0 = 0;
    for (; b0 + BLOCK_GROUPS <= groups; b0 += BLOCK_GROUPS)
        tile_block(w, w_stride, wscales, K, xi, xs, seed, b0, BLOCK_GROUPS, ROWS, COLS, PRECISE, Q5, 1, PREFETCH, acc);
    if (b0 < groups)
        tile_block(w, w_stride, wscales, K, xi, xs, seed, b0, groups - b0, ROWS, COLS, PRECISE, Q5, 0, PREFETCH, acc);
    if (COLS == MAX_COLS && ROWS >= 2) {   /* a whole-width tile: its sums in one vector */
        __m512 v[16];
        _Pragma("GCC unroll 16")
        for (int c = 0; c < MAX_COLS; c++)
            _Pragma("GCC unroll 16")
            for (int r = 0; r < MAX_ROWS; r++) v[MAX_ROWS * c + r] = r < ROWS ? acc[r][c] : _mm512_setzero_ps();
        _mm512_storeu_ps(out, sums16(v));   /* lane MAX_COLS * r + c = out[r * COLS + c] */
        return;
    }
    _Pragma("GCC unroll 16")
    for (int r = 0; r < ROWS; r++)
        _Pragma("GCC unroll 16")
        for (int c = 0; c < COLS; c++) out[r * COLS + c] = _mm512_reduce_add_ps(acc[r][c]);
}

/* Tile shapes: two-byte activations take twice the registers per row, so their tiles hold half
 * the rows; tiles are COLS_WIDE weight rows wide, or one (the last columns of N). */
#define TILE_ROWS(precise) ((precise) ? 2 : 4)
#define COLS_WIDE MAX_COLS
#define MAX_TILE (MAX_ROWS * MAX_COLS)

static void tile_any(const uint8_t *w, int64_t w_stride, const uint16_t *wscales, int64_t K, const int8_t *xi,
                     const float *xs, const int32_t *seed, int rows, int cols, int precise, int q5, int prefetch,
                     float *out) {
/* the shapes column_tile asks for: 1-2 rows with two-byte activations, 1-4 with one byte */
#define TILE_CASE(R, C, P, Q, F) case ((((R) * 8 + (C)) * 2 + (P)) * 2 + (Q)) * 2 + (F): \
        tile_dot(w, w_stride, wscales, K, xi, xs, seed, R, C, P, Q, F, out); break;
#define TILE_QF(R, C, P) TILE_CASE(R, C, P, 0, 0) TILE_CASE(R, C, P, 0, 1) TILE_CASE(R, C, P, 1, 0) \
                         TILE_CASE(R, C, P, 1, 1)
#define TILE_R(R, P) TILE_QF(R, 1, P) TILE_QF(R, COLS_WIDE, P)
    switch (((((rows * 8 + cols) * 2 + (precise != 0)) * 2 + (q5 != 0))) * 2 + (prefetch != 0)) {
        TILE_R(1, 1) TILE_R(2, 1)
        TILE_R(1, 0) TILE_R(2, 0) TILE_R(3, 0) TILE_R(4, 0)
        default: break;
    }
#undef TILE_R
#undef TILE_QF
#undef TILE_CASE
}
#elif MS_AVX2
/* AVX2: one weight row at a time (one sequential stream per thread, which the hardware prefetch
 * follows) against up to 2 activation rows. Each 32-byte half of a chunk (8 groups) widens to
 * 16-bit lanes in two in-lane unpacks; vpmaddwd multiplies them with the 16-bit activations,
 * stored in the unpacks' order (quantize_row16), and after the block's 8 chunks one hadd gives
 * each group its exact integer (as the VNNI path has it), scaled by the group's two scales into
 * one float accumulator per row (block_dot). No overflow: at most 8 * 2 * 255 * 32385 per lane. */
#define MAX_ROWS 2

/* byte i = 0x10 where bit i of `bits` is set (q5's fifth bits of 32 positions) */
static inline __m256i fifth_bits(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i select = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i bytes = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread), select);
    return _mm256_and_si256(_mm256_cmpeq_epi8(bytes, select), _mm256_set1_epi8(0x10));
}

/* A q5 chunk's 64 codes (c + 16) as bytes: positions 0-31 (half 0) and 32-63 (half 1). */
static inline void unpack5_halves(const uint8_t *chunk, __m256i half[2]) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i nib = _mm256_loadu_si256((const __m256i *)chunk);
    uint64_t bits;
    memcpy(&bits, chunk + 32, 8);
    half[0] = _mm256_or_si256(_mm256_and_si256(nib, low4), fifth_bits((uint32_t)bits));
    half[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(nib, 4), low4), fifth_bits((uint32_t)(bits >> 32)));
}

/* The fp16 scales of 8 groups, n of them present (the rest 0). */
static inline __m256 eight_f16(const uint16_t *p, int64_t n) {
    uint16_t part[8] = {0};
    if (n >= 8) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    if (n > 0) memcpy(part, p, 2 * (size_t)n);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)part));
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#ifndef AVX2_PREFETCH_BYTES
#define AVX2_PREFETCH_BYTES 2048   /* how far ahead of the chunk in use its row stream is fetched */
#endif

/* One block (g groups at b0) of one weight row against ROWS activation rows, into acc. FULL:
 * g = 16 (every block but a ragged last one). Per chunk, each half (8 groups, 32 codes) widens
 * in two in-lane unpacks; vpmaddwd with the activations in the same order (row_position) leaves
 * groups 0, 1, 4, 5 in the low unpack's lane pairs and 2, 3, 6, 7 in the high one's, and after
 * the 8 chunks one hadd of the two gives the 8 groups' exact integers in order. */
static inline __attribute__((always_inline)) void block_dot(const uint8_t *w, const uint16_t *wscales,
        int64_t b0, int64_t g, const int16_t *x16, int64_t row_codes, const float *xs, const int32_t *seed,
        int64_t row_groups, const int ROWS, const int Q5, const int FULL, __m256 acc[MAX_ROWS]) {
    const int64_t step = Q5 ? Q5_CHUNK_BYTES : 4 * g;
    const uint8_t *wb = Q5 ? w + b0 / BLOCK_GROUPS * 8 * Q5_CHUNK_BYTES : w + b0 * QK;
    const int16_t *ab = x16 + b0 * QK;
    const int halves = FULL ? 2 : (int)((g + 7) / 8);
    const __m256i zero = _mm256_setzero_si256();
    __m256i d[MAX_ROWS][2][2];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < ROWS; r++)
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) d[r][h][0] = d[r][h][1] = zero;
    _Pragma("GCC unroll 2")
    for (int j = 0; j < 8; j++) {
        _mm_prefetch((const char *)(wb + j * step + AVX2_PREFETCH_BYTES), _MM_HINT_T0);
        __m256i codes[2];
        if (Q5) {
            unpack5_halves(wb + j * step, codes);
        } else {
            _Pragma("GCC unroll 2")
            for (int h = 0; h < 2; h++) {
                if (h >= halves) break;
                const uint8_t *at = wb + j * step + 32 * h;
                const int64_t in_half = g - 8 * h;   /* groups of this half: 8 unless ragged */
                codes[h] = FULL || in_half >= 8 ? _mm256_loadu_si256((const __m256i *)at)
                         : _mm256_maskload_epi32((const int *)at, _mm256_cmpgt_epi32(
                               _mm256_set1_epi32((int)in_half), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
            }
        }
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            if (h >= halves) break;
            const __m256i low = _mm256_unpacklo_epi8(codes[h], zero), high = _mm256_unpackhi_epi8(codes[h], zero);
            _Pragma("GCC unroll 4")
            for (int r = 0; r < ROWS; r++) {
                const int16_t *at = ab + r * row_codes + j * 64 + 32 * h;
                d[r][h][0] = _mm256_add_epi32(d[r][h][0], _mm256_madd_epi16(low, _mm256_loadu_si256((const __m256i *)at)));
                d[r][h][1] = _mm256_add_epi32(d[r][h][1], _mm256_madd_epi16(high, _mm256_loadu_si256((const __m256i *)(at + 16))));
            }
        }
    }
    _Pragma("GCC unroll 2")
    for (int h = 0; h < 2; h++) {
        if (h >= halves) break;
        const __m256 ws = eight_f16(wscales + b0 + 8 * h, FULL ? 8 : g - 8 * h);
        _Pragma("GCC unroll 4")
        for (int r = 0; r < ROWS; r++) {
            const float *xsr = xs + r * row_groups + b0 + 8 * h;
            const int32_t *sd = seed + r * 2 * row_groups + b0 + 8 * h;
            const __m256i sums = _mm256_add_epi32(_mm256_hadd_epi32(d[r][h][0], d[r][h][1]),
                                                  _mm256_loadu_si256((const __m256i *)sd));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(ws, _mm256_loadu_ps(xsr)), acc[r]);
        }
    }
}

static inline __attribute__((always_inline)) void tile_dot(const uint8_t *w, const uint16_t *wscales, int64_t K,
        const int8_t *xi, const float *xs, const int32_t *seed, const int ROWS, const int PRECISE, const int Q5,
        float *out) {
    const int64_t groups = K / QK, row_groups = ROW_GROUPS(groups), row_codes = ROW_CODES(K);
    const int16_t *x16 = (const int16_t *)xi;   /* rows of ROW_CODES(K) int16 (quantize_row16) */
    (void)PRECISE;   /* the scales in xs carry it */
    __m256 acc[MAX_ROWS];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_ps();
    int64_t b0 = 0;
    for (; b0 + BLOCK_GROUPS <= groups; b0 += BLOCK_GROUPS)
        block_dot(w, wscales, b0, BLOCK_GROUPS, x16, row_codes, xs, seed, row_groups, ROWS, Q5, 1, acc);
    if (b0 < groups)
        block_dot(w, wscales, b0, groups - b0, x16, row_codes, xs, seed, row_groups, ROWS, Q5, 0, acc);
    _Pragma("GCC unroll 4")
    for (int r = 0; r < ROWS; r++) out[r] = hsum8(acc[r]);
}

/* One weight row per tile (COLS_WIDE 1); rows of activations 2 at a time (8 integer
 * accumulators, 2 float ones and the widened codes fit the 16 ymm registers). */
#define TILE_ROWS(precise) 2
#define COLS_WIDE 1
#define MAX_TILE MAX_ROWS

static void tile_any(const uint8_t *w, int64_t w_stride, const uint16_t *wscales, int64_t K, const int8_t *xi,
                     const float *xs, const int32_t *seed, int rows, int cols, int precise, int q5, int prefetch,
                     float *out) {
    (void)w_stride, (void)cols, (void)prefetch;   /* always one weight row; its own stream prefetch */
#define TILE_CASE(R, P, Q) case ((R) * 2 + (P)) * 2 + (Q): tile_dot(w, wscales, K, xi, xs, seed, R, P, Q, out); break;
    switch ((rows * 2 + (precise != 0)) * 2 + (q5 != 0)) {
        TILE_CASE(1, 0, 0) TILE_CASE(1, 0, 1) TILE_CASE(1, 1, 0) TILE_CASE(1, 1, 1)
        TILE_CASE(2, 0, 0) TILE_CASE(2, 0, 1) TILE_CASE(2, 1, 0) TILE_CASE(2, 1, 1)
        default: break;
    }
#undef TILE_CASE
}
#else
/* portable: one weight row at a time, every activation row of the tile against it */
static void row_dot(const uint8_t *w, const uint16_t *wscales, int64_t K, const int8_t *xi, const float *xs,
                    const int32_t *seed, int64_t rows, int precise, float *out, int64_t out_stride) {
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
        out[m * out_stride] = acc;
    }
}

/* portable q5: unpack the row to q8's interleaved bytes (c + 16), then the same loop */
static void row_dot5(const uint8_t *w, const uint16_t *wscales, int64_t K, const int8_t *xi, const float *xs,
                     const int32_t *seed, int64_t rows, int precise, float *out, int64_t out_stride) {
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
    row_dot(plain, wscales, K, xi, xs, seed, rows, precise, out, out_stride);
    free(plain);
}

#define TILE_ROWS(precise) 4
#define COLS_WIDE 4
#define MAX_TILE 16

static void tile_any(const uint8_t *w, int64_t w_stride, const uint16_t *wscales, int64_t K, const int8_t *xi,
                     const float *xs, const int32_t *seed, int rows, int cols, int precise, int q5, int prefetch,
                     float *out) {
    (void)prefetch;
    for (int c = 0; c < cols; c++)
        (q5 ? row_dot5 : row_dot)(w + c * w_stride, wscales + c * (K / QK), K, xi, xs, seed, rows, precise,
                                  out + c, cols);
}
#endif

/* ---- q5: the same numbers when every code lies in -16..15 (the GGUF's Q5_0 tensors), packed
 * in 5 bits. Each chunk of a block (4g codes in the interleaved order above, g <= 16) is padded
 * to 64 positions and stored in 40 bytes: 32 bytes of nibbles (byte i: position i in the low
 * nibble, position i + 32 in the high one), then 8 bytes holding the fifth bit of position i
 * in bit i. Unpacked, position i is byte i again, so lane l still holds group l. Codes are c + 16. */
int64_t ms_q5_row_bytes(int64_t K) {
    const int64_t groups = K / QK;
    return ((groups + BLOCK_GROUPS - 1) / BLOCK_GROUPS) * 8 * Q5_CHUNK_BYTES;
}

/* The activations of one call, quantized once for every weight row. */
typedef struct { int8_t *xi; float *xs; int32_t *seed; } activations;

/* Bytes after the activation codes that a ragged block's whole-vector loads may read. */
#define PAD_BYTES 64

static int allocate(int64_t M, int64_t K, activations *a) {
    const int64_t groups = ROW_GROUPS(K / QK);
    a->xi = malloc((size_t)(2 * M * ROW_CODES(K) + PAD_BYTES));
    a->xs = malloc(sizeof(float) * (size_t)(M * groups));
    a->seed = malloc(sizeof(int32_t) * (size_t)(2 * M * groups));
    return a->xi && a->xs && a->seed ? 0 : -2;
}

static void release(activations *a) { free(a->xi); free(a->xs); free(a->seed); }

static inline void store(void *y, int y_bf16, int64_t at, float v) {
    if (y_bf16) ((uint16_t *)y)[at] = f32_to_bf16(v);
    else ((float *)y)[at] = v;
}

#if MS_VNNI
/* store() of 4 consecutive outputs (+ bias, or + 0 as store's callers add) in vectors: the same
 * bits (f32_to_bf16's nearest even, NaN kept quiet). One output at a time cost as much as the
 * products of a short row. */
static inline void store4(void *y, int y_bf16, int64_t at, const float *v, const float *bias) {
    const __m128 sum = _mm_add_ps(_mm_loadu_ps(v), bias ? _mm_loadu_ps(bias) : _mm_setzero_ps());
    if (!y_bf16) {
        _mm_storeu_ps((float *)y + at, sum);
        return;
    }
    const __m128i u = _mm_castps_si128(sum), high = _mm_srli_epi32(u, 16);
    const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
    const __m128i even = _mm_add_epi32(_mm_set1_epi32(0x7fff), _mm_and_si128(high, _mm_set1_epi32(1)));
    const __m128i rounded = _mm_srli_epi32(_mm_add_epi32(u, even), 16);
    const __m128i bits = _mm_blendv_epi8(rounded, _mm_or_si128(high, _mm_set1_epi32(0x40)), nan);
    _mm_storel_epi64((__m128i *)((uint16_t *)y + at), _mm_packus_epi32(bits, bits));
}
#endif

/* Activation rows first .. end - 1 of x, quantized into a. A few rows are quantized before the
 * parallel region (microseconds; one barrier less), many inside it, shared by the threads. */
#define PARALLEL_MIN_ROWS 4

static void quantize_rows(const void *x, int x_bf16, int64_t first, int64_t end, int64_t K, int q5, int precise,
                          activations *a) {
    const int64_t groups = K / QK;
    for (int64_t m = first; m < end; m++)
        QUANTIZE_ROW((const char *)x + m * K * (x_bf16 ? 2 : 4), x_bf16, K, q5 ? 16 : 128, a->xi + 2 * m * ROW_CODES(K),
                     a->xs + m * ROW_GROUPS(groups), a->seed + 2 * m * ROW_GROUPS(groups), precise);
}

#if MS_VNNI
/* q5 rows n .. n + cols - 1 unpacked to q8's byte layout (codes c + 16) in a buffer of this
 * thread's (kept for the thread's life: at most COLS_WIDE * K bytes), for calls whose rows take
 * more than two tiles: each tile unpacks every weight chunk it reads, and beyond two tiles
 * unpacking once and reading the bytes back from L1 measured faster (bench.kernel_ab). The
 * integers are the same, so are the results. */
static const uint8_t *unpacked_columns(const uint8_t *w, int64_t row_bytes, int64_t K, int cols) {
    static __thread uint8_t *buffer;
    static __thread int64_t capacity;
    if (capacity < cols * K) {
        free(buffer);
        buffer = malloc((size_t)(cols * K));
        capacity = buffer ? cols * K : 0;
        if (!buffer) return NULL;
    }
    const int64_t groups = K / QK;
    for (int c = 0; c < cols; c++)
        for (int64_t b0 = 0; b0 < groups; b0 += BLOCK_GROUPS) {
            const int64_t g = groups - b0 < BLOCK_GROUPS ? groups - b0 : BLOCK_GROUPS;
            const __mmask64 bytes = g == BLOCK_GROUPS ? ~0ull : ((1ull << (4 * g)) - 1ull);
            for (int j = 0; j < 8; j++) {
                const uint8_t *chunk = w + c * row_bytes + (b0 / BLOCK_GROUPS * 8 + j) * Q5_CHUNK_BYTES;
                _mm_prefetch((const char *)chunk + PREFETCH_TILES * cols * row_bytes, _MM_HINT_T1);
                _mm512_mask_storeu_epi8(buffer + c * K + b0 * QK + j * 4 * g, bytes,
                                        weight_chunk(w + c * row_bytes, b0, j, g, bytes, 1, 0));
            }
        }
    return buffer;
}
#endif

/* Weight rows n .. n + cols - 1 against every activation row, written to y (+ bias). */
static void column_tile(const activations *a, int64_t M, int64_t K, const uint8_t *weights, int64_t row_bytes,
                        int q5, const uint16_t *scales, int64_t N, int64_t n, int cols, const float *bias,
                        void *y, int y_bf16, int precise) {
    const int64_t groups = K / QK;
    const int tile_rows = TILE_ROWS(precise);
    float out[MAX_TILE];
    const uint8_t *w = weights + n * row_bytes;
#if MS_VNNI
    int unpacked = 0;
    if (q5 && M > 2 * tile_rows) {   /* (up to two tiles, unpacking in each measured faster) */
        const uint8_t *plain = unpacked_columns(w, row_bytes, K, cols);
        if (plain) w = plain, row_bytes = K, q5 = 0, unpacked = 1;
    }
#else
    const int unpacked = 0;
#endif
    for (int64_t m0 = 0; m0 < M; m0 += tile_rows) {
        const int rows = (int)(M - m0 < tile_rows ? M - m0 : tile_rows);
        /* the first row tile reads the weights from memory (and fetches the next tiles' ahead);
         * the others find them in cache, where prefetching only costs load slots (10-25%) */
        const int prefetch = m0 == 0 && !unpacked;
        tile_any(w, row_bytes, scales + n * groups, K, a->xi + 2 * m0 * ROW_CODES(K),
                 a->xs + m0 * ROW_GROUPS(groups), a->seed + 2 * m0 * ROW_GROUPS(groups), rows, cols, precise, q5,
                 prefetch, out);
        for (int r = 0; r < rows; r++) {
#if MS_VNNI
            if (cols == 4) {
                store4(y, y_bf16, (m0 + r) * N + n, out + r * 4, bias ? bias + n : NULL);
                continue;
            }
#endif
            for (int c = 0; c < cols; c++)
                store(y, y_bf16, (m0 + r) * N + n + c, out[r * cols + c] + (bias ? bias[n + c] : 0.0f));
        }
    }
}

/* The output columns of one call in tiles of COLS_WIDE, shared by the threads of the team that
 * calls it (an orphaned omp for: every thread of a parallel region calls this; it ends in the
 * for's barrier). */
static void linear_tiles(const activations *a, int64_t M, int64_t K, const uint8_t *weights, int64_t row_bytes,
                         int q5, const uint16_t *scales, int64_t N, const float *bias, void *y, int y_bf16,
                         int precise) {
    const int64_t tiles = (N + COLS_WIDE - 1) / COLS_WIDE;
    #pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t end = (t + 1) * COLS_WIDE < N ? (t + 1) * COLS_WIDE : N;
        const int cols = end - t * COLS_WIDE < COLS_WIDE ? 1 : COLS_WIDE;
        for (int64_t n = t * COLS_WIDE; n < end; n += cols)
            column_tile(a, M, K, weights, row_bytes, q5, scales, N, n, cols, bias, y, y_bf16, precise);
    }
}

/* y[M, N] = x[M, K] W^T (+ bias), weights as rows of row_bytes (q8 codes or q5-packed).
 * One parallel region: the threads share the output columns in tiles of COLS_WIDE (and first
 * the quantizing of many activation rows). */
static int linear(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *weights, int64_t row_bytes,
                  int q5, const uint16_t *scales, int64_t N, const float *bias, void *y, int y_bf16, int threads,
                  int precise) {
    if (K % QK != 0 || M <= 0 || N <= 0) return -1;
    activations a;
    if (allocate(M, K, &a) != 0) { release(&a); return -2; }
    const int parallel_rows = M >= PARALLEL_MIN_ROWS;
    if (!parallel_rows) quantize_rows(x, x_bf16, 0, M, K, q5, precise, &a);
    #pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
    {
        if (parallel_rows) {
            #pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++) quantize_rows(x, x_bf16, m, m + 1, K, q5, precise, &a);
        }
        linear_tiles(&a, M, K, weights, row_bytes, q5, scales, N, bias, y, y_bf16, precise);
    }
    release(&a);
    return 0;
}

/* ---- a few bf16 rows inside a caller's parallel region (step.c: a whole decode or verify
 * step in one region, without a fork/join per linear): the same numbers as ms_q8_linear /
 * ms_q5_linear. One thread quantizes the M rows into `scratch` (ms_q8_team_scratch(M, K)
 * bytes; the offset depends on the weights' format, q5), then every thread of the team calls
 * ms_q8_team_tiles, which returns after the tiles' barrier. */
static activations carve(void *scratch, int64_t M, int64_t K) {
    const int64_t groups = ROW_GROUPS(K / QK);
    activations a;
    a.xs = (float *)scratch;
    a.seed = (int32_t *)(a.xs + M * groups);
    a.xi = (int8_t *)(a.seed + 2 * M * groups);
    return a;
}

int64_t ms_q8_team_scratch(int64_t M, int64_t K) {
    const int64_t groups = ROW_GROUPS(K / QK);
    return M * ((int64_t)(sizeof(float) * groups + sizeof(int32_t) * 2 * groups) + 2 * ROW_CODES(K)) + PAD_BYTES;
}

void ms_q8_team_quantize(const uint16_t *x, int64_t M, int64_t K, int q5, int precise, void *scratch) {
    activations a = carve(scratch, M, K);
    quantize_rows(x, 1, 0, M, K, q5, precise, &a);
}

void ms_q8_team_tiles(int64_t M, int64_t K, const uint8_t *weights, int q5, const uint16_t *scales, int64_t N,
                      const float *bias, uint16_t *y, int precise, void *scratch) {
    activations a = carve(scratch, M, K);
    linear_tiles(&a, M, K, weights, q5 ? ms_q5_row_bytes(K) : K, q5, scales, N, bias, y, 1, precise);
}

/* y[M, N] = x[M, K] W^T (+ bias). x and y are bf16 or float32; bias float32 or NULL.
 * codes: u8 [N, K] interleaved (see above); scales: fp16 [N, K/32]. precise: both activation
 * parts (about 16 bits); 0: the first byte only (8-bit activations, half the multiplies). */
int ms_q8_linear(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *codes,
                 const uint16_t *scales, int64_t N, const float *bias, void *y, int y_bf16, int threads,
                 int precise) {
    return linear(x, x_bf16, M, K, codes, K, 0, scales, N, bias, y, y_bf16, threads, precise);
}

/* As ms_q8_linear, with q5-packed rows (ms_q5_row_bytes(K) bytes each). */
int ms_q5_linear(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *packed,
                 const uint16_t *scales, int64_t N, const float *bias, void *y, int y_bf16, int threads,
                 int precise) {
    return linear(x, x_bf16, M, K, packed, ms_q5_row_bytes(K), 1, scales, N, bias, y, y_bf16, threads, precise);
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
