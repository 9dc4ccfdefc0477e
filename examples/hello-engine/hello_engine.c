/*
 * hello-engine: the smallest complete engine plugin, in plain C, to show the
 * shape of the ABI. It "generates" by replaying the prompt backwards, so it
 * needs no weights: any GGUF with architecture "hello" will do.
 */
#include <engine_host/plugin_abi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct hello_model {
    uint32_t vocab;
    char last_error[128];
} hello_model;

typedef struct hello_session {
    hello_model* model;
    int32_t* tokens; /* the context, n_ctx long */
    uint32_t n_ctx, n_past, cursor;
    char last_error[128];
} hello_session;

static const char* const formats[] = {"gguf", NULL};
static const char* const archs[] = {"hello", NULL};
static const char* const quants[] = {"F32", NULL};
static const eh_plugin_info info_v = {sizeof(eh_plugin_info), "hello-engine", "0.1.0", "hello",
                                      formats, archs, quants, EH_DEVICE_CPU, 0};
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
static void model_release(eh_model* m) { free(m); }

static eh_status session_create(eh_model* model, const eh_session_params* p, eh_session** out) {
    hello_session* s = calloc(1, sizeof *s);
    if (s) s->tokens = calloc(p->n_ctx ? p->n_ctx : 1, sizeof(int32_t));
    if (!s || !s->tokens) {
        if (s) free(s);
        snprintf(((hello_model*)model)->last_error, 128, "out of memory");
        return EH_INTERNAL;
    }
    s->model = (hello_model*)model;
    s->n_ctx = p->n_ctx;
    *out = (eh_session*)s;
    return EH_OK;
}

static eh_status session_set_sampling(eh_session* s, const eh_sampling_params* p) {
    (void)s;
    (void)p; /* this engine is always "greedy" */
    return EH_OK;
}

static eh_status append(hello_session* s, const int32_t* t, uint32_t n) {
    if (s->n_past + n > s->n_ctx) {
        snprintf(s->last_error, sizeof s->last_error, "context full (%u of %u used)", s->n_past, s->n_ctx);
        return EH_CONTEXT_FULL;
    }
    memcpy(s->tokens + s->n_past, t, n * sizeof *t);
    s->n_past += n;
    return EH_OK;
}

static eh_status session_prefill(eh_session* sess, const int32_t* t, uint32_t n) {
    hello_session* s = (hello_session*)sess;
    eh_status st = append(s, t, n);
    if (st == EH_OK) s->cursor = s->n_past;
    return st;
}

static eh_status session_sample(eh_session* sess, int32_t* out) {
    hello_session* s = (hello_session*)sess;
    if (s->cursor == 0) {
        snprintf(s->last_error, sizeof s->last_error, "prefill first");
        return EH_INVALID_ARGUMENT;
    }
    *out = s->tokens[--s->cursor]; /* the prompt, backwards */
    if (s->cursor == 0) s->cursor = s->n_past;
    return EH_OK;
}

static eh_status session_decode(eh_session* sess, int32_t token, int32_t* out) {
    hello_session* s = (hello_session*)sess;
    uint32_t keep = s->cursor;
    eh_status st = append(s, &token, 1);
    if (st != EH_OK) return st;
    s->cursor = keep;
    return session_sample(sess, out);
}

static eh_status session_reset(eh_session* s) {
    ((hello_session*)s)->n_past = ((hello_session*)s)->cursor = 0;
    return EH_OK;
}
static uint32_t session_n_past(const eh_session* s) { return ((const hello_session*)s)->n_past; }
static const char* session_last_error(const eh_session* s) { return ((const hello_session*)s)->last_error; }
static void session_release(eh_session* sess) {
    hello_session* s = (hello_session*)sess;
    free(s->tokens);
    free(s);
}

static const eh_plugin_api api = {
    sizeof(eh_plugin_api), EH_ABI_MAJOR, EH_ABI_MINOR,
    info, plugin_last_error, probe,
    model_load, model_get_info, model_check_residency, model_last_error, model_release,
    session_create, session_set_sampling, session_prefill, session_sample, session_decode,
    session_reset, session_n_past,
    NULL, /* session_logits: optional, not offered */
    session_last_error, session_release,
};

EH_PLUGIN_EXPORT const eh_plugin_api* eh_plugin_entry(uint16_t host_major, uint16_t host_minor) {
    (void)host_minor;
    return host_major == EH_ABI_MAJOR ? &api : NULL;
}
