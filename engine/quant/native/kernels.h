/* What step.c calls of q8.c and decode.c: the pieces of a decode step that run inside one
 * parallel region (q8.c's team linear) or on one thread (decode.c's small operations). */
#ifndef MINISERVE_KERNELS_H
#define MINISERVE_KERNELS_H

#include <stdint.h>

/* q8.c: M bf16 rows against q8 / q5 weights inside a caller's parallel region. */
int64_t ms_q8_team_scratch(int64_t M, int64_t K);
void ms_q8_team_quantize(const uint16_t *x, int64_t M, int64_t K, int q5, int precise, void *scratch);
void ms_q8_team_tiles(int64_t M, int64_t K, const uint8_t *weights, int q5, const uint16_t *scales, int64_t N,
                      const float *bias, uint16_t *y, int precise, void *scratch);

/* gguf.c: M bf16 rows against one GGUF block-format part inside a caller's parallel region. */
int64_t ms_gguf_team_scratch(int64_t M, int64_t K);
int ms_gguf_acts_key(int type);
void ms_gguf_team_quantize(int type, const uint16_t *x, int64_t M, int64_t K, void *scratch);
void ms_gguf_team_tiles(int type, int64_t M, int64_t K, const uint8_t *w, int64_t w_stride, int64_t N, float *y,
                        int64_t y_stride, void *scratch);

/* decode.c */
int ms_rms_norm_bf16(const uint16_t *x, const uint16_t *weight, uint16_t *out, int64_t rows, int64_t dim, float eps,
                     int torch_lanes);
int ms_rotary_bf16(uint16_t *x, int64_t rows, int64_t stride, int64_t heads, int64_t dim,
                   const uint16_t *cos, const uint16_t *sin);
int ms_silu_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t inter);

/* Key and value rows 0..length-1 of kv head h of one layer, either in a contiguous cache
 * (keys/values [kv_heads, capacity, dim]: table NULL) or in a paged pool ([num_blocks, layers,
 * block_size, kv_heads, dim] for keys and for values: block `table[j / block_size]`). */
typedef struct {
    uint16_t *keys, *values;
    int64_t capacity;                   /* contiguous */
    const int64_t *table;               /* paged: one sequence's block table (NULL: contiguous) */
    int64_t layers, layer, block_size, kv_heads;
} kv_rows;

/* One token's query group h at position pos: store its k, v (k_new / v_new: [dim] of kv head h;
 * NULL: already stored), then attend over positions 0..pos. Returns 1 when out of memory. */
int ms_attend_head(const kv_rows *kv, int64_t h, int64_t pos, const uint16_t *q, const uint16_t *k_new,
                   const uint16_t *v_new, int64_t group, int64_t dim, float scale, uint16_t *out);

/* `tokens` consecutive tokens of one sequence at positions pos0.. and kv head h: store every
 * token's k, v first (rows of k_new / v_new `kv_stride` elements apart), then attend token t
 * (q rows `q_stride` apart, out rows `out_stride` apart) over positions 0..pos0 + t. */
int ms_attend_tokens(const kv_rows *kv, int64_t h, int64_t pos0, int64_t tokens, const uint16_t *q,
                     int64_t q_stride, const uint16_t *k_new, const uint16_t *v_new, int64_t kv_stride,
                     int64_t group, int64_t dim, float scale, uint16_t *out, int64_t out_stride);

#endif
