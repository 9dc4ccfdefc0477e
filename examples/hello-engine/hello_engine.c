/*
 * hello-engine: the smallest complete engine plugin, in plain C, to show the
 * shape of the ABI. It "generates" by replaying the prompt backwards, so it
 * needs no weights: any GGUF with architecture "hello" or "llama" will do
 * (it never reads a tensor).
 *
 * It runs the way the host serves every request: through the batched step
 * (ABI 1.2's kv_init, seq_* and step). From ABI 1.4 that is all a plugin
 * needs: the session_* members are left NULL.
 *
 * The KV cache is in blocks the host counts. Here a block is a whole
 * sequence's context (block_tokens = max_seq_tokens), the simplest layout
 * the ABI allows: a forked sequence shares its source's block until its
 * first step, which copies it.
 */
#include <engine_host/plugin_abi.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct hello_model {
    uint32_t vocab;
    char last_error[128];
    /* Set by kv_init. */
    int kv_ready;
    eh_kv_info kv;      /* as granted; free_blocks kept current */
    uint32_t* refs;     /* per block: how many sequences hold it */
    uint32_t live;      /* sequences alive */
} hello_model;

typedef struct hello_seq {
    hello_model* model;
    int32_t* tokens;    /* the context, kv.max_seq_tokens long */
    uint32_t length;
    int32_t block;      /* -1: holds none yet */
    uint32_t cursor;    /* the next sampled token is tokens[cursor - 1] */
    int has_sampler;
    int sampled_last;   /* its last step sampled: one token now is a decode */
} hello_seq;

static const char* const formats[] = {"gguf", NULL};
static const char* const archs[] = {"hello", "llama", NULL};
static const char* const quants[] = {"F32", NULL};
static const eh_plugin_info info_v = {sizeof(eh_plugin_info), "hello-engine", "0.1.0", "hello",
                                      formats, archs, quants, EH_DEVICE_CPU, 0,
                                      1 /* max_devices: one (1.6) */, 0};
/* Per thread, as the ABI requires of last-error storage. */
static _Thread_local char plugin_error[128];

static const eh_plugin_info* info(void) { return &info_v; }
static const char* plugin_last_error(void) { return plugin_error; }

static eh_status probe(int32_t device, eh_probe_result* out) {
    (void)device;
    out->supported = 1;
    snprintf(out->device_name, sizeof out->device_name, "CPU");
    return EH_OK;
}

static eh_status model_load(const eh_load_params* p, eh_model** out) {
    *out = NULL;
    hello_model* m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(plugin_error, sizeof plugin_error, "out of memory");
        return EH_INTERNAL;
    }
    m->vocab = 256;
    /* The vocabulary size, if the file has a tokenizer. */
    for (uint64_t i = 0; i < p->view->n_metadata; ++i) {
        const eh_metadata_kv* kv = &p->view->metadata[i];
        if (strcmp(kv->key.data, "tokenizer.ggml.tokens") == 0 && kv->value.type == EH_VALUE_ARRAY)
            m->vocab = (uint32_t)kv->value.count;
    }
    if (p->progress) p->progress(p->progress_user, 1.0f, "done");
    *out = (eh_model*)m;
    return EH_OK;
}

static eh_status model_get_info(const eh_model* model, eh_model_info* out) {
    const hello_model* m = (const hello_model*)model;
    snprintf(out->architecture, sizeof out->architecture, "hello");
    snprintf(out->quant_kind, sizeof out->quant_kind, "F32");
    out->context_length = 2048;
    out->vocab_size = m->vocab;
    snprintf(out->device_name, sizeof out->device_name, "CPU");
    return EH_OK;
}

static eh_status model_check_residency(eh_model* m, int32_t* resident) {
    (void)m;
    *resident = 1;
    return EH_OK;
}
static const char* model_last_error(const eh_model* m) { return ((const hello_model*)m)->last_error; }
static void model_release(eh_model* model) {
    hello_model* m = (hello_model*)model;
    free(m->refs);
    free(m);
}

static eh_status fail(hello_model* m, eh_status st, const char* what) {
    snprintf(m->last_error, sizeof m->last_error, "%s", what);
    return st;
}

/* ---- the KV cache: one block a sequence --------------------------------- */

/* Writes only the prefix of the caller's struct_size (an older host's struct
 * is smaller). */
static void copy_kv_info(eh_kv_info* out, const eh_kv_info* in) {
    eh_kv_info tmp = *in;
    const uint32_t size = out->struct_size && out->struct_size < sizeof tmp ? out->struct_size : (uint32_t)sizeof tmp;
    tmp.struct_size = size;
    memcpy(out, &tmp, size);
}

static eh_status kv_init(eh_model* model, const eh_kv_params* p, eh_kv_info* out) {
    hello_model* m = (hello_model*)model;
    if (m->kv_ready) return fail(m, EH_INVALID_ARGUMENT, "kv_init was already called");
    if (!p->max_seqs || !p->max_step_tokens || !p->max_step_entries || !p->max_seq_tokens)
        return fail(m, EH_INVALID_ARGUMENT, "kv_init: every limit must be positive");
    /* ABI 1.4: the host may ask an element type for the cache (kv_type, read
     * only from a 48-byte struct). This one holds token ids, its own way, so
     * it refuses any type but the default, naming it. */
    if (p->struct_size >= offsetof(eh_kv_params, reserved) + sizeof p->reserved && p->kv_type != 0) {
        char why[96];
        snprintf(why, sizeof why, "kv_init: KV cache type %u is not supported: hello-engine keeps token ids",
                 (unsigned)p->kv_type);
        return fail(m, EH_UNSUPPORTED, why);
    }
    eh_kv_info g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.kv_type = EH_TYPE_I32; /* what the blocks hold: token ids */
    g.max_seq_tokens = p->max_seq_tokens < 2048 ? p->max_seq_tokens : 2048; /* the context it reports */
    g.block_tokens = g.max_seq_tokens;
    g.block_bytes = (uint64_t)g.block_tokens * sizeof(int32_t);
    /* A budget buys whole blocks; without one, a block for every sequence.
     * A budget below one block grants the shorter context it holds. */
    if (p->budget_bytes && p->budget_bytes < g.block_bytes) {
        g.max_seq_tokens = g.block_tokens = (uint32_t)(p->budget_bytes / sizeof(int32_t));
        g.block_bytes = (uint64_t)g.block_tokens * sizeof(int32_t);
        if (g.block_tokens == 0) return fail(m, EH_INSUFFICIENT_VRAM, "kv_init: the budget holds not one token");
    }
    uint64_t blocks = p->max_seqs;
    if (p->budget_bytes && p->budget_bytes / g.block_bytes < blocks) blocks = p->budget_bytes / g.block_bytes;
    g.total_blocks = g.free_blocks = (uint32_t)blocks;
    g.max_seqs = p->max_seqs;
    g.max_step_tokens = p->max_step_tokens;
    g.max_step_entries = p->max_step_entries;
    m->refs = calloc(g.total_blocks, sizeof *m->refs);
    if (!m->refs) return fail(m, EH_INSUFFICIENT_VRAM, "kv_init: out of memory");
    m->kv = g;
    m->kv_ready = 1;
    copy_kv_info(out, &g);
    return EH_OK;
}

static eh_status kv_get_info(const eh_model* model, eh_kv_info* out) {
    hello_model* m = (hello_model*)model;
    if (!m->kv_ready) return fail(m, EH_INVALID_ARGUMENT, "kv_init first");
    copy_kv_info(out, &m->kv);
    return EH_OK;
}

static int32_t take_block(hello_model* m) {
    for (uint32_t b = 0; b < m->kv.total_blocks; ++b)
        if (m->refs[b] == 0) {
            m->refs[b] = 1;
            --m->kv.free_blocks;
            return (int32_t)b;
        }
    return -1; /* callers count free blocks first */
}

static void drop_block(hello_seq* s) {
    if (s->block >= 0 && --s->model->refs[s->block] == 0) ++s->model->kv.free_blocks;
    s->block = -1;
}

/* ---- sequences ----------------------------------------------------------- */

static eh_status new_seq(hello_model* m, hello_seq** out) {
    if (!m->kv_ready) return fail(m, EH_INVALID_ARGUMENT, "kv_init first");
    if (m->live >= m->kv.max_seqs) return fail(m, EH_NO_CAPACITY, "max_seqs sequences are alive");
    hello_seq* s = calloc(1, sizeof *s);
    if (s) s->tokens = calloc(m->kv.max_seq_tokens, sizeof(int32_t));
    if (!s || !s->tokens) {
        free(s);
        return fail(m, EH_VRAM_OOM, "out of memory");
    }
    s->model = m;
    s->block = -1;
    ++m->live;
    *out = s;
    return EH_OK;
}

static eh_status seq_create(eh_model* model, eh_seq** out) {
    hello_seq* s = NULL;
    eh_status st = new_seq((hello_model*)model, &s);
    *out = (eh_seq*)s;
    return st;
}

static eh_status seq_fork(eh_seq* src_seq, uint32_t n_tokens, eh_seq** out) {
    hello_seq* src = (hello_seq*)src_seq;
    if (n_tokens > src->length) return fail(src->model, EH_INVALID_ARGUMENT, "seq_fork: past the source's length");
    hello_seq* s = NULL;
    eh_status st = new_seq(src->model, &s);
    if (st != EH_OK) return st;
    memcpy(s->tokens, src->tokens, n_tokens * sizeof(int32_t));
    s->length = n_tokens;
    if (n_tokens > 0) { /* shares the block: takes no free one */
        s->block = src->block;
        ++src->model->refs[s->block];
    }
    *out = (eh_seq*)s;
    return EH_OK;
}

static eh_status seq_truncate(eh_seq* seq, uint32_t n_tokens) {
    hello_seq* s = (hello_seq*)seq;
    if (n_tokens > s->length) return fail(s->model, EH_INVALID_ARGUMENT, "seq_truncate: past the length");
    s->length = n_tokens;
    if (n_tokens == 0) drop_block(s);
    if (s->cursor > n_tokens) s->cursor = n_tokens;
    s->sampled_last = 0;
    return EH_OK;
}

static eh_status seq_set_sampling(eh_seq* seq, const eh_sampling_params* p) {
    (void)p; /* this engine is always "greedy" */
    ((hello_seq*)seq)->has_sampler = 1;
    return EH_OK;
}

static uint32_t seq_length(const eh_seq* seq) { return ((const hello_seq*)seq)->length; }

static void seq_release(eh_seq* seq) {
    hello_seq* s = (hello_seq*)seq;
    drop_block(s);
    --s->model->live;
    free(s->tokens);
    free(s);
}

/* ---- the step ------------------------------------------------------------ */

static eh_step_entry* entry_at(eh_step_entry* entries, uint32_t i) {
    /* The stride is the host's struct_size, so a newer host's larger entries work. */
    return (eh_step_entry*)((char*)entries + (size_t)i * entries[0].struct_size);
}

/* A new block the entry needs: none held yet, or a shared one to copy. */
static uint32_t needs_block(const hello_seq* s) { return s->block < 0 || s->model->refs[s->block] > 1; }

/* The allowed-token mask (structured output): a set bit lets a token be
 * sampled. This engine has no logits to rank the others by, so a refused
 * pick becomes the lowest allowed id. Logit biases, having no logits to
 * move, are checked (ids in the vocabulary) and otherwise ignored; the host
 * sees from the missing seq_logits that this engine has no logits. */
static int allowed(const eh_step_entry* e, int32_t token) {
    return !e->allowed || ((e->allowed[(uint32_t)token / 32] >> ((uint32_t)token % 32)) & 1u);
}
/* The lowest id the mask allows, or -1 for an empty mask. */
static int32_t first_allowed(const eh_step_entry* e, uint32_t vocab) {
    for (uint32_t t = 0; t < vocab; ++t)
        if (allowed(e, (int32_t)t)) return (int32_t)t;
    return -1;
}

static eh_status step(eh_model* model, eh_step_entry* entries, uint32_t n) {
    hello_model* m = (hello_model*)model;
    if (!m->kv_ready) return fail(m, EH_INVALID_ARGUMENT, "kv_init first");
    if (n == 0 || n > m->kv.max_step_entries) return fail(m, EH_INVALID_ARGUMENT, "step: entry count out of range");
    if (entries[0].struct_size < sizeof(eh_step_entry))
        return fail(m, EH_INVALID_ARGUMENT, "step: entries[0].struct_size is smaller than this plugin's eh_step_entry");
    /* Check everything first: on a refusal nothing may have changed. */
    uint64_t total = 0;
    uint32_t blocks = 0;
    for (uint32_t i = 0; i < n; ++i) {
        const eh_step_entry* e = entry_at(entries, i);
        const hello_seq* s = (const hello_seq*)e->seq;
        char what[96];
        if (!s || e->n_tokens == 0 || !e->tokens) {
            snprintf(what, sizeof what, "step entry %u: no sequence or no tokens", i);
            return fail(m, EH_INVALID_ARGUMENT, what);
        }
        for (uint32_t j = 0; j < i; ++j)
            if (entry_at(entries, j)->seq == e->seq) {
                snprintf(what, sizeof what, "step entry %u: the sequence appears twice", i);
                return fail(m, EH_INVALID_ARGUMENT, what);
            }
        for (uint32_t t = 0; t < e->n_tokens; ++t)
            if (e->tokens[t] < 0 || (uint32_t)e->tokens[t] >= m->vocab) {
                snprintf(what, sizeof what, "step entry %u: token id %d is outside the vocabulary", i, e->tokens[t]);
                return fail(m, EH_INVALID_ARGUMENT, what);
            }
        if (e->flags & ~(uint32_t)EH_STEP_SAMPLE) { /* LOGITS needs seq_logits, CHAINED step_begin: not offered */
            snprintf(what, sizeof what, "step entry %u: flags 0x%x are not offered by this plugin", i, e->flags);
            return fail(m, EH_INVALID_ARGUMENT, what);
        }
        for (uint32_t b = 0; b < e->n_bias; ++b)
            if (!e->bias_tokens || !e->bias_values || e->bias_tokens[b] < 0 || (uint32_t)e->bias_tokens[b] >= m->vocab ||
                e->bias_values[b] - e->bias_values[b] != 0.0f) { /* NaN or infinite */
                snprintf(what, sizeof what, "step entry %u: logit bias %u is outside the vocabulary or not finite", i, b);
                return fail(m, EH_INVALID_ARGUMENT, what);
            }
        if (e->allowed && first_allowed(e, m->vocab) < 0) {
            snprintf(what, sizeof what, "step entry %u: the mask allows no token", i);
            return fail(m, EH_INVALID_ARGUMENT, what);
        }
        if ((e->flags & EH_STEP_SAMPLE) && !s->has_sampler) {
            snprintf(what, sizeof what, "step entry %u: sampling before seq_set_sampling", i);
            return fail(m, EH_INVALID_ARGUMENT, what);
        }
        if ((uint64_t)s->length + e->n_tokens > m->kv.max_seq_tokens) {
            snprintf(what, sizeof what, "step entry %u: past max_seq_tokens", i);
            return fail(m, EH_INVALID_ARGUMENT, what);
        }
        total += e->n_tokens;
        blocks += needs_block(s);
    }
    if (total > m->kv.max_step_tokens) return fail(m, EH_INVALID_ARGUMENT, "step: more tokens than max_step_tokens");
    if (blocks > m->kv.free_blocks) return fail(m, EH_KV_FULL, "step: not enough free KV blocks");

    for (uint32_t i = 0; i < n; ++i) {
        eh_step_entry* e = entry_at(entries, i);
        hello_seq* s = (hello_seq*)e->seq;
        if (needs_block(s)) { /* a first block, or a copy of a shared one */
            drop_block(s);
            s->block = take_block(m);
        }
        const int decode = s->sampled_last && e->n_tokens == 1;
        memcpy(s->tokens + s->length, e->tokens, e->n_tokens * sizeof(int32_t));
        s->length += e->n_tokens;
        s->sampled_last = (e->flags & EH_STEP_SAMPLE) != 0;
        e->token = -1;
        if (!s->sampled_last) continue;
        if (!decode || s->cursor == 0) s->cursor = s->length; /* a new prompt: replay it from its end */
        e->token = s->tokens[--s->cursor];                     /* the prompt, backwards */
        if (s->cursor == 0) s->cursor = s->length;
        if (!allowed(e, e->token)) e->token = first_allowed(e, m->vocab);
    }
    return EH_OK;
}

static const eh_plugin_api api = {
    sizeof(eh_plugin_api), EH_ABI_MAJOR, EH_ABI_MINOR,
    info, plugin_last_error, probe,
    model_load, model_get_info, model_check_residency, model_last_error, model_release,
    /* session_*: none (ABI 1.4, the step is the forward path) */
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    kv_init, kv_get_info, seq_create, seq_fork, seq_truncate, seq_set_sampling, seq_length,
    NULL, /* seq_logits: optional, not offered */
    seq_release, step,
    NULL, NULL, /* step_begin, step_end: optional (1.3), not offered */
    NULL,       /* seq_hidden: optional (1.5), not offered */
    NULL, NULL, NULL, /* adapter_load, adapter_release, seq_set_adapter: optional (1.6), not offered */
    NULL, NULL, NULL, /* image_encoder_load, image_encode, seq_embd_spans: optional (1.6), not offered */
    NULL, NULL, NULL, /* seq_park, seq_unpark, parked_release: optional (1.7), not offered */
    NULL,             /* image_encode_sized: optional (1.8), not offered */
};

EH_PLUGIN_EXPORT const eh_plugin_api* eh_plugin_entry(uint16_t host_major, uint16_t host_minor) {
    /* Speaks 1.4: an older host would need the session calls. */
    return host_major == EH_ABI_MAJOR && host_minor >= 4 ? &api : NULL;
}
