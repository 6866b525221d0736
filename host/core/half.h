/* Half-precision conversions, written once (core/half.c). f16/bf16 -> f32 is exact (both
 * are subsets of f32); f32 -> f16/bf16 rounds to nearest even, NaN stays a quiet NaN and
 * f16 overflow becomes infinity. */
#ifndef MK_CORE_HALF_H
#define MK_CORE_HALF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

uint16_t mk_f32_to_f16(float f);
float mk_f16_to_f32(uint16_t h);
uint16_t mk_f32_to_bf16(float f);
float mk_bf16_to_f32(uint16_t b);

#ifdef __cplusplus
}
#endif
#endif
