// Element-wise functions and the LayerNorm, written without library calls so that the compiler
// vectorizes the loops. Part of decode_step.cpp's one translation unit.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "vectors.h"

namespace {

// e^x to about 1e-7 relative (Cody-Waite range reduction, a degree-6 polynomial, the exponent set by
// integer arithmetic), for x in [-87, 88].
inline float exp_approx(float x) {
    x = std::min(std::max(x, -87.0f), 88.0f);
    const float n = __builtin_rintf(x * 1.44269504088896341f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = (int32_t(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

inline float gelu_tanh(float x) {
    // 0.5·x·(1 + tanh(u)) = x·(1 - 1/(e^{2u} + 1)), u = √(2/π)·(x + 0.044715·x³)
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x - x / (exp_approx(2.0f * u) + 1.0f);
}

inline float gelu_erf(float x) {
    // 0.5·x·(1 + erf(x/√2)), erf to 1.5e-7 (Abramowitz and Stegun 7.1.26)
    const float z = std::fabs(x) * 0.7071067811865476f;
    const float t = 1.0f / (1.0f + 0.3275911f * z);
    const float poly =
        t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    float erf_abs = 1.0f - poly * exp_approx(-z * z);
    const float erf = x < 0.0f ? -erf_abs : erf_abs;
    return 0.5f * x * (1.0f + erf);
}

#ifdef GPTKIT_FLOAT_VECTORS
// exp_approx and gelu_tanh on a vector: the same steps, each lane's number within 1e-7 of theirs.
inline fvec fvec_exp_approx(fvec x) {
    x = fvec_clamp(x, -87.0f, 88.0f);
    const fvec n = fvec_rint(fvec_mul(x, fvec_set1(1.44269504088896341f)));
    const fvec r = fvec_fma(n, fvec_set1(2.12194440e-4f), fvec_fma(n, fvec_set1(-0.693359375f), x));
    fvec p = fvec_set1(1.9875691500e-4f);
    p = fvec_fma(p, r, fvec_set1(1.3981999507e-3f));
    p = fvec_fma(p, r, fvec_set1(8.3334519073e-3f));
    p = fvec_fma(p, r, fvec_set1(4.1665795894e-2f));
    p = fvec_fma(p, r, fvec_set1(1.6666665459e-1f));
    p = fvec_fma(p, r, fvec_set1(5.0000001201e-1f));
    p = fvec_add(fvec_fma(fvec_mul(p, r), r, r), fvec_set1(1.0f));
    return fvec_mul(p, fvec_exp2_int(n));
}

inline fvec fvec_gelu_tanh(fvec x) {
    const fvec cube = fvec_mul(fvec_mul(x, x), x);
    const fvec u = fvec_mul(fvec_set1(0.7978845608028654f), fvec_fma(cube, fvec_set1(0.044715f), x));
    const fvec e = fvec_exp_approx(fvec_add(u, u));
    return fvec_sub(x, fvec_div(x, fvec_add(e, fvec_set1(1.0f))));
}
#endif

void activate(float* y, int n, int activation) {
    if (activation == 0) {
#pragma omp simd
        for (int i = 0; i < n; ++i) y[i] = gelu_tanh(y[i]);
    } else if (activation == 1) {
#pragma omp simd
        for (int i = 0; i < n; ++i) y[i] = gelu_erf(y[i]);
    } else {
#pragma omp simd
        for (int i = 0; i < n; ++i) y[i] = std::max(y[i], 0.0f);
    }
}

void layer_norm(const float* x, float* y, int n, const float* gain, const float* bias, float eps) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; ++i) sum += x[i];
    const float mean = sum / n;
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int i = 0; i < n; ++i) squares += (x[i] - mean) * (x[i] - mean);
    const float inv_std = 1.0f / std::sqrt(squares / n + eps);
#pragma omp simd
    for (int i = 0; i < n; ++i) y[i] = (x[i] - mean) * inv_std * gain[i] + bias[i];
}

}  // namespace
