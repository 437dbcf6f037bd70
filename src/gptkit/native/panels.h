// Products on packed panels: y[r] (=, or +=) act(x[r]·Wᵀ + b) for every row r of activations,
// the output panels [begin, end) of W on this thread. Part of decode_step.cpp's one translation unit.
//
// A panel holds 16 outputs' weights, their inputs in groups (interface.h). A block of R rows × P
// panels keeps R·P vectors of 16 sums in registers; each step over the inputs loads P vectors of
// weights once and multiplies them by every row's broadcast input (fp32 FMA), input pair (bf16 dot
// product) or input quad (int8 dot product). So each weight is read once per block of rows, each
// lane sums one output (no horizontal add), and one row costs what it costs in a batch of 64: an
// output's sum runs over its inputs in the same order whatever the rows beside it, so a sequence's
// numbers do not depend on the batch it is decoded in.
//
// The activations are staged first: fp32 as they are; bf16 rounded to bf16 pairs (the products of
// bf16 pairs are exact in fp32; the CPU's bf16 units sum them, else FMAs in the same order); int8
// rounded per row to 7-bit unsigned integers with a zero point (the scheme of PyTorch's dynamically
// quantized linear with reduce_range, whose sums never saturate AVX2's 16-bit pair sums), 4 a lane.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "elementwise.h"
#include "interface.h"
#include "vectors.h"

namespace {

// Whether a product writes its results (=) or adds them to what y holds (+=, a residual).
enum Epilogue { STORE = 0, ADD = 1 };

// The activations of one row as 7-bit unsigned integers: x ≈ scale · (q - zero_point), q in [0, 127].
// The range is [min(x, 0), max(x, 0)] so that 0 is exact, the zero point rounded to an integer.
struct Quantized {
    float scale;
    int32_t zero_point;
};

Quantized quantize_row(const float* x, int n, uint8_t* q) {
    float lo = 0.0f, hi = 0.0f;
#pragma omp simd reduction(min : lo) reduction(max : hi)
    for (int i = 0; i < n; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
    }
    const int levels = 127;
    double scale = (double(hi) - double(lo)) / levels;
    if (float(scale) == 0.0f) scale = 0.1;  // an all-zero row: any scale
    const double zero_from_min = -double(lo) / scale;
    const int32_t zero_point = int32_t(std::min(std::max(std::nearbyint(zero_from_min), 0.0), double(levels)));
    const float inverse = float(1.0 / scale);
    const float zero = float(zero_point);
#pragma omp simd
    for (int i = 0; i < n; ++i) {
        const float v = __builtin_rintf(x[i] * inverse + zero);
        q[i] = uint8_t(std::min(std::max(v, 0.0f), float(levels)));
    }
    return {float(scale), zero_point};
}

// fp32 → bf16, rounded to nearest even (a NaN stays a NaN).
inline uint32_t bf16_bits(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (bits >> 16) | 0x40u;
    return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

inline float float_bits(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// A product's activations as its kernel reads them, kept between calls.
struct Staged {
    std::vector<uint32_t> packed;  // bf16 pairs or int8 quads: (rows, groups)
    std::vector<Quantized> params;  // int8: each row's scale and zero point

    void size(int rows, int groups) {
        if (packed.size() < size_t(rows) * groups) packed.resize(size_t(rows) * groups);
        if (params.size() < size_t(rows)) params.resize(rows);
    }

    // Rows [begin, end) of x (rows, in) in `format` (size() first; fp32 needs nothing).
    void stage(int format, const float* x, int in, int begin, int end) {
        const int groups = groups_of(in, format);
        for (int r = begin; r < end; ++r) {
            const float* row = x + size_t(r) * in;
            uint32_t* out = packed.data() + size_t(r) * groups;
            if (format == BF16) {
                for (int k = 0; k < in / 2; ++k) out[k] = bf16_bits(row[2 * k]) | bf16_bits(row[2 * k + 1]) << 16;
                if (in % 2) out[in / 2] = bf16_bits(row[in - 1]);
                std::fill(out + (in + 1) / 2, out + groups, 0u);
            } else if (format == INT8) {
                uint8_t* bytes = reinterpret_cast<uint8_t*>(out);
                params[r] = quantize_row(row, in, bytes);
                std::fill(bytes + in, bytes + size_t(groups) * 4, uint8_t(0));
            }
        }
    }
};

// One product's operands.
struct Product {
    const Matrix& m;
    int rows, groups;
    const float* x;           // FP32: the activations (rows, in)
    const Staged* staged;     // BF16, INT8
    float* y;                 // (rows, out)
    Epilogue epilogue;
    int activation;           // < 0: none
    // The output layer's argmax as the results are written: per row, the largest result among the
    // outputs 0..choosable-1 of this thread's panels and where it first is (null: not asked).
    float* best = nullptr;
    int32_t* best_at = nullptr;
    int choosable = 0;

    const uint32_t* packed_row(int r) const { return staged->packed.data() + size_t(r) * groups; }
    size_t panel_stride() const { return size_t(groups) * PANEL; }  // elements of (format's groups)
};

// The output layer's argmax: row r's largest so far, where the panel from n0 has a larger one.
inline void track_largest(const Product& p, int r, int n0, const float* v, int count) {
    count = std::min(count, p.choosable - n0);
    if (count <= 0) return;
    float top = v[0];
    for (int i = 1; i < count; ++i) top = std::max(top, v[i]);
    if (!(top > p.best[r])) return;  // panels come in order: the first of equal largest stays
    for (int i = 0; i < count; ++i)
        if (v[i] == top) {
            p.best[r] = top;
            p.best_at[r] = n0 + i;
            return;
        }
}

// Row r's results of the panel whose first output is n0 (16, fewer in the last panel), finished:
// bias, activation, = or +=, and the argmax where asked; a whole panel in vectors.
inline void write_sums(const Product& p, int r, int n0, float* v) {
    const int count = std::min(PANEL, p.m.out - n0);
    float* y = p.y + size_t(r) * p.m.out + n0;
#ifdef GPTKIT_FLOAT_VECTORS
    if (count == PANEL) {
        for (int i = 0; i < PANEL; i += FVEC_LANES) {
            fvec sum = lanes(v + i);
            if (p.m.bias) sum = fvec_add(sum, lanes(p.m.bias + n0 + i));
            if (p.activation == 0) sum = fvec_gelu_tanh(sum);  // GPT-2's: in vectors
            fvec_store(v + i, sum);
        }
        if (p.activation > 0) activate(v, PANEL, p.activation);
        for (int i = 0; i < PANEL; i += FVEC_LANES)
            fvec_store(y + i, p.epilogue == ADD ? fvec_add(lanes(y + i), lanes(v + i)) : lanes(v + i));
        if (p.best) track_largest(p, r, n0, v, PANEL);
        return;
    }
#endif
    if (p.m.bias)
        for (int i = 0; i < count; ++i) v[i] += p.m.bias[n0 + i];
    if (p.activation >= 0) activate(v, count, p.activation);
    if (p.epilogue == ADD)
        for (int i = 0; i < count; ++i) y[i] += v[i];
    else
        for (int i = 0; i < count; ++i) y[i] = v[i];
    if (p.best) track_largest(p, r, n0, v, count);
}

// Σ scale_x·(q_x - z)·scale_w·q_w = scale_x·scale_w·(Σ q_x·q_w - z·Σ q_w), plus the bias.
inline void write_int_sums(const Product& p, int r, int n0, const int32_t* sums) {
    const Quantized& q = p.staged->params[r];
    float v[PANEL];
    const int count = std::min(PANEL, p.m.out - n0);
    for (int i = 0; i < count; ++i) {
        const int n = n0 + i;
        v[i] = float(sums[i] - q.zero_point * p.m.row_sum[n]) * (q.scale * p.m.scale[n]);
    }
    write_sums(p, r, n0, v);  // the bias added there: bias + the scaled sum, as before
}

}  // namespace

#include "kernels.h"
#include "amx.h"

namespace {

// Rows of activations a product takes at a time: 128 rows of 3,072 fp32 inputs (1.5 MB) stay in
// the second-level cache (GPT-2 small's 48 block matrices times 640 rows: 260 against 247 GFLOP/s).
constexpr int ROW_BLOCK = 128;

// int8 products of at least this many rows run on the matrix units where there are some.
constexpr int AMX_INT8_ROWS = 4;

// The block of nr rows × np panels of `span`, in the kernel instantiated for that shape.
template <class K, int NR, int NP>
void block_of(const K& kernel, int nr, int np, const Span& span) {
    if constexpr (NR > 1) {
        if (nr < NR) return block_of<K, NR - 1, NP>(kernel, nr, np, span);
    }
    if constexpr (NP > 1) {
        if (np < NP) return block_of<K, NR, NP - 1>(kernel, nr, np, span);
    }
    kernel.template block<NR, NP>(span);
}

// Panels [begin, end) a group of K::P at a time; more rows than a block take the inputs a chunk at
// a time, every block of rows against a chunk while its weights are in the core's cache (kernels.h).
template <class K>
void run_panels(const K& kernel, int rows, int begin, int end) {
    const bool chunked = K::CHUNKED && rows > K::R && rows <= CHUNKED_ROWS;
    const int groups = kernel.p.groups, chunk = chunked ? CHUNK : groups;
    if (chunked && partial_sums.size() < size_t(ROW_BLOCK) * K::P * PANEL) partial_sums.resize(size_t(ROW_BLOCK) * K::P * PANEL);
    // Many rows (a prompt) ROW_BLOCK at a time: their activations stay in the core's second-level
    // cache while the weights stream past them (read again for each ROW_BLOCK rows).
    for (int first = 0; first < rows; first += ROW_BLOCK) {
        const int last = std::min(rows, first + ROW_BLOCK);
        for (int p0 = begin; p0 < end; p0 += K::P)
            for (int k0 = 0; k0 < groups; k0 += chunk) {
                const int k1 = std::min(groups, k0 + chunk);
                for (int r0 = first; r0 < last; r0 += K::R) {
                    float* partial = partial_sums.data() + size_t(r0 - first) * K::P * PANEL;
                    const Span span{r0, p0, k0, k1, k0 == 0, k1 == groups, partial};
                    block_of<K, K::R, K::P>(kernel, std::min(K::R, last - r0), std::min(K::P, end - p0), span);
                }
            }
    }
}

// The product's panels [begin, end), in the best kernel compiled in for its format.
void product_panels(int format, const Product& p, int begin, int end) {
    if (format == FP32) {
#ifdef GPTKIT_FLOAT_VECTORS
        return run_panels(Fp32Panels{p}, p.rows, begin, end);
#endif
    } else if (format == BF16) {
#ifdef GPTKIT_AMX
        if (amx_usable()) return amx_panels<false>(p, begin, end);
#endif
#if defined(GPTKIT_BF16_DOT)
        return run_panels(Bf16DotPanels{p}, p.rows, begin, end);
#elif defined(GPTKIT_FLOAT_VECTORS)
        return run_panels(Bf16WidePanels{p}, p.rows, begin, end);
#endif
    } else {
#ifdef GPTKIT_AMX
        // Exact integers: the matrix units' sums are the vector units', so rows choose by speed.
        if (p.rows >= AMX_INT8_ROWS && amx_usable()) return amx_panels<true>(p, begin, end);
#endif
#ifdef GPTKIT_INT_VECTORS
        return run_panels(Int8Panels{p}, p.rows, begin, end);
#endif
    }
    run_panels(ScalarPanels{p, format}, p.rows, begin, end);
}

}  // namespace
