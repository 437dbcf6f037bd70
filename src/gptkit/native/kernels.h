// The register blocks of the panel products (panels.h): one kernel a format and vector unit, each a
// block of NR rows × NP panels whose sums stay in registers over a span of the inputs. R and P are
// the largest block a kernel takes: as many sums as the vector registers hold beside the weights
// loaded for one step. Part of decode_step.cpp's one translation unit, included by panels.h.
//
// A product of a few more rows than a block runs its inputs in chunks (CHUNK groups): every block of
// rows takes a chunk while its weights (16 KB) are in the core's first-level cache, its sums kept in
// `partial` between chunks, so that the weights come from memory once per chunk rather than once
// per block of rows from the second-level cache. An output's sum still runs over its inputs in
// order, the same whatever the rows beside it.

#pragma once

#include <cstdint>
#include <vector>

#include "interface.h"
#include "vectors.h"

namespace {

constexpr int CHUNK = 64;  // groups of inputs a block takes before the next block of rows
// Products of at most this many rows run in chunks: where the weights' stream from memory bounds
// them (16 rows of GPT-2 small, fp32: a step 4% faster, alternating); more rows are bound by the
// multiplications, and 640 ran 5% slower in chunks.
constexpr int CHUNKED_ROWS = 32;

// A block's part of the work: rows from r0, panels from p0, groups [k0, k1). Its sums start at
// zero (first) or from `partial`, and end written (last) or back in `partial`: this thread's sums
// of the panel group, P · 16 a row, from the block's first row.
struct Span {
    int r0, p0, k0, k1;
    bool first, last;
    float* partial;
};

// The sums of this thread's panel group between chunks (fp32 or int32, 4 bytes each).
thread_local std::vector<float> partial_sums;

#ifdef GPTKIT_FLOAT_VECTORS
constexpr int FVECS = PANEL / FVEC_LANES;  // vectors of a panel's 16 sums
constexpr bool WIDE = FVEC_LANES == 16;      // 32 registers (AVX-512) rather than 16 (AVX2)

// A block's fp32 sums: zero or from `partial` as the span starts; written or kept as it ends.
template <int P, int NR, int NP>
inline void start_sums(fvec (&acc)[NR][NP][FVECS], const Span& s) {
    for (int r = 0; r < NR; ++r)
        for (int j = 0; j < NP; ++j)
            for (int v = 0; v < FVECS; ++v)
                acc[r][j][v] = s.first ? fvec_zero() : lanes(s.partial + (r * P + j) * PANEL + v * FVEC_LANES);
}

template <int P, int NR, int NP>
inline void end_sums(const Product& p, fvec (&acc)[NR][NP][FVECS], const Span& s) {
    float sums[PANEL];
    for (int r = 0; r < NR; ++r)
        for (int j = 0; j < NP; ++j) {
            float* out = s.last ? sums : s.partial + (r * P + j) * PANEL;
            for (int v = 0; v < FVECS; ++v) fvec_store(out + v * FVEC_LANES, acc[r][j][v]);
            if (s.last) write_sums(p, s.r0 + r, (s.p0 + j) * PANEL, sums);
        }
}

// fp32: each input broadcast against P panels' 16 weights.
struct Fp32Panels {
    static constexpr int R = WIDE ? 6 : 2, P = WIDE ? 4 : 2;
    static constexpr bool CHUNKED = true;
    const Product& p;

    template <int NR, int NP>
    void block(const Span& s) const {
        const float* w = static_cast<const float*>(p.m.weight) + size_t(s.p0) * p.panel_stride();
        const float* x[NR];
        for (int r = 0; r < NR; ++r) x[r] = p.x + size_t(s.r0 + r) * p.m.in;
        fvec acc[NR][NP][FVECS];
        start_sums<P>(acc, s);
        for (int k = s.k0; k < s.k1; ++k) {
            fvec wv[NP][FVECS];
            for (int j = 0; j < NP; ++j)
                for (int v = 0; v < FVECS; ++v) wv[j][v] = lanes(w + j * p.panel_stride() + k * PANEL + v * FVEC_LANES);
            for (int r = 0; r < NR; ++r) {
                const fvec xb = fvec_set1(x[r][k]);
                for (int j = 0; j < NP; ++j)
                    for (int v = 0; v < FVECS; ++v) acc[r][j][v] = fvec_fma(xb, wv[j][v], acc[r][j][v]);
            }
        }
        end_sums<P>(p, acc, s);
    }
};

// bf16 without the CPU's bf16 dot product: each pair of weights widened to two fp32 vectors, the
// odd products added first, as the bf16 units do.
struct Bf16WidePanels {
    static constexpr int R = WIDE ? 4 : 3, P = WIDE ? 4 : 1;
    static constexpr bool CHUNKED = true;
    const Product& p;

    template <int NR, int NP>
    void block(const Span& s) const {
        const uint32_t* w = static_cast<const uint32_t*>(p.m.weight) + size_t(s.p0) * p.panel_stride();
        const uint32_t* x[NR];
        for (int r = 0; r < NR; ++r) x[r] = p.packed_row(s.r0 + r);
        fvec acc[NR][NP][FVECS];
        start_sums<P>(acc, s);
        for (int k = s.k0; k < s.k1; ++k) {
            fvec even[NP][FVECS], odd[NP][FVECS];
            for (int j = 0; j < NP; ++j)
                for (int v = 0; v < FVECS; ++v) {
                    const uint32_t* pairs = w + j * p.panel_stride() + k * PANEL + v * FVEC_LANES;
                    even[j][v] = bf16_even(pairs);
                    odd[j][v] = bf16_odd(pairs);
                }
            for (int r = 0; r < NR; ++r) {
                const fvec xe = fvec_set1(float_bits(x[r][k] << 16)), xo = fvec_set1(float_bits(x[r][k] & 0xffff0000u));
                for (int j = 0; j < NP; ++j)
                    for (int v = 0; v < FVECS; ++v)
                        acc[r][j][v] = fvec_fma(xe, even[j][v], fvec_fma(xo, odd[j][v], acc[r][j][v]));
            }
        }
        end_sums<P>(p, acc, s);
    }
};
#endif

#ifdef GPTKIT_BF16_DOT
// bf16 on the CPU's bf16 units: each pair of inputs broadcast against P panels' 16 pairs.
struct Bf16DotPanels {
    static constexpr int R = 6, P = 4;
    static constexpr bool CHUNKED = true;
    const Product& p;

    template <int NR, int NP>
    void block(const Span& s) const {
        const uint32_t* w = static_cast<const uint32_t*>(p.m.weight) + size_t(s.p0) * p.panel_stride();
        const uint32_t* x[NR];
        for (int r = 0; r < NR; ++r) x[r] = p.packed_row(s.r0 + r);
        fvec acc[NR][NP][FVECS];  // FVECS is 1: AVX-512
        start_sums<P>(acc, s);
        for (int k = s.k0; k < s.k1; ++k) {
            __m512i wv[NP];
            for (int j = 0; j < NP; ++j) wv[j] = _mm512_loadu_si512(w + j * p.panel_stride() + k * PANEL);
            for (int r = 0; r < NR; ++r) {
                const __m512i xb = _mm512_set1_epi32(int(x[r][k]));
                for (int j = 0; j < NP; ++j) acc[r][j][0] = bf16_dot(acc[r][j][0], xb, wv[j]);
            }
        }
        end_sums<P>(p, acc, s);
    }
};
#endif

#ifdef GPTKIT_INT_VECTORS
constexpr int IVECS = PANEL * 4 / IVEC_BYTES;  // vectors of a panel's 16 integer sums

// int8: each quad of 7-bit inputs broadcast against P panels' 16 quads of weights.
struct Int8Panels {
    static constexpr int R = IVECS == 1 ? 6 : 2, P = IVECS == 1 ? 4 : 2;
    static constexpr bool CHUNKED = true;
    const Product& p;

    template <int NR, int NP>
    void block(const Span& s) const {
        const int8_t* w = static_cast<const int8_t*>(p.m.weight) + size_t(s.p0) * p.panel_stride() * 4;
        const uint32_t* x[NR];
        for (int r = 0; r < NR; ++r) x[r] = p.packed_row(s.r0 + r);
        int32_t* partial = reinterpret_cast<int32_t*>(s.partial);  // 4 bytes a sum, as fp32's
        ivec acc[NR][NP][IVECS];
        for (int r = 0; r < NR; ++r)
            for (int j = 0; j < NP; ++j)
                for (int v = 0; v < IVECS; ++v)
                    acc[r][j][v] = s.first ? ivec_zero() : ivec_load(partial + (r * P + j) * PANEL + v * IVEC_BYTES / 4);
        for (int k = s.k0; k < s.k1; ++k) {
            ivec wv[NP][IVECS];
            for (int j = 0; j < NP; ++j)
                for (int v = 0; v < IVECS; ++v) wv[j][v] = ivec_load(w + (j * p.panel_stride() + k * PANEL) * 4 + v * IVEC_BYTES);
            for (int r = 0; r < NR; ++r) {
                const ivec xb = ivec_set1(x[r][k]);
                for (int j = 0; j < NP; ++j)
                    for (int v = 0; v < IVECS; ++v) acc[r][j][v] = ivec_dot(acc[r][j][v], xb, wv[j][v]);
            }
        }
        int32_t sums[PANEL];
        for (int r = 0; r < NR; ++r)
            for (int j = 0; j < NP; ++j) {
                int32_t* out = s.last ? sums : partial + (r * P + j) * PANEL;
                for (int v = 0; v < IVECS; ++v) ivec_store(out + v * IVEC_BYTES / 4, acc[r][j][v]);
                if (s.last) write_int_sums(p, s.r0 + r, (s.p0 + j) * PANEL, sums);
            }
    }
};
#endif

// Plain loops, a row and a panel at a time: what a build without vector code computes (the same
// sums in the same order as the vector kernels).
struct ScalarPanels {
    static constexpr int R = 1, P = 1;
    static constexpr bool CHUNKED = false;  // every row in one pass over the inputs
    const Product& p;
    int format;

    template <int NR, int NP>
    void block(const Span& s) const {  // always the whole inputs (one row: never in chunks)
        const int r = s.r0, panel = s.p0;
        float sums[PANEL] = {};
        int32_t integers[PANEL] = {};
        const size_t first = size_t(panel) * p.panel_stride();
        for (int k = 0; k < p.groups; ++k)
            for (int i = 0; i < PANEL; ++i) {
                const size_t at = first + size_t(k) * PANEL + i;
                if (format == FP32) {
                    sums[i] += p.x[size_t(r) * p.m.in + k] * static_cast<const float*>(p.m.weight)[at];
                } else if (format == BF16) {
                    const uint32_t x = p.packed_row(r)[k], w = static_cast<const uint32_t*>(p.m.weight)[at];
                    sums[i] += float_bits(x & 0xffff0000u) * float_bits(w & 0xffff0000u);
                    sums[i] += float_bits(x << 16) * float_bits(w << 16);
                } else {
                    const uint8_t* x = reinterpret_cast<const uint8_t*>(p.packed_row(r) + k);
                    const int8_t* w = static_cast<const int8_t*>(p.m.weight) + at * 4;
                    for (int b = 0; b < 4; ++b) integers[i] += int32_t(x[b]) * int32_t(w[b]);
                }
            }
        if (format == INT8)
            write_int_sums(p, r, panel * PANEL, integers);
        else
            write_sums(p, r, panel * PANEL, sums);
    }
};

}  // namespace
