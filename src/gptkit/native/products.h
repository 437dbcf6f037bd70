// Products: y[r] (=, or +=) x[r]·Wᵀ + b for every row r, output rows [begin, end) of W: each thread
// takes a contiguous band, one stream through its part of the matrix. fp32 and bf16 matrices
// multiply fp32 activations; int8 matrices multiply the activations quantized to 7 bits. Part of
// decode_step.cpp's one translation unit.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "interface.h"
#include "vectors.h"

namespace {

// Whether a product writes its results (=) or adds them to what y holds (+=, a residual).
enum Epilogue { STORE = 0, ADD = 1 };

// Activation rows a prompt's int8 product takes at a time, against two weight rows.
constexpr int TILE = 4;

// A thread's band of a one-row product read as STREAMS sequential streams at once (the band's
// parts, a row from each in turn) rather than one: more of the band in flight from memory.
// GPT-2 small's 49 products, one row, 2 cores, alternating, medians of 15: fp32 -9%, bf16 -12%,
// int8 -6% against one stream; three or four streams no better than two.
constexpr int STREAMS = 2;

template <typename Weight>
inline void dot_rows(const Weight* const* w, const float* x, int n, float* sums) {
    int k = 0;
    for (int i = 0; i < STREAMS; ++i) sums[i] = 0.0f;
#ifdef GPTKIT_FLOAT_VECTORS
    constexpr int L = FVEC_LANES;
    fvec a[STREAMS], b[STREAMS];
    for (int i = 0; i < STREAMS; ++i) a[i] = b[i] = fvec_zero();
    for (; k + 2 * L <= n; k += 2 * L) {
        const fvec x0 = lanes(x + k), x1 = lanes(x + k + L);
        for (int i = 0; i < STREAMS; ++i) {
            a[i] = fvec_fma(lanes(w[i] + k), x0, a[i]);
            b[i] = fvec_fma(lanes(w[i] + k + L), x1, b[i]);
        }
    }
    for (int i = 0; i < STREAMS; ++i) sums[i] = fvec_sum(fvec_add(a[i], b[i]));
#endif
    for (; k < n; ++k)
        for (int i = 0; i < STREAMS; ++i) sums[i] += widen(w[i][k]) * x[k];
}

// Where row i of part j of a band [begin, end) split into STREAMS parts is (the rest: `rest`).
inline int part_row(int begin, int end, int i, int j) { return begin + j * ((end - begin) / STREAMS) + i; }
inline int parts_rest(int begin, int end) { return begin + STREAMS * ((end - begin) / STREAMS); }

template <typename Weight>
void product_float(const Matrix& m, const float* x, int rows, float* y, Epilogue epilogue, int begin, int end) {
    const Weight* weight = static_cast<const Weight*>(m.weight);
    const int out = m.out, in = m.in;
    auto write = [&](int r, int n, float sum) {
        const float v = sum + (m.bias ? m.bias[n] : 0.0f);
        float& target = y[size_t(r) * out + n];
        target = epilogue == ADD ? target + v : v;
    };
    if (rows == 1) {  // decoding one sequence: the band as STREAMS streams
        for (int i = 0; i < (end - begin) / STREAMS; ++i) {
            const Weight* w[STREAMS];
            float sums[STREAMS];
            for (int j = 0; j < STREAMS; ++j) w[j] = weight + size_t(part_row(begin, end, i, j)) * in;
            dot_rows<Weight>(w, x, in, sums);
            for (int j = 0; j < STREAMS; ++j) write(0, part_row(begin, end, i, j), sums[j]);
        }
        begin = parts_rest(begin, end);
    }
    for (int n = begin; n < end; ++n) {
        const Weight* w = weight + size_t(n) * in;
        for (int r = 0; r < rows; ++r) write(r, n, dot<Weight>(w, x + size_t(r) * in, in));  // W's row in L1
    }
}

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

// An int8 product's input: every row quantized, with its scale and zero point.
struct QuantizedRows {
    std::vector<uint8_t> values;
    std::vector<Quantized> params;

    void quantize(const float* x, int rows, int in, int threads = 1) {
        values.resize(size_t(rows) * in);
        params.resize(rows);
        // A prompt's rows on every core (called by one thread of a step's team, a few rows: not).
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows >= TILE)
        for (int r = 0; r < rows; ++r) params[r] = quantize_row(x + size_t(r) * in, in, &values[size_t(r) * in]);
    }
};

// Σ scale_x·(q_x - z)·scale_w·q_w = scale_x·scale_w·(Σ q_x·q_w - z·Σ q_w), plus the bias.
inline void write_int8(const Matrix& m, const QuantizedRows& x, int r, int n, int32_t sum, float* y, Epilogue epilogue) {
    const Quantized& p = x.params[r];
    const float v = (m.bias ? m.bias[n] : 0.0f) + float(sum - p.zero_point * m.row_sum[n]) * (p.scale * m.scale[n]);
    float& target = y[size_t(r) * m.out + n];
    target = epilogue == ADD ? target + v : v;
}

// A few rows (decoding): each weight row read once for all of them.
void product_int8(const Matrix& m, const QuantizedRows& x, int rows, float* y, Epilogue epilogue, int begin, int end) {
    const int8_t* weight = static_cast<const int8_t*>(m.weight);
    const uint8_t* q = x.values.data();
    if (rows == 1) {  // decoding one sequence: the band as STREAMS streams
        for (int i = 0; i < (end - begin) / STREAMS; ++i) {
            const int8_t* w[STREAMS];
            int32_t sums[STREAMS];
            for (int j = 0; j < STREAMS; ++j) w[j] = weight + size_t(part_row(begin, end, i, j)) * m.in;
            dot_u8s8<STREAMS, 1>(w, &q, m.in, sums);
            for (int j = 0; j < STREAMS; ++j) write_int8(m, x, 0, part_row(begin, end, i, j), sums[j], y, epilogue);
        }
        begin = parts_rest(begin, end);
    }
    for (int n = begin; n < end; ++n)
        for (int r = 0; r < rows; ++r)
            write_int8(m, x, r, n, dot_u8s8(weight + size_t(n) * m.in, q + size_t(r) * m.in, m.in), y, epilogue);
}

// Rows of activations taken together by the product of many rows: their integers (64 rows of
// 3,072 bytes) stay in the core's cache while the weights stream past them.
constexpr int ROW_BLOCK = 64;

// Many rows (a prompt): two weight rows against TILE activation rows at a time.
void product_int8_tiled(const Matrix& m, const QuantizedRows& x, int rows, float* y, int threads) {
    const int8_t* weight = static_cast<const int8_t*>(m.weight);
    const int out = m.out, in = m.in;
    const uint8_t* q = x.values.data();
    for (int first = 0; first < rows; first += ROW_BLOCK) {
        const int last = std::min(first + ROW_BLOCK, rows);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int pair = 0; pair < (out + 1) / 2; ++pair) {
            const int n0 = 2 * pair, n1 = std::min(n0 + 1, out - 1);  // an odd last row pairs with itself
            const int8_t* w[2] = {weight + size_t(n0) * in, weight + size_t(n1) * in};
            int r = first;
            for (; r + TILE <= last; r += TILE) {
                const uint8_t* xs[TILE];
                for (int i = 0; i < TILE; ++i) xs[i] = q + size_t(r + i) * in;
                int32_t sums[2 * TILE];
                dot_u8s8<2, TILE>(w, xs, in, sums);
                for (int i = 0; i < TILE; ++i) {
                    write_int8(m, x, r + i, n0, sums[i], y, STORE);
                    if (n1 != n0) write_int8(m, x, r + i, n1, sums[TILE + i], y, STORE);
                }
            }
            for (; r < last; ++r) {
                const uint8_t* xr = q + size_t(r) * in;
                int32_t sums[2];
                dot_u8s8<2, 1>(w, &xr, in, sums);
                write_int8(m, x, r, n0, sums[0], y, STORE);
                if (n1 != n0) write_int8(m, x, r, n1, sums[1], y, STORE);
            }
        }
    }
}

}  // namespace
