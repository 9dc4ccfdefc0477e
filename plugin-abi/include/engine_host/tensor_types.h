/*
 * Facts about eh_tensor_type: name, elements per block, bytes per block.
 * Shared by the host (to validate tensor sizes in model files) and by plugins
 * (to walk quantized weights). Values follow the ggml block layouts.
 */
#ifndef ENGINE_HOST_TENSOR_TYPES_H
#define ENGINE_HOST_TENSOR_TYPES_H

#include "plugin_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct eh_type_traits {
    const char* name;       /* "Q4_K"; NULL for an id no one has defined     */
    uint32_t block_elems;   /* elements per block (1 for plain types)        */
    uint32_t block_bytes;   /* bytes per block; 0 = unknown type             */
} eh_type_traits;

static inline eh_type_traits eh_tensor_type_traits(uint32_t type) {
    eh_type_traits t = {NULL, 0, 0};
    switch (type) {
    case EH_TYPE_F32: t.name = "F32"; t.block_elems = 1; t.block_bytes = 4; break;
    case EH_TYPE_F16: t.name = "F16"; t.block_elems = 1; t.block_bytes = 2; break;
    case EH_TYPE_Q4_0: t.name = "Q4_0"; t.block_elems = 32; t.block_bytes = 18; break;
    case EH_TYPE_Q4_1: t.name = "Q4_1"; t.block_elems = 32; t.block_bytes = 20; break;
    case EH_TYPE_Q5_0: t.name = "Q5_0"; t.block_elems = 32; t.block_bytes = 22; break;
    case EH_TYPE_Q5_1: t.name = "Q5_1"; t.block_elems = 32; t.block_bytes = 24; break;
    case EH_TYPE_Q8_0: t.name = "Q8_0"; t.block_elems = 32; t.block_bytes = 34; break;
    case EH_TYPE_Q8_1: t.name = "Q8_1"; t.block_elems = 32; t.block_bytes = 36; break;
    case EH_TYPE_Q2_K: t.name = "Q2_K"; t.block_elems = 256; t.block_bytes = 84; break;
    case EH_TYPE_Q3_K: t.name = "Q3_K"; t.block_elems = 256; t.block_bytes = 110; break;
    case EH_TYPE_Q4_K: t.name = "Q4_K"; t.block_elems = 256; t.block_bytes = 144; break;
    case EH_TYPE_Q5_K: t.name = "Q5_K"; t.block_elems = 256; t.block_bytes = 176; break;
    case EH_TYPE_Q6_K: t.name = "Q6_K"; t.block_elems = 256; t.block_bytes = 210; break;
    case EH_TYPE_Q8_K: t.name = "Q8_K"; t.block_elems = 256; t.block_bytes = 292; break;
    case EH_TYPE_IQ2_XXS: t.name = "IQ2_XXS"; t.block_elems = 256; t.block_bytes = 66; break;
    case EH_TYPE_IQ2_XS: t.name = "IQ2_XS"; t.block_elems = 256; t.block_bytes = 74; break;
    case EH_TYPE_IQ3_XXS: t.name = "IQ3_XXS"; t.block_elems = 256; t.block_bytes = 98; break;
    case EH_TYPE_IQ1_S: t.name = "IQ1_S"; t.block_elems = 256; t.block_bytes = 50; break;
    case EH_TYPE_IQ4_NL: t.name = "IQ4_NL"; t.block_elems = 32; t.block_bytes = 18; break;
    case EH_TYPE_IQ3_S: t.name = "IQ3_S"; t.block_elems = 256; t.block_bytes = 110; break;
    case EH_TYPE_IQ2_S: t.name = "IQ2_S"; t.block_elems = 256; t.block_bytes = 82; break;
    case EH_TYPE_IQ4_XS: t.name = "IQ4_XS"; t.block_elems = 256; t.block_bytes = 136; break;
    case EH_TYPE_I8: t.name = "I8"; t.block_elems = 1; t.block_bytes = 1; break;
    case EH_TYPE_I16: t.name = "I16"; t.block_elems = 1; t.block_bytes = 2; break;
    case EH_TYPE_I32: t.name = "I32"; t.block_elems = 1; t.block_bytes = 4; break;
    case EH_TYPE_I64: t.name = "I64"; t.block_elems = 1; t.block_bytes = 8; break;
    case EH_TYPE_F64: t.name = "F64"; t.block_elems = 1; t.block_bytes = 8; break;
    case EH_TYPE_IQ1_M: t.name = "IQ1_M"; t.block_elems = 256; t.block_bytes = 56; break;
    case EH_TYPE_BF16: t.name = "BF16"; t.block_elems = 1; t.block_bytes = 2; break;
    case EH_TYPE_TQ1_0: t.name = "TQ1_0"; t.block_elems = 256; t.block_bytes = 54; break;
    case EH_TYPE_TQ2_0: t.name = "TQ2_0"; t.block_elems = 256; t.block_bytes = 66; break;
    case EH_TYPE_MXFP4: t.name = "MXFP4"; t.block_elems = 32; t.block_bytes = 17; break;
    case EH_TYPE_U8: t.name = "U8"; t.block_elems = 1; t.block_bytes = 1; break;
    case EH_TYPE_FP8_E4M3: t.name = "FP8_E4M3"; t.block_elems = 32; t.block_bytes = 34; break;
    default: break;
    }
    return t;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ENGINE_HOST_TENSOR_TYPES_H */
