/*
 * engine-host plugin ABI, version 1.7.
 *
 * This header is the whole contract between the engine-host process and an
 * engine plugin. It is plain C11 (usable from C++17 and later) and depends on
 * nothing but <stdint.h> and <stddef.h>. A plugin is a shared library that
 * exports one symbol, EH_PLUGIN_ENTRY_SYMBOL, returning a pointer to a
 * function table (eh_plugin_api). Everything else reaches the host through that
 * table.
 *
 * Versioning
 *   The table begins with struct_size, abi_major and abi_minor. The host
 *   accepts a plugin when abi_major equals the host's major and abi_minor is at
 *   least the minor the host needs. Minor versions only ever append members to
 *   the end of a struct; nothing is reordered, resized or removed. Every struct
 *   that crosses the boundary starts with a struct_size so that either side can
 *   tell which members the other knows about. Layout is pinned by static
 *   asserts in tests/loader/abi_layout_test.cpp.
 *
 * Ownership (read this before writing a plugin)
 *   - Strings and arrays the host passes in are owned by the host and valid
 *     only for the duration of the call, except the model view
 *     (eh_load_params.view), which stays valid until model_release returns.
 *   - Strings a plugin returns (plugin info, last-error messages) are owned by
 *     the plugin. Info strings live as long as the library is loaded. A
 *     last-error string stays valid until the next call on the same object
 *     from the same thread.
 *   - Last-error storage is per thread: a call's message is read on the
 *     thread that made the call, and a call on another thread never changes
 *     it (a plugin keeps it in thread-local storage, per object where the
 *     call has one).
 *   - Every object a plugin creates (eh_model, eh_session, eh_seq) has a
 *     release function, and the host calls it exactly once. The host never
 *     unloads a library while any object created by it is alive, and
 *     releases sessions and sequences before the model they belong to.
 *
 * Errors
 *   Every fallible call returns an eh_status. On failure, the plugin's message
 *   is read with model_last_error / session_last_error for calls on an object,
 *   or with plugin_last_error for calls that have none (probe, model_load).
 *   A plugin must catch every exception at its boundary: a C++ exception that
 *   crosses this ABI is a plugin bug. (The host still survives it and rejects
 *   the plugin, but no plugin may rely on that.)
 *
 * Threads
 *   probe, info and plugin_last_error may be called from any thread. One
 *   model may have several sessions; the host calls into one session from one
 *   thread at a time, and calls model_check_residency / model_get_info
 *   concurrently with session calls, so those two must be thread-safe.
 *   The batched calls of 1.2 and 1.3 (kv_init, kv_get_info, seq_*, step,
 *   step_begin, step_end) are made from one thread at a time per model (the
 *   host's scheduler); the host never mixes them with session calls on the
 *   same model.
 *
 * Two ways to run a model
 *   1.0/1.1: one sequence per eh_session; prefill/decode one session per call.
 *   1.2: sequences (eh_seq) whose KV cache lives in fixed-size blocks shared
 *   by all sequences of the model, and one call, step(), that runs one
 *   forward pass over many sequences at once: each entry appends a prefill
 *   chunk or one decode token to its sequence and may ask for a sampled
 *   token. The host decides what goes into every step (admission, fairness,
 *   preemption, prefix reuse); the plugin never guesses the next call. A
 *   host that speaks 1.2 drives 1.0/1.1 plugins one sequence at a time
 *   through the session calls, which stay required; so does it a 1.2
 *   plugin that leaves the batched members NULL.
 *   1.4: the batched step is the forward path. A plugin with the batched
 *   group may leave every session_* member NULL (all of them, or none); the
 *   host then runs everything, one sequence too (the chat command, bench,
 *   /execute), through seq_* and step. A plugin without the batched group
 *   still needs the session calls.
 *
 * Tokens, not text
 *   Plugins never see text. The host tokenizes and detokenizes; plugins take
 *   token ids and return sampled token ids. Sampling runs inside the plugin
 *   (on the device for GPU engines).
 */
#ifndef ENGINE_HOST_PLUGIN_ABI_H
#define ENGINE_HOST_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EH_ABI_MAJOR 1
#define EH_ABI_MINOR 8
/* History (members are only ever appended):
 *   1.0  first version
 *   1.1  eh_model_info.kv_bytes_per_token
 *   1.2  sequences, KV-cache blocks and the batched step (eh_plugin_api
 *        kv_init .. step, eh_step_entry); EH_KV_FULL;
 *        eh_sampling_params.presence_penalty / frequency_penalty
 *   1.3  a step in two halves, so the next can start before the host has
 *        read this one's tokens (eh_plugin_api step_begin, step_end);
 *        EH_STEP_CHAINED
 *   1.4  the step is the forward path: a plugin with the batched group may
 *        leave every session_* member NULL; EH_NO_CAPACITY and EH_BUSY;
 *        the KV cache's element type (eh_kv_params.kv_type asks,
 *        eh_kv_info.kv_type says what was granted); EH_TYPE_FP8_E4M3
 *   1.5  the final hidden state of a step entry's last position, for
 *        embeddings and rerank scores (EH_STEP_HIDDEN, eh_plugin_api
 *        seq_hidden, optional)
 *   1.6  speculative decoding: a step entry verifies draft tokens
 *        (EH_STEP_VERIFY, eh_step_entry.n_accepted, eh_kv_info.
 *        max_draft_tokens; optional);
 *        LoRA adapters: eh_adapter, eh_adapter_params, eh_plugin_api
 *        adapter_load, adapter_release, seq_set_adapter (optional);
 *        a load spans a set of devices (eh_load_params.n_devices /
 *        devices: tensor parallelism, or several shards on one GPU) and a
 *        plugin says how many it can use (eh_plugin_info.max_devices)
 *   1.7  a host-memory tier for cached prefixes: a sequence's KV parked in
 *        host memory and brought back by copy (eh_parked, eh_plugin_api
 *        seq_park, seq_unpark, parked_release; optional)
 *   1.8  images of any size and positions on a grid (Qwen2.5-VL): an
 *        encoder that takes each image at its own size (eh_image_encoder_
 *        info.tile, min_tokens, max_tokens; eh_plugin_api
 *        image_encode_sized) and an image's span laid out as rows and
 *        columns (EH_SPAN_GRID, eh_embd_span.grid_width, which was
 *        reserved)                                                        */

/* The one symbol a plugin exports. Its type is eh_plugin_entry_fn. */
#define EH_PLUGIN_ENTRY_SYMBOL "eh_plugin_entry"

#if defined(_WIN32)
#define EH_PLUGIN_EXPORT __declspec(dllexport)
#else
#define EH_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------ */
/* Status codes. Stable: values are never renumbered.                        */

typedef enum eh_status {
    EH_OK = 0,
    EH_INVALID_ARGUMENT = 1,   /* caller passed something out of range      */
    EH_UNSUPPORTED = 2,        /* plugin cannot do this (arch, type, device) */
    EH_MODEL_LOAD_FAILED = 3,  /* model data malformed or inconsistent       */
    EH_INSUFFICIENT_VRAM = 4,  /* not enough device memory to load at all    */
    EH_VRAM_OOM = 5,           /* allocation failed during a request         */
    EH_CUDA_ERROR = 6,         /* a device API failed                        */
    EH_CANCELLED = 7,          /* the cancel callback asked to stop          */
    EH_CONTEXT_FULL = 8,       /* the session has no room for more tokens    */
    EH_INTERNAL = 9,           /* anything else; always a bug somewhere      */
    EH_KV_FULL = 10,           /* (1.2) a step needs more free KV blocks than
                                  there are; nothing was changed             */
    EH_NO_CAPACITY = 11,       /* (1.4) no room for another sequence:
                                  max_seqs are alive (seq_create, seq_fork)  */
    EH_BUSY = 12               /* (1.4) not now: a step is in flight (a call
                                  1.3 allows only between steps)             */
} eh_status;

/* ------------------------------------------------------------------------ */
/* Tensor element types. Numbering follows ggml's enum so that a GGUF file's
 * type ids map straight across; safetensors dtypes map onto the float types
 * and the integer types. Names, block sizes and bytes per block are in
 * tensor_types.h; block layouts (for C++ authors) in quant_blocks.hpp.                   */

typedef enum eh_tensor_type {
    EH_TYPE_F32 = 0,
    EH_TYPE_F16 = 1,
    EH_TYPE_Q4_0 = 2,
    EH_TYPE_Q4_1 = 3,
    EH_TYPE_Q5_0 = 6,
    EH_TYPE_Q5_1 = 7,
    EH_TYPE_Q8_0 = 8,
    EH_TYPE_Q8_1 = 9,
    EH_TYPE_Q2_K = 10,
    EH_TYPE_Q3_K = 11,
    EH_TYPE_Q4_K = 12,
    EH_TYPE_Q5_K = 13,
    EH_TYPE_Q6_K = 14,
    EH_TYPE_Q8_K = 15,
    EH_TYPE_IQ2_XXS = 16,
    EH_TYPE_IQ2_XS = 17,
    EH_TYPE_IQ3_XXS = 18,
    EH_TYPE_IQ1_S = 19,
    EH_TYPE_IQ4_NL = 20,
    EH_TYPE_IQ3_S = 21,
    EH_TYPE_IQ2_S = 22,
    EH_TYPE_IQ4_XS = 23,
    EH_TYPE_I8 = 24,
    EH_TYPE_I16 = 25,
    EH_TYPE_I32 = 26,
    EH_TYPE_I64 = 27,
    EH_TYPE_F64 = 28,
    EH_TYPE_IQ1_M = 29,
    EH_TYPE_BF16 = 30,
    EH_TYPE_TQ1_0 = 34,
    EH_TYPE_TQ2_0 = 35,
    EH_TYPE_MXFP4 = 39,
    /* Not in ggml: raw bytes (safetensors U8), e.g. MXFP4 blocks/scales that a
     * Hugging Face checkpoint stores as separate tensors. */
    EH_TYPE_U8 = 1000,
    /* Not in ggml (1.4, a KV-cache type): blocks of 32 FP8 E4M3 values after
     * one f16 scale d, 34 bytes like Q8_0; value = d * e4m3(q). E4M3 is OCP
     * FP8's: sign, 4 exponent bits (bias 7), 3 mantissa bits, no infinities,
     * 0x7F / 0xFF are NaN, largest finite 448 (so d = amax / 448). Layout:
     * block_fp8_e4m3 in quant_blocks.hpp. */
    EH_TYPE_FP8_E4M3 = 1001
} eh_tensor_type;

/* ------------------------------------------------------------------------ */
/* The host-parsed model view. The host opens the model file (GGUF, or a
 * Hugging Face safetensors directory), maps it read-only, and hands the
 * plugin this description. Plugins need no file parser of their own.        */

typedef enum eh_model_format {
    EH_FORMAT_GGUF = 1,
    EH_FORMAT_SAFETENSORS = 2 /* a Hugging Face model directory */
} eh_model_format;

typedef enum eh_value_type {
    EH_VALUE_U8 = 0,
    EH_VALUE_I8 = 1,
    EH_VALUE_U16 = 2,
    EH_VALUE_I16 = 3,
    EH_VALUE_U32 = 4,
    EH_VALUE_I32 = 5,
    EH_VALUE_F32 = 6,
    EH_VALUE_BOOL = 7,
    EH_VALUE_STRING = 8,
    EH_VALUE_ARRAY = 9,
    EH_VALUE_U64 = 10,
    EH_VALUE_I64 = 11,
    EH_VALUE_F64 = 12
} eh_value_type; /* numbering follows GGUF's metadata value types */

/* Strings in the view are NUL-terminated and also carry their length, since
 * GGUF strings may legally contain NUL bytes (vocabulary entries do). */
typedef struct eh_string {
    const char* data;
    uint64_t size;
} eh_string;

/* One metadata value. Scalars are widened into u64 / i64 / f64 (bool and
 * unsigned types into u64, signed into i64, floats into f64). Arrays point
 * to `count` elements stored contiguously and naturally aligned in their
 * element type: uint8_t .. double for numbers, uint8_t for bool, eh_string for
 * strings, and eh_value for nested arrays. */
typedef struct eh_value {
    uint32_t type;      /* eh_value_type                                   */
    uint32_t elem_type; /* eh_value_type of the elements when type==ARRAY  */
    uint64_t count;     /* number of elements when type==ARRAY, else 1     */
    union {
        uint64_t u64;
        int64_t i64;
        double f64;
        eh_string str;
        const void* array;
    } v;
} eh_value;

typedef struct eh_metadata_kv {
    eh_string key;
    eh_value value;
} eh_metadata_kv;

#define EH_MAX_DIMS 4

/* One tensor. dims follow ggml order: dims[0] is the innermost (contiguous)
 * dimension, so a weight matrix of shape [out, in] in PyTorch has
 * dims = {in, out}. Unused dims are 1. `data` points into the host's
 * read-only mapping of the file; it is aligned as the file aligns it (GGUF:
 * general.alignment, default 32; safetensors: 8 bytes at best). */
typedef struct eh_tensor {
    eh_string name;
    uint32_t type;                /* eh_tensor_type */
    uint32_t n_dims;              /* 1..EH_MAX_DIMS */
    uint64_t dims[EH_MAX_DIMS];
    const void* data;
    uint64_t nbytes;
} eh_tensor;

typedef struct eh_model_view {
    uint32_t struct_size;
    uint32_t format;              /* eh_model_format */
    eh_string architecture;       /* "llama", "qwen2", "phi3", "gpt2", "gpt-oss", ... */
    /* Metadata uses GGUF key names for every format: for a Hugging Face
     * directory the host translates config.json into the keys a GGUF of the
     * same model would carry (e.g. "qwen2.block_count"), and tensor names into
     * GGUF names. Keys the host could not translate keep a "hf." prefix. */
    uint64_t n_metadata;
    const eh_metadata_kv* metadata;
    uint64_t n_tensors;
    const eh_tensor* tensors;
} eh_model_view;

/* ------------------------------------------------------------------------ */
/* Self-description. Must agree with the manifest shipped beside the library;
 * the host rejects the plugin otherwise. Lists are NULL-terminated arrays of
 * NUL-terminated strings. Everything here is owned by the plugin and lives
 * as long as the library stays loaded. */

typedef enum eh_device_kind {
    EH_DEVICE_CPU = 1,
    EH_DEVICE_CUDA = 2
} eh_device_kind;

typedef struct eh_plugin_info {
    uint32_t struct_size;
    const char* name;              /* "llama-cuda"; matches manifest "name"    */
    const char* version;           /* semantic version; manifest "version"     */
    const char* engine;            /* engine id; manifest "engine"             */
    const char* const* formats;        /* "gguf", "safetensors"                */
    const char* const* architectures;  /* "llama", "qwen2", ...                */
    const char* const* quant_kinds;    /* tensor type names: "Q4_K", "F16", ... */
    uint32_t device_kind;          /* eh_device_kind                           */
    uint32_t min_compute_capability; /* CUDA only, e.g. 80 for sm_80; else 0   */
    /* since 1.6: read only when struct_size >= 72 (a 1.5 plugin's info is
     * 64 bytes; the host takes that as max_devices 1) */
    uint32_t max_devices;          /* the most devices one load may span
                                      (eh_load_params.devices): 0 or 1 = one
                                      device only, and the host never names
                                      more for this plugin                   */
    uint32_t reserved_1_6;         /* 0                                        */
} eh_plugin_info;

/* probe(): "can this plugin run here, on this device?" It never crashes and
 * never leaves state behind: a CUDA plugin with no driver or no GPU returns
 * EH_OK with supported = 0 and a reason. A non-OK status means probe itself
 * failed (treated like supported = 0, reason from plugin_last_error). */
typedef struct eh_probe_result {
    uint32_t struct_size;
    int32_t supported;             /* 1 = can run, 0 = cannot                 */
    char reason[256];              /* why not (or a short note when it can)   */
    char device_name[128];         /* "NVIDIA H100 80GB HBM3", "CPU (16 threads)" */
    int32_t compute_capability;    /* 90 for sm_90; 0 for CPU                 */
    int32_t driver_version;        /* CUDA driver version (e.g. 13000); 0 CPU */
    int32_t runtime_version;       /* CUDA runtime version; 0 CPU             */
    uint64_t total_memory_bytes;   /* device memory (host RAM for CPU)        */
    uint64_t free_memory_bytes;
} eh_probe_result;

/* ------------------------------------------------------------------------ */
/* Models */

typedef struct eh_model eh_model;     /* opaque, plugin-owned */
typedef struct eh_session eh_session; /* opaque, plugin-owned */
typedef struct eh_seq eh_seq;         /* opaque, plugin-owned (1.2) */
typedef struct eh_adapter eh_adapter; /* opaque, plugin-owned (1.6) */
typedef struct eh_parked eh_parked;   /* opaque, plugin-owned (1.7) */

/* Progress: fraction in [0,1], monotonically non-decreasing, 1.0 exactly once
 * at the end of a successful load. `stage` is a short plugin-owned label. */
typedef void (*eh_progress_fn)(void* user, float fraction, const char* stage);
/* Cancellation: polled by the plugin at safe points; nonzero means stop and
 * return EH_CANCELLED, leaving no half-built state behind. */
typedef int32_t (*eh_cancel_fn)(void* user);

typedef struct eh_load_params {
    uint32_t struct_size;
    const char* path;              /* the model file or directory, for plugins
                                      that wrap another runtime              */
    const eh_model_view* view;     /* host-owned; valid until model_release  */
    int32_t device;                /* GPU ordinal; ignored by CPU engines     */
    uint32_t n_threads;            /* CPU threads to use; 0 = plugin default  */
    const char* options_json;      /* plugin-specific options as a JSON
                                      object, or NULL                          */
    eh_progress_fn progress;       /* may be NULL */
    void* progress_user;
    eh_cancel_fn cancel;           /* may be NULL */
    void* cancel_user;
    /* since 1.6: read only when struct_size >= 88. The devices the load
     * spans, one rank each: rank i runs on devices[i]. n_devices 0 (or an
     * older host's struct): `device` alone. Otherwise 1 <= n_devices <= the
     * plugin info's max_devices (the host never names more), devices[0] ==
     * device, every ordinal >= 0. An ordinal may repeat: the plugin then runs
     * that many ranks (shards) on the one GPU, computing what as many GPUs
     * would; it exists so the sharded path can be tested on one GPU. The
     * array is host-owned and valid only during model_load (the plugin
     * copies it). The plugin owns its ranks: streams, host threads, peer
     * access and collectives (NCCL, peer-memory all-reduce) are its own, and
     * model_get_info's device_bytes_used counts every rank's memory. A
     * plugin that cannot shard this model (head counts, block sizes) fails
     * the load with EH_UNSUPPORTED naming why.                             */
    uint32_t n_devices;
    const int32_t* devices;
} eh_load_params;

typedef struct eh_model_info {
    uint32_t struct_size;
    char architecture[32];
    char quant_kind[32];           /* dominant type, e.g. "Q4_K_M", "MXFP4"   */
    uint32_t context_length;       /* trained context length                  */
    uint32_t vocab_size;           /* number of logits per position           */
    uint64_t device_bytes_used;    /* device memory actually held             */
    uint64_t host_bytes_used;      /* host memory the plugin holds            */
    char device_name[128];
    int32_t compute_capability;    /* 0 for CPU                               */
    int32_t runtime_version;       /* CUDA runtime version; 0 for CPU         */
    /* since 1.1 -- */
    uint64_t kv_bytes_per_token;   /* memory one token of session context
                                      takes in the KV cache (device memory for
                                      GPU engines); 0 = not stated           */
} eh_model_info;

/* ------------------------------------------------------------------------ */
/* Sessions: one sequence's KV cache plus its sampler state.                 */

typedef struct eh_session_params {
    uint32_t struct_size;
    uint32_t n_ctx;                /* tokens the KV cache holds (prompt+output) */
    eh_cancel_fn cancel;           /* polled during prefill/decode; may be NULL */
    void* cancel_user;
} eh_session_params;

/* The sampling pipeline, applied in this order to the logits of the last
 * position: (1.2: a step entry's logit biases, then its allowed-token mask,)
 * repetition penalty, (1.2: presence and frequency penalties,) temperature,
 * top-k, top-p, min-p, then either greedy (temperature == 0) or a draw from
 * the seeded generator. Neutral values: repetition_penalty 1, top_k 0,
 * top_p 1, min_p 0, presence_penalty 0, frequency_penalty 0.
 * Penalties look at the sequence's tokens (prompt and output): repetition
 * over the last repetition_window of them; presence and frequency (OpenAI's
 * meaning: logit -= presence * [count > 0] + frequency * count) over the
 * tokens the sequence generated itself, i.e. those appended after the first
 * sampled step. */
typedef struct eh_sampling_params {
    uint32_t struct_size;
    float temperature;             /* 0 = greedy                              */
    int32_t top_k;                 /* 0 = off                                 */
    float top_p;                   /* 1 = off                                 */
    float min_p;                   /* 0 = off                                 */
    float repetition_penalty;      /* 1 = off                                 */
    int32_t repetition_window;     /* last N tokens penalised; -1 = all       */
    uint64_t seed;                 /* same seed + same input = same tokens    */
    /* since 1.2 -- ignored by 1.0/1.1 plugins, so the host refuses requests
     * that set them on such a plugin */
    float presence_penalty;        /* 0 = off                                 */
    float frequency_penalty;       /* 0 = off                                 */
} eh_sampling_params;

/* ------------------------------------------------------------------------ */
/* 1.2: the KV cache in blocks, sequences, and the batched step.
 *
 * kv_init is called once per model, after model_load and before any seq_*
 * or step call. The plugin allocates every KV block there (device memory for
 * GPU engines) plus whatever one step of the granted size needs, so that no
 * later call allocates. A sequence holds ceil(length / block_tokens) blocks;
 * forked sequences share the blocks of their common prefix (reference
 * counted; a shared block is never written: a step that appends into a
 * shared, partly filled block first copies it). Blocks come back when the
 * last sequence holding them is released or truncated below them.         */

typedef struct eh_kv_params {
    uint32_t struct_size;
    uint32_t max_seqs;             /* most sequences alive at once            */
    uint32_t max_step_tokens;      /* most tokens in one step, all entries    */
    uint32_t max_step_entries;     /* most entries in one step                */
    uint32_t max_seq_tokens;       /* longest sequence the host will build    */
    uint64_t budget_bytes;         /* memory for the blocks; 0 = use
                                      memory_fraction                         */
    float memory_fraction;         /* (0,1]: of the memory free after the
                                      weights and step buffers, when
                                      budget_bytes is 0; 0 = plugin default   */
    /* since 1.4: read only when struct_size >= 48 (an older host's struct
     * is 40 bytes and ends in padding where kv_type now lies) */
    uint32_t kv_type;              /* element type of the K and V blocks: 0 =
                                      the plugin's default (what it stored
                                      before 1.4: F16 on the CUDA plugins, F32
                                      on the CPU reference; F32 can only be
                                      had so), else an eh_tensor_type id:
                                      EH_TYPE_F16, EH_TYPE_Q8_0 (ggml's block:
                                      per 32 values an f16 scale and 32 int8),
                                      EH_TYPE_FP8_E4M3. A plugin that cannot
                                      store it returns EH_UNSUPPORTED with a
                                      message naming the type; it never grants
                                      another type instead.                   */
    uint32_t reserved;             /* 0; makes the 1.4 struct 48 bytes        */
} eh_kv_params;

typedef struct eh_kv_info {
    uint32_t struct_size;
    uint32_t block_tokens;         /* tokens per block                        */
    uint32_t total_blocks;
    uint32_t free_blocks;          /* held by no sequence                     */
    uint64_t block_bytes;          /* memory of one block, all layers         */
    /* As granted: never above what kv_init asked for; a plugin may grant
     * less (e.g. a GPT-2 has only n learned positions, or a budget holds
     * less than one sequence of max_seq_tokens: the host then serves the
     * shorter context). */
    uint32_t max_seqs;
    uint32_t max_step_tokens;
    uint32_t max_step_entries;
    uint32_t max_seq_tokens;
    /* since 1.4: a plugin that writes a struct_size below 44 predates it */
    uint32_t kv_type;              /* the element type the blocks hold: an
                                      eh_tensor_type id, never "default" (0 is
                                      EH_TYPE_F32 here); block_bytes is of it */
    /* since 1.6, in what was padding (the struct keeps its 48 bytes): read
     * only from a plugin whose table says abi_minor >= 6 */
    uint32_t max_draft_tokens;     /* the most draft tokens one
                                      EH_STEP_VERIFY entry may carry; 0: the
                                      plugin does not verify, and refuses the
                                      flag as unknown                        */
} eh_kv_info;

/* step() entry flags. */
#define EH_STEP_SAMPLE 1u /* sample a token after the entry's last token     */
#define EH_STEP_LOGITS 2u /* keep that position's raw logits for seq_logits  */
/* (1.3, step_begin only) The entry's one token is the token its sequence's
 * step in flight samples, which the host has not read yet: n_tokens must be
 * 1 and `tokens` is ignored (may be NULL). The sequence must be in the step
 * in flight with EH_STEP_SAMPLE. A GPU engine takes the token on the device,
 * so the step can run right behind the one in flight.                       */
#define EH_STEP_CHAINED 4u
/* (1.5, only for a plugin that sets seq_hidden) Keep the final hidden state
 * of the entry's last position -- the row the LM head would read, after the
 * output norm: n_embd floats -- for seq_hidden. Needs no sampler; may be
 * combined with EH_STEP_SAMPLE / EH_STEP_LOGITS. A step begun while another
 * is in flight may not ask it. Last-token pooling (an embedding model such
 * as Qwen3-Embedding, a yes/no reranker) needs nothing more; mean or CLS
 * pooling would need every position and is not part of 1.5.               */
#define EH_STEP_HIDDEN 8u
/* (1.6, only for a plugin whose kv_init granted max_draft_tokens > 0)
 * Speculative verification. The entry's tokens are [t, d1..dk]: the
 * sequence's next token t, then k >= 1 draft tokens (k <= max_draft_tokens)
 * that some cheaper source guessed would follow it. It must also carry
 * EH_STEP_SAMPLE, may not carry EH_STEP_LOGITS, EH_STEP_HIDDEN or
 * EH_STEP_CHAINED, and is for step() only (step_begin refuses it). The
 * plugin runs the k + 1 positions in the one forward pass. With p_j the
 * distribution the sequence's sampler would draw from after t, d1..d(j-1)
 * (every transform of the pipeline applied there, the penalties over the
 * history up to that position, the entry's bias and mask at every
 * position; greedy: all mass on the argmax), for j = 1..k in order it
 * accepts d_j with probability p_j(d_j) -- one uniform draw from the
 * sequence's generator; greedy accepts exactly when d_j is the argmax and
 * draws nothing -- and at the first rejection samples `token` from p_j with
 * d_j removed and the rest renormalised (greedy: the argmax). When all k
 * are accepted it samples `token` from p_(k+1) as a plain step would.
 * Out: n_accepted = m, the drafts accepted; `token`, the one after them.
 * The sequence keeps t, d1..dm (its length grows by m + 1); the rejected
 * drafts leave no trace in it (their blocks are freed). This is rejection
 * sampling with a deterministic proposal: every token's distribution is
 * the one plain steps would sample it from, and greedy output is the same
 * token for token. Equivalently, a plugin may draw x_j from p_j at every
 * position and accept while x_j == d_j, the first other x_j being `token`
 * (a plugin whose draws are keyed by position then emits exactly what
 * plain steps would). KV_FULL is judged on all k + 1 tokens. The verify
 * entries of one step carry at most max_step_entries drafts together (a
 * step samples at most twice max_step_entries positions).               */
#define EH_STEP_VERIFY 16u

/* One sequence's part of a step. Entries are an array whose stride is
 * entries[0].struct_size (the same for every entry). The host owns every
 * pointer; they are valid for the duration of the call. A sequence appears
 * at most once per step. */
typedef struct eh_step_entry {
    uint32_t struct_size;
    uint32_t flags;                /* EH_STEP_*                               */
    eh_seq* seq;
    const int32_t* tokens;         /* appended to the sequence, in order      */
    uint32_t n_tokens;             /* >= 1                                    */
    /* Optional, with EH_STEP_SAMPLE, for this step only: */
    uint32_t n_bias;               /* logit biases: logits[bias_tokens[i]] +=  */
    const int32_t* bias_tokens;    /*   bias_values[i]; NULL when n_bias == 0 */
    const float* bias_values;
    const uint32_t* allowed;       /* allowed-token bitset, ceil(n_vocab/32)
                                      words, bit (i % 32) of word i / 32 set =
                                      token i may be sampled; NULL = all. At
                                      least one bit must be set.              */
    /* Out: the sampled token with EH_STEP_SAMPLE, else -1. */
    int32_t token;
    /* since 1.6 (in what was padding, so the struct keeps its 64 bytes):
     * out, with EH_STEP_VERIFY only, the draft tokens accepted; a plugin
     * leaves it alone otherwise (an older host's entry has no such member) */
    uint32_t n_accepted;
} eh_step_entry;

/* ------------------------------------------------------------------------ */
/* 1.6: LoRA adapters. The host opens the adapter file (llama.cpp's GGUF LoRA
 * format: general.type "adapter", adapter.type "lora", adapter.lora.alpha),
 * checks it against the model (every pair's base tensor exists, shapes and
 * ranks agree) and hands the plugin a view of it like the model's. Its
 * tensors come in pairs named after a base weight W of dims {n_in, n_out}:
 * "<W>.lora_a" of dims {n_in, r} and "<W>.lora_b" of dims {r, n_out}; with
 * the sequence's adapter, y = W x becomes
 *     y = W x + s * B (A x),   s = alpha > 0 ? scale * alpha / r : scale
 * per pair (r the pair's rank). Other tensors (a "_norm.weight" some tools
 * add) are ignored, as llama.cpp ignores them.                            */
typedef struct eh_adapter_params {
    uint32_t struct_size;
    uint32_t reserved;             /* 0                                       */
    const eh_model_view* view;     /* host-owned; valid until adapter_release
                                      returns                                 */
    float scale;                   /* the user's multiplier; 1 = as trained   */
    float alpha;                   /* adapter.lora.alpha; 0 = absent           */
} eh_adapter_params;

/* ------------------------------------------------------------------------ */
/* 1.6: images in. A vision encoder turns one image into rows of the text
 * model's embedding width (image_encode below), and a step takes such rows
 * in place of the token embeddings of a span of a sequence's positions
 * (seq_embd_spans below). The two halves are separate on purpose: the step
 * takes rows from anywhere, so an encoder the plugin does not ship (another
 * plugin, a host-side model) can feed it. The encoder's weights come in a
 * second model view: llama.cpp's multimodal projector GGUF ("mmproj":
 * general.architecture "clip", clip.vision.* keys, v.* and mm.* tensors). */

/* What a loaded image encoder takes and gives. */
typedef struct eh_image_encoder_info {
    uint32_t struct_size;
    uint32_t image_width;          /* pixels image_encode takes: the host     */
    uint32_t image_height;         /*   resizes every image to this size      */
    uint32_t n_tokens;             /* rows (positions) one image becomes      */
    uint32_t n_embd;               /* floats per row: the text model's width  */
    uint32_t span_flags;           /* EH_SPAN_* the text model wants on an
                                      image's span (Gemma 3: BIDIRECTIONAL)   */
    float mean[3];                 /* per channel (R, G, B): the encoder's    */
    float std[3];                  /*   input is (value / 255 - mean) / std   */
    /* since 1.8: read only from a plugin whose table says abi_minor >= 8
     * (the host zeroes the struct first, so an older plugin leaves 0). */
    uint32_t tile;                 /* 0: every image is image_width x
                                      image_height and becomes n_tokens rows
                                      (image_encode). Else the encoder takes
                                      an image of any width and height that
                                      are multiples of tile (image_encode_
                                      sized): each tile x tile square becomes
                                      one row, rows of tiles top to bottom,
                                      left to right in a row. image_width x
                                      image_height is then only a nominal
                                      size, n_tokens the rows of it.          */
    uint32_t min_tokens;           /* with tile: the host resizes an image to */
    uint32_t max_tokens;           /*   min_tokens..max_tokens tiles          */
    uint32_t reserved;             /* 0                                       */
} eh_image_encoder_info;

/* The span's positions attend to each other both ways (each also sees
 * every earlier position, causally, as usual): Gemma 3's image tokens.     */
#define EH_SPAN_BIDIRECTIONAL 1u
/* (1.8) The span is an image laid out on a grid: count / grid_width rows of
 * grid_width positions, row-major. A model whose positions have several
 * axes (Qwen2.5-VL's M-RoPE: time, row, column) gives each of the span's
 * positions its row and column from the span's first position, and the
 * positions after the span continue one past the largest; a model of one
 * position axis ignores the flag. count must be a multiple of grid_width. */
#define EH_SPAN_GRID 2u

/* Rows for positions of a step entry, in place of its tokens' embeddings.
 * The entry still carries token ids there (the model's image token, say):
 * they are checked as usual and count in the sequence's history, but their
 * embedding is not read. Rows are used as given (no embedding scale).     */
typedef struct eh_embd_span {
    uint32_t first;                /* index into the entry's tokens           */
    uint32_t count;                /* >= 1; first + count <= the entry's
                                      n_tokens                                */
    uint32_t flags;                /* EH_SPAN_*                               */
    uint32_t grid_width;           /* (1.8; reserved before, 0) with
                                      EH_SPAN_GRID the image's width in
                                      positions, else 0                       */
    const float* rows;             /* count * n_embd floats, host-owned       */
} eh_embd_span;

/* ------------------------------------------------------------------------ */
/* The function table. Members marked OPTIONAL may be NULL. */

typedef struct eh_plugin_api {
    uint32_t struct_size;          /* sizeof(eh_plugin_api) in the plugin    */
    uint16_t abi_major;            /* EH_ABI_MAJOR the plugin was built with */
    uint16_t abi_minor;            /* EH_ABI_MINOR the plugin was built with */

    /* Self-description; never NULL, owned by the plugin. */
    const eh_plugin_info* (*info)(void);

    /* Message for the last failed call on this thread that had no object
     * (probe, model_load). Never NULL; "" when there is none. */
    const char* (*plugin_last_error)(void);

    eh_status (*probe)(int32_t device, eh_probe_result* out);

    /* Load a model. On EH_OK, *out_model is a new object the host releases
     * with model_release. On failure, *out_model is NULL and nothing leaks. */
    eh_status (*model_load)(const eh_load_params* params, eh_model** out_model);
    eh_status (*model_get_info)(const eh_model* model, eh_model_info* out);
    /* Verifies that every weight allocation is still where it should be
     * (device memory for GPU engines). *resident = 1 when all is well; when 0
     * the reason is in model_last_error. */
    eh_status (*model_check_residency)(eh_model* model, int32_t* resident);
    const char* (*model_last_error)(const eh_model* model);
    void (*model_release)(eh_model* model);

    /* Sessions. Required up to 1.3 and for a plugin without the batched
     * group; from 1.4 a plugin with the batched group may leave all ten
     * session_* members NULL (never some of them). */
    eh_status (*session_create)(eh_model* model, const eh_session_params* params,
                                eh_session** out_session);
    /* Sets the sampler and (re)seeds its generator. Must be called before
     * the first session_sample / session_decode, and may be called again. */
    eh_status (*session_set_sampling)(eh_session* s, const eh_sampling_params* p);
    /* Appends `n` tokens to the context and computes the logits of the last
     * one. EH_CONTEXT_FULL when they do not fit (nothing is appended). */
    eh_status (*session_prefill)(eh_session* s, const int32_t* tokens, uint32_t n);
    /* Samples the next token from the current logits. Does not advance the
     * context (the sampler's generator does advance). */
    eh_status (*session_sample)(eh_session* s, int32_t* out_token);
    /* The decode step: appends `token`, runs one forward pass, and samples
     * the next token from the new logits into *out_token. */
    eh_status (*session_decode)(eh_session* s, int32_t token, int32_t* out_token);
    /* Empties the KV cache (n_past becomes 0); the sampler is kept. */
    eh_status (*session_reset)(eh_session* s);
    /* Number of tokens in the context. */
    uint32_t (*session_n_past)(const eh_session* s);
    /* OPTIONAL. The raw (pre-sampling) logits from which the last token was
     * sampled, n_vocab floats, owned by the session and valid until the next
     * call on it. For logprobs. */
    eh_status (*session_logits)(eh_session* s, const float** out_logits,
                                uint32_t* out_n_vocab);
    const char* (*session_last_error)(const eh_session* s);
    void (*session_release)(eh_session* s);

    /* since 1.2 -- OPTIONAL as a group: either every member below is set
     * (seq_logits may still be NULL) or none is, and a plugin with none is
     * driven one sequence at a time through the session calls. Messages of
     * failed calls are read with model_last_error on the sequence's model. */

    /* Allocates the KV blocks and step buffers (see above) and reports what
     * was granted. Called once; EH_INSUFFICIENT_VRAM when not even one block
     * fits, EH_INVALID_ARGUMENT for zero limits. */
    eh_status (*kv_init)(eh_model* model, const eh_kv_params* params, eh_kv_info* out);
    eh_status (*kv_get_info)(const eh_model* model, eh_kv_info* out);

    /* A new, empty sequence (no blocks, no sampler). EH_NO_CAPACITY (1.4;
     * EH_INVALID_ARGUMENT before) when max_seqs are alive. */
    eh_status (*seq_create)(eh_model* model, eh_seq** out_seq);
    /* A new sequence holding the first n_tokens (<= seq_length(src)) of src,
     * sharing src's blocks for them; it takes no free block (the first step
     * that writes into a shared, partly filled block copies it and counts
     * that block). It has no sampler and no logits until a step on it; src
     * is unchanged. EH_NO_CAPACITY (1.4; EH_INVALID_ARGUMENT before) when
     * max_seqs are alive. */
    eh_status (*seq_fork)(eh_seq* src, uint32_t n_tokens, eh_seq** out_seq);
    /* Keeps the first n_tokens (<= seq_length) and frees the blocks past
     * them; the logits are dropped. */
    eh_status (*seq_truncate)(eh_seq* seq, uint32_t n_tokens);
    /* Sets the sequence's sampler and (re)seeds its generator; needed before
     * the first step that samples for it, and may be called again. */
    eh_status (*seq_set_sampling)(eh_seq* seq, const eh_sampling_params* p);
    uint32_t (*seq_length)(const eh_seq* seq);
    /* OPTIONAL. Raw logits of the position the sequence's last step asked
     * EH_STEP_LOGITS for: n_vocab floats owned by the sequence, valid until
     * the next step or seq_* call on it. */
    eh_status (*seq_logits)(eh_seq* seq, const float** out_logits, uint32_t* out_n_vocab);
    void (*seq_release)(eh_seq* seq);

    /* One forward pass over n_entries sequences: appends each entry's tokens
     * and, for entries with EH_STEP_SAMPLE, samples one token from the logits
     * of the entry's last position (the sequence does NOT get that token:
     * the host sends it in a later step). The result for each entry must not
     * depend on which other entries share the step, except through floating-
     * point reassociation a GPU engine documents. Limits: n_entries <=
     * max_step_entries, total tokens <= max_step_tokens, every sequence
     * <= max_seq_tokens afterwards.
     * On EH_KV_FULL or EH_INVALID_ARGUMENT (limits, bad token ids, a NULL or
     * repeated sequence, sampling without a sampler, an empty mask) nothing
     * was changed and the message names the entry. Other failures (device
     * errors) leave the entries' sequences in an unspecified state; the host
     * releases them. */
    eh_status (*step)(eh_model* model, eh_step_entry* entries, uint32_t n_entries);

    /* since 1.3 -- OPTIONAL as a pair, and only beside the 1.2 group: step()
     * in two halves, so that the host can start step N+1 before it has read
     * step N's tokens and do its own work (detokenizing, streaming) while the
     * engine computes.
     *
     * step_begin checks and starts a step exactly as step() would (same
     * statuses; on EH_KV_FULL or EH_INVALID_ARGUMENT nothing was changed and
     * nothing is in flight that was not before) and returns without waiting
     * for its results; the sequences' lengths include its tokens at once.
     * The plugin copies what it needs from `entries` during the call.
     * At most one step may be in flight when step_begin is called (so at most
     * two after it). A step begun while another is in flight may not ask
     * EH_STEP_LOGITS. Its entries may be EH_STEP_CHAINED (above); an entry of
     * a sequence whose penalties need its history may make step_begin wait
     * for the step in flight.
     *
     * step_end waits for the oldest step in flight and writes the token it
     * sampled for each of its entries, in entry order, to out_tokens[i]
     * (n_entries must be that step's count; -1 for entries without
     * EH_STEP_SAMPLE). EH_INVALID_ARGUMENT when no step is in flight or the
     * count differs (nothing changes). A device failure leaves every
     * sequence of the steps in flight in an unspecified state; the host
     * releases them. A step's EH_STEP_LOGITS logits are read with seq_logits
     * after its step_end.
     *
     * While a step is in flight the host calls only step_begin, step_end,
     * kv_get_info, seq_length, model_get_info and model_check_residency on
     * the model: step(), kv_init and the other seq_* calls that return a
     * status fail with EH_BUSY then (1.4; EH_INVALID_ARGUMENT before). The host ends every step it
     * began before it releases a sequence or the model (a plugin that sees
     * seq_release or model_release anyway waits for its steps first). */
    eh_status (*step_begin)(eh_model* model, eh_step_entry* entries, uint32_t n_entries);
    eh_status (*step_end)(eh_model* model, int32_t* out_tokens, uint32_t n_entries);

    /* since 1.5 -- OPTIONAL, and only beside the 1.2 group. The final hidden
     * state (after the output norm) of the position the sequence's last step
     * asked EH_STEP_HIDDEN for: n_embd floats owned by the sequence, valid
     * until the next step or seq_* call on it. EH_INVALID_ARGUMENT when its
     * last step did not ask (seq_truncate and seq_fork drop it too). A
     * plugin that leaves this NULL refuses EH_STEP_HIDDEN as an unknown flag,
     * and the host refuses embedding and rerank serving with it by name. A
     * sequence's hidden state must not depend on the other entries of its
     * step, as its logits must not. */
    eh_status (*seq_hidden)(eh_seq* seq, const float** out_hidden, uint32_t* out_n_embd);

    /* since 1.6 -- OPTIONAL as a group of three, and only beside the 1.2
     * group: LoRA adapters (eh_adapter_params above). A plugin that leaves
     * them NULL serves no adapter, and the host refuses --lora with it by
     * name. Called from the thread that makes the batched calls, never
     * while a step is in flight (EH_BUSY). Messages of failed calls are read
     * with model_last_error on the model.
     *
     * adapter_load: a new adapter of `model`; on EH_OK *out_adapter is an
     * object the host releases with adapter_release, after every sequence
     * that uses it and before the model. EH_MODEL_LOAD_FAILED for a view
     * that does not fit the model (a missing base tensor, a shape, a rank),
     * EH_UNSUPPORTED for a base tensor the plugin cannot adapt (the message
     * names it). The plugin may keep pointers into the view until
     * adapter_release returns.
     *
     * seq_set_adapter: the adapter (NULL = none) every later step of `seq`
     * computes with. Allowed while the sequence is empty, or to the adapter
     * it already has (EH_INVALID_ARGUMENT otherwise: its KV was computed
     * with another); seq_fork gives the new sequence its source's adapter.
     * Sequences with different adapters (and none) may share one step; each
     * entry's results are those it would have alone.                     */
    eh_status (*adapter_load)(eh_model* model, const eh_adapter_params* params, eh_adapter** out_adapter);
    void (*adapter_release)(eh_adapter* adapter);
    eh_status (*seq_set_adapter)(eh_seq* seq, eh_adapter* adapter);

    /* since 1.6 -- OPTIONAL as a group of three, and only beside the 1.2
     * group: images in (eh_image_encoder_info, eh_embd_span above). A
     * plugin that leaves them NULL takes no image, and the host refuses
     * --mmproj with it by name. Called from the thread that makes the
     * batched calls, never while a step is in flight (EH_BUSY); messages of
     * failed calls are read with model_last_error.
     *
     * image_encoder_load: loads the encoder from `encoder` (host-owned,
     * valid until model_release; the plugin may keep pointers into it) and
     * says what it takes and gives. Once per model, before kv_init.
     * EH_MODEL_LOAD_FAILED for a view that does not fit the model (a
     * missing tensor, a projection width other than the model's), naming
     * it; EH_UNSUPPORTED for a projector type the plugin does not know.
     *
     * image_encode: one image. `pixels` is three planes (R, G, B) of
     * image_height rows of image_width floats, already normalised with the
     * info's mean and std; `out_rows` gets n_tokens * n_embd floats. Both
     * caller-owned. EH_INVALID_ARGUMENT when no encoder was loaded.
     *
     * seq_embd_spans: rows for the sequence's next step (step or
     * step_begin) only; n_spans 0 clears them. Spans are sorted by `first`
     * and do not overlap. The host keeps `spans` and their rows valid until
     * that step call returns (step_begin copies what it needs). That step
     * fails with EH_INVALID_ARGUMENT, naming the entry, for a span past the
     * entry's tokens or a sequence whose entry is EH_STEP_CHAINED or
     * EH_STEP_VERIFY; the spans are dropped after the step either way. A
     * BIDIRECTIONAL span lies whole in its entry, except that its first
     * positions may already be in the sequence when they are the same
     * image's (a prefix shared through seq_fork): their keys and values
     * are then what the whole image computed. */
    eh_status (*image_encoder_load)(eh_model* model, const eh_model_view* encoder, eh_image_encoder_info* out);
    eh_status (*image_encode)(eh_model* model, const float* pixels, float* out_rows);
    eh_status (*seq_embd_spans)(eh_seq* seq, const eh_embd_span* spans, uint32_t n_spans);

    /* since 1.7 -- OPTIONAL as a group of three, and only beside the 1.2
     * group: a host-memory tier for the KV of cached prefixes. The plugin
     * owns the host memory (a GPU plugin allocates it pinned, so the copies
     * run at bus speed); the host decides what to park and keeps the total
     * under its budget. Called from the thread that makes the batched
     * calls, never while a step is in flight (EH_BUSY); messages of failed
     * calls are read with model_last_error.
     *
     * seq_park: copies the KV of the first n_tokens (1..seq_length) of
     * `seq`, with their token ids and adapter, into a new eh_parked in host
     * memory; `seq` is unchanged and may be released at once. *out_bytes
     * gets the host bytes the parked copy holds (or would hold).
     * EH_NO_CAPACITY when that is more than max_bytes, or when the host
     * memory cannot be allocated: nothing was made, *out_parked is NULL.
     *
     * seq_unpark: a new sequence of `model` holding the parked tokens,
     * their KV copied back into fresh blocks (blocks for n_tokens), with
     * the parked adapter, no sampler and no logits -- as seq_fork of the
     * parked sequence would have made it, so every later step gives the
     * same results bit for bit. `tokens` (n_tokens of them) are what the
     * host expects the parked copy to hold: EH_INVALID_ARGUMENT, changing
     * nothing, when the count or any token differs (the message names the
     * first position) or the parked copy is another model's. EH_KV_FULL
     * when the free blocks do not suffice and EH_NO_CAPACITY when max_seqs
     * are alive: nothing changes. The parked copy is unchanged and may be
     * unparked again.
     *
     * parked_release: frees it. The host releases every parked copy before
     * the model and before any adapter it holds.                         */
    eh_status (*seq_park)(eh_seq* seq, uint32_t n_tokens, uint64_t max_bytes, eh_parked** out_parked,
                          uint64_t* out_bytes);
    eh_status (*seq_unpark)(eh_model* model, const eh_parked* parked, const int32_t* tokens, uint32_t n_tokens,
                            eh_seq** out_seq);
    void (*parked_release)(eh_parked* parked);

    /* since 1.8 -- OPTIONAL, only beside the 1.6 image group, and required
     * when image_encoder_load reports a nonzero tile: one image of
     * width x height pixels (multiples of the tile; three planes R, G, B,
     * normalised as image_encode's) into (width / tile) * (height / tile)
     * rows of n_embd floats, row-major over the tiles. Both buffers are the
     * caller's. EH_INVALID_ARGUMENT for a size that is not a multiple of
     * the tile or outside min_tokens..max_tokens tiles, or when no encoder
     * (or a fixed-size one) was loaded. Same threading as image_encode. */
    eh_status (*image_encode_sized)(eh_model* model, const float* pixels, uint32_t width, uint32_t height,
                                    float* out_rows);
} eh_plugin_api;

/* The entry point. Returns the plugin's static function table, or NULL if the
 * plugin cannot offer any table for this host (the host rejects it). The
 * host passes the ABI version it speaks, so a plugin may serve several. */
typedef const eh_plugin_api* (*eh_plugin_entry_fn)(uint16_t host_abi_major,
                                                    uint16_t host_abi_minor);

/* Name of a status, e.g. "VRAM_OOM", for logs and error envelopes. */
static inline const char* eh_status_name(eh_status s) {
    switch (s) {
    case EH_OK: return "OK";
    case EH_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case EH_UNSUPPORTED: return "UNSUPPORTED";
    case EH_MODEL_LOAD_FAILED: return "MODEL_LOAD_FAILED";
    case EH_INSUFFICIENT_VRAM: return "INSUFFICIENT_VRAM";
    case EH_VRAM_OOM: return "VRAM_OOM";
    case EH_CUDA_ERROR: return "CUDA_ERROR";
    case EH_CANCELLED: return "CANCELLED";
    case EH_CONTEXT_FULL: return "CONTEXT_FULL";
    case EH_INTERNAL: return "INTERNAL";
    case EH_KV_FULL: return "KV_FULL";
    case EH_NO_CAPACITY: return "NO_CAPACITY";
    case EH_BUSY: return "BUSY";
    }
    return "UNKNOWN_STATUS";
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ENGINE_HOST_PLUGIN_ABI_H */
