// Attention over the paged key/value cache for the new tokens of a step: two phases of a step's
// team (every new token's k and v written first, so that the tokens of one prompt see each other,
// then each token's heads). Part of decode_step.cpp's one translation unit.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "elementwise.h"
#include "interface.h"
#include "panels.h"
#include "team.h"
#include "vectors.h"

namespace {

// Where column `column` of a head of a token's sequence is in the cache, in values.
inline size_t cache_at(const Step& s, int layer, int sequence, int head, int column) {
    const int hs = s.d_model / s.n_head;
    const int page = s.block_table[size_t(sequence) * s.table_width + column / s.page_size];
    return (((size_t(layer) * s.pages + page) * s.n_head + head) * s.page_size + column % s.page_size) * hs;
}

// Write each new token's k and v (qkv: (tokens, 3·d_model)) at its column; the tokens split
// between the team.
void store_keys(const Team& team, const Step& s, int layer, const float* qkv) {
    const int d = s.d_model, hs = d / s.n_head;
    int begin, end;
    team.share(s.tokens, begin, end);
    for (int t = begin; t < end; ++t)
        for (int h = 0; h < s.n_head; ++h) {
            const size_t at = cache_at(s, layer, s.sequence[t], h, s.column[t]);
            const float* k = qkv + size_t(t) * 3 * d + d + h * hs;
            const float* v = k + d;
            if (s.cache_format == BF16) {
                uint16_t* keys = static_cast<uint16_t*>(s.keys) + at;
                uint16_t* values = static_cast<uint16_t*>(s.values) + at;
                for (int i = 0; i < hs; ++i) {
                    keys[i] = uint16_t(bf16_bits(k[i]));
                    values[i] = uint16_t(bf16_bits(v[i]));
                }
            } else {
                std::memcpy(static_cast<float*>(s.keys) + at, k, hs * sizeof(float));
                std::memcpy(static_cast<float*>(s.values) + at, v, hs * sizeof(float));
            }
        }
    team.barrier();
}

// out = Σ_j weights[j] · v_j over the columns [0, last] of one head (their values found page by
// page), v fp32 or bf16: in registers where the head's width is whole vectors (as GPT-2's 64 is),
// so that out is written once rather than loaded and stored for every column.
template <typename Value>
void weighted_values(const Step& s, int layer, int seq, int h, int last, const float* weights, float* out) {
    const int hs = s.d_model / s.n_head;
    const Value* values = static_cast<const Value*>(s.values);
#ifdef GPTKIT_FLOAT_VECTORS
    constexpr int MOST = 8;  // vectors of sums held (GPT-2's heads: 4 of AVX-512, 8 of AVX2)
    if (hs % FVEC_LANES == 0 && hs / FVEC_LANES <= MOST) {
        const int n = hs / FVEC_LANES;
        fvec acc[MOST];
        for (int i = 0; i < n; ++i) acc[i] = fvec_zero();
        for (int j0 = 0; j0 <= last; j0 += s.page_size) {
            const Value* page = values + cache_at(s, layer, seq, h, j0);
            const int end = std::min(last + 1 - j0, s.page_size);
            for (int j = 0; j < end; ++j) {
                if (weights[j0 + j] == 0.0f) continue;
                const fvec w = fvec_set1(weights[j0 + j]);
                for (int i = 0; i < n; ++i) acc[i] = fvec_fma(w, lanes(page + size_t(j) * hs + i * FVEC_LANES), acc[i]);
            }
        }
        for (int i = 0; i < n; ++i) fvec_store(out + i * FVEC_LANES, acc[i]);
        return;
    }
#endif
    std::fill(out, out + hs, 0.0f);
    for (int j = 0; j <= last; ++j) {
        if (weights[j] == 0.0f) continue;
        const Value* v = values + cache_at(s, layer, seq, h, j);
        for (int i = 0; i < hs; ++i) out[i] += weights[j] * widen(v[i]);
    }
}

// softmax(q·Kᵀ/√d)·V of one head of one token over its sequence's columns 0..column (padding
// columns skipped; the token always sees itself, as PyTorch's mask keeps the diagonal).
template <typename Value>
void attend_head(const Step& s, int layer, int t, int h, const float* q, float* out, float* scores) {
    const int hs = s.d_model / s.n_head, seq = s.sequence[t], last = s.column[t];
    const float scale = 1.0f / std::sqrt(float(hs));
    const Value* keys = static_cast<const Value*>(s.keys);
    const uint8_t* mask = s.mask ? s.mask + size_t(seq) * s.mask_width : nullptr;
    float top = -INFINITY;
    for (int j0 = 0; j0 <= last; j0 += s.page_size) {  // a page's columns lie together
        const Value* page = keys + cache_at(s, layer, seq, h, j0);
        const int end = std::min(last + 1 - j0, s.page_size);
        for (int j = 0; j < end; ++j) {
            const int column = j0 + j;
            const bool skip = mask && column < s.mask_width && !mask[column] && column != last;
            scores[column] = skip ? -INFINITY : dot<Value>(page + size_t(j) * hs, q, hs) * scale;
            top = std::max(top, scores[column]);
        }
    }
    float total = 0.0f;
    for (int j = 0; j <= last; ++j) {
        scores[j] = scores[j] == -INFINITY ? 0.0f : exp_approx(scores[j] - top);
        total += scores[j];
    }
    const float inverse = 1.0f / total;
    for (int j = 0; j <= last; ++j) scores[j] *= inverse;
    weighted_values<Value>(s, layer, seq, h, last, scores, out);
}

// Every head of every new token (qkv: (tokens, 3·d_model) → heads: (tokens, d_model)), the (token,
// head) pairs split between the team; scores: a row of the widest columns a thread.
void attend(const Team& team, const Step& s, int layer, const float* qkv, float* heads, float* scores, int columns) {
    const int d = s.d_model, nh = s.n_head, hs = d / nh;
    scores += size_t(team.thread) * columns;
    int begin, end;
    team.share(s.tokens * nh, begin, end);
    for (int item = begin; item < end; ++item) {
        const int t = item / nh, h = item % nh;
        const float* q = qkv + size_t(t) * 3 * d + h * hs;
        float* out = heads + size_t(t) * d + h * hs;
        if (s.cache_format == BF16)
            attend_head<uint16_t>(s, layer, t, h, q, out, scores);
        else
            attend_head<float>(s, layer, t, h, q, out, scores);
    }
    team.barrier();
}

}  // namespace
