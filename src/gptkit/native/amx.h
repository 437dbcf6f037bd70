// Products on the CPU's matrix units (Intel AMX), where the compiler targets them and the kernel
// lets this process use them: bf16 and int8 panels multiplied a tile at a time. Part of
// decode_step.cpp's one translation unit, included by panels.h.
//
// A tile holds 16 rows of 64 bytes. The packed panels are already tiles: 16 groups of a panel
// (32 bf16 inputs or 64 int8 inputs of its 16 outputs, interface.h) are one weight tile; 64 bytes
// of 16 staged rows of activations are one activation tile; one instruction multiplies them into
// 16 × 16 fp32 (or int32) sums, 8,192 multiply-adds where the vector units do 512. A block is up
// to 32 rows × 2 panels: 4 tiles of sums, 2 of activations, 2 of weights, the 8 tiles there are.
// Each output's sum runs over its inputs in the same order, whatever the rows beside it.

#pragma once

#include <cstdint>
#include <cstring>

#include "interface.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AMX_INT8__) && defined(__linux__)
#define GPTKIT_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

// Linux lends a process the tiles' 8 KB of state only when asked (arch_prctl), once.
bool amx_usable() {
    static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return granted;
}

// The tiles' shapes for a block of `rows` rows (LDTILECFG's 64-byte layout), kept per thread so
// that a block of the same rows as the last needs no new configuration.
struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

thread_local int configured_rows = -1;

void configure_tiles(int rows) {
    if (rows == configured_rows) return;
    const int first = rows < 16 ? rows : 16, second = rows - first;
    TileConfig config;
    for (int t = 0; t < 8; ++t) config.colsb[t] = 64;
    config.rows[0] = config.rows[1] = config.rows[4] = uint8_t(first);  // sums, activations: rows 0-15
    config.rows[2] = config.rows[3] = config.rows[5] = uint8_t(second);  // rows 16-31 (none: unused)
    config.rows[6] = config.rows[7] = 16;                                // weights: 16 groups
    if (!second) config.colsb[2] = config.colsb[3] = config.colsb[5] = 0;
    _tile_loadconfig(&config);
    configured_rows = rows;
}

// The tiles given back after a product (a thread holding them costs every context switch 8 KB).
void release_tiles() {
    if (configured_rows < 0) return;
    _tile_release();
    configured_rows = -1;
}

// The block of `rows` rows from r0 (at most 32) × `np` panels from p0 (1 or 2): sums over every
// 16 groups of inputs by the matrix units, then written as the vector kernels write theirs.
template <bool Int8>
void amx_block(const Product& p, int r0, int rows, int p0, int np) {
    configure_tiles(rows);
    const size_t stride = size_t(p.groups) * 4;  // bytes of a staged row
    const char* x = reinterpret_cast<const char*>(p.packed_row(r0));
    const char* w = static_cast<const char*>(p.m.weight) + size_t(p0) * p.panel_stride() * 4;
    const size_t panel = p.panel_stride() * 4;
    const bool second = rows > 16, two = np > 1;
    _tile_zero(0);
    _tile_zero(1);
    if (second) {  // an unconfigured tile is an illegal instruction's operand
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int g = 0; g < p.groups; g += 16) {
        _tile_loadd(4, x + g * 4, stride);
        _tile_loadd(6, w + size_t(g) * 64, 64);
        if (two) _tile_loadd(7, w + panel + size_t(g) * 64, 64);
        if (second) _tile_loadd(5, x + 16 * stride + g * 4, stride);
        if constexpr (Int8) {
            _tile_dpbusd(0, 4, 6);
            if (two) _tile_dpbusd(1, 4, 7);
            if (second) _tile_dpbusd(2, 5, 6);
            if (second && two) _tile_dpbusd(3, 5, 7);
        } else {
            _tile_dpbf16ps(0, 4, 6);
            if (two) _tile_dpbf16ps(1, 4, 7);
            if (second) _tile_dpbf16ps(2, 5, 6);
            if (second && two) _tile_dpbf16ps(3, 5, 7);
        }
    }
    alignas(64) int32_t sums[4][16 * PANEL];  // fp32 bits for bf16
    _tile_stored(0, sums[0], 64);
    if (two) _tile_stored(1, sums[1], 64);
    if (second) _tile_stored(2, sums[2], 64);
    if (second && two) _tile_stored(3, sums[3], 64);
    for (int r = 0; r < rows; ++r)
        for (int j = 0; j < np; ++j) {
            int32_t* row = sums[(r >= 16) * 2 + j] + (r % 16) * PANEL;
            if constexpr (Int8) {
                write_int_sums(p, r0 + r, (p0 + j) * PANEL, row);
            } else {
                float values[PANEL];
                std::memcpy(values, row, sizeof values);
                write_sums(p, r0 + r, (p0 + j) * PANEL, values);
            }
        }
}

// Panels [begin, end) of a bf16 or int8 product on the matrix units.
template <bool Int8>
void amx_panels(const Product& p, int begin, int end) {
    for (int p0 = begin; p0 < end; p0 += 2)
        for (int r0 = 0; r0 < p.rows; r0 += 32) {
            const int rows = p.rows - r0 < 32 ? p.rows - r0 : 32;
            amx_block<Int8>(p, r0, rows, p0, end - p0 < 2 ? 1 : 2);
        }
    release_tiles();
}

}  // namespace
#endif
