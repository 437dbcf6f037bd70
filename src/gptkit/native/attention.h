// Attention over the KV cache for the new token of each row: a phase of a step's team. Part of
// decode_step.cpp's one translation unit.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "elementwise.h"
#include "interface.h"
#include "team.h"
#include "vectors.h"

namespace {

// softmax(q·Kᵀ/√d)·V of the new token of each row over its cached positions, the new k and v
// written into the cache first; the (row, head) pairs split between the team. qkv: (rows,
// 3·d_model); heads: (rows, d_model); scores: positions floats a thread.
void attend(const Team& team, const Step& s, int layer, const float* qkv, float* heads, float* scores) {
    const int d = s.d_model, nh = s.n_head, hs = d / nh, positions = s.past + 1;
    const float scale = 1.0f / std::sqrt(float(hs));
    scores += size_t(team.thread) * positions;
    int begin, end;
    team.share(s.rows * nh, begin, end);
    for (int item = begin; item < end; ++item) {
        const int r = item / nh, h = item % nh;
        const size_t base = ((size_t(layer) * s.cache_rows + r) * nh + h) * size_t(s.capacity) * hs;
        float* keys = s.keys + base;
        float* values = s.values + base;
        const float* q = qkv + size_t(r) * 3 * d + h * hs;
        std::memcpy(keys + size_t(s.past) * hs, q + d, hs * sizeof(float));
        std::memcpy(values + size_t(s.past) * hs, q + 2 * d, hs * sizeof(float));
        const uint8_t* mask = s.mask ? s.mask + size_t(r) * positions : nullptr;
        float top = -INFINITY;
        for (int j = 0; j < positions; ++j) {
            // A padding position is skipped, but the new token always sees itself (as PyTorch's
            // mask keeps the diagonal: a padded query's row is never empty).
            const bool skip = mask && !mask[j] && j != s.past;
            scores[j] = skip ? -INFINITY : dot<float>(q, keys + size_t(j) * hs, hs) * scale;
            top = std::max(top, scores[j]);
        }
        float total = 0.0f;
        for (int j = 0; j < positions; ++j) {
            scores[j] = scores[j] == -INFINITY ? 0.0f : exp_approx(scores[j] - top);
            total += scores[j];
        }
        float* out = heads + size_t(r) * d + h * hs;
        std::fill(out, out + hs, 0.0f);
        const float inverse = 1.0f / total;
        for (int j = 0; j < positions; ++j) {
            if (scores[j] == 0.0f) continue;
            const float weight = scores[j] * inverse;
            const float* v = values + size_t(j) * hs;
#pragma omp simd
            for (int i = 0; i < hs; ++i) out[i] += weight * v[i];
        }
    }
    team.barrier();
}

}  // namespace
