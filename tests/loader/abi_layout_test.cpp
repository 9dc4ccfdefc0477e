// Pins the ABI's layout. If one of these fails, a change broke binary
// compatibility with plugins already built: append members instead.
#include <gtest/gtest.h>

#include <cstddef>

#include <engine_host/plugin_abi.h>
#include <engine_host/tensor_types.h>

#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"

static_assert(EH_ABI_MAJOR == 1);
static_assert(offsetof(eh_plugin_api, struct_size) == 0);
static_assert(offsetof(eh_plugin_api, abi_major) == 4);
static_assert(offsetof(eh_plugin_api, abi_minor) == 6);
static_assert(offsetof(eh_plugin_api, info) == 8);
static_assert(offsetof(eh_plugin_api, plugin_last_error) == 16);
static_assert(offsetof(eh_plugin_api, probe) == 24);
static_assert(offsetof(eh_plugin_api, model_load) == 32);
static_assert(offsetof(eh_plugin_api, model_get_info) == 40);
static_assert(offsetof(eh_plugin_api, model_check_residency) == 48);
static_assert(offsetof(eh_plugin_api, model_last_error) == 56);
static_assert(offsetof(eh_plugin_api, model_release) == 64);
static_assert(offsetof(eh_plugin_api, session_create) == 72);
static_assert(offsetof(eh_plugin_api, session_set_sampling) == 80);
static_assert(offsetof(eh_plugin_api, session_prefill) == 88);
static_assert(offsetof(eh_plugin_api, session_sample) == 96);
static_assert(offsetof(eh_plugin_api, session_decode) == 104);
static_assert(offsetof(eh_plugin_api, session_reset) == 112);
static_assert(offsetof(eh_plugin_api, session_n_past) == 120);
static_assert(offsetof(eh_plugin_api, session_logits) == 128);
static_assert(offsetof(eh_plugin_api, session_last_error) == 136);
static_assert(offsetof(eh_plugin_api, session_release) == 144);  // end of the 1.0/1.1 table
static_assert(offsetof(eh_plugin_api, kv_init) == 152);           // 1.2
static_assert(offsetof(eh_plugin_api, kv_get_info) == 160);
static_assert(offsetof(eh_plugin_api, seq_create) == 168);
static_assert(offsetof(eh_plugin_api, seq_fork) == 176);
static_assert(offsetof(eh_plugin_api, seq_truncate) == 184);
static_assert(offsetof(eh_plugin_api, seq_set_sampling) == 192);
static_assert(offsetof(eh_plugin_api, seq_length) == 200);
static_assert(offsetof(eh_plugin_api, seq_logits) == 208);
static_assert(offsetof(eh_plugin_api, seq_release) == 216);
static_assert(offsetof(eh_plugin_api, step) == 224);               // end of the 1.2 table
static_assert(offsetof(eh_plugin_api, step_begin) == 232);         // 1.3
static_assert(offsetof(eh_plugin_api, step_end) == 240);         // end of the 1.3 and 1.4 table
static_assert(offsetof(eh_plugin_api, seq_hidden) == 248);       // 1.5
static_assert(offsetof(eh_plugin_api, adapter_load) == 256);     // 1.6
static_assert(offsetof(eh_plugin_api, adapter_release) == 264);
static_assert(offsetof(eh_plugin_api, seq_set_adapter) == 272);
static_assert(offsetof(eh_plugin_api, image_encoder_load) == 280);  // 1.6, images in
static_assert(offsetof(eh_plugin_api, seq_embd_spans) == 296);
static_assert(offsetof(eh_plugin_api, seq_park) == 304);         // 1.7, the host-memory tier
static_assert(offsetof(eh_plugin_api, seq_unpark) == 312);
static_assert(offsetof(eh_plugin_api, parked_release) == 320);
static_assert(offsetof(eh_plugin_api, image_encode_sized) == 328);  // 1.8, images of any size
static_assert(sizeof(eh_plugin_api) == 336);
static_assert(offsetof(eh_adapter_params, view) == 8);
static_assert(offsetof(eh_adapter_params, scale) == 16);
static_assert(offsetof(eh_adapter_params, alpha) == 20);
static_assert(sizeof(eh_adapter_params) == 24);

static_assert(sizeof(eh_string) == 16);
static_assert(sizeof(eh_value) == 32);
static_assert(offsetof(eh_value, v) == 16);
static_assert(sizeof(eh_metadata_kv) == 48);
static_assert(offsetof(eh_tensor, type) == 16);
static_assert(offsetof(eh_tensor, dims) == 24);
static_assert(offsetof(eh_tensor, data) == 56);
static_assert(sizeof(eh_tensor) == 72);
static_assert(offsetof(eh_model_view, architecture) == 8);
static_assert(offsetof(eh_model_view, n_metadata) == 24);
static_assert(offsetof(eh_model_view, tensors) == 48);
static_assert(sizeof(eh_model_view) == 56);

static_assert(offsetof(eh_plugin_info, name) == 8);
static_assert(offsetof(eh_plugin_info, device_kind) == 56);
static_assert(offsetof(eh_plugin_info, max_devices) == 64);  // 1.6
static_assert(sizeof(eh_plugin_info) == 72);
static_assert(offsetof(eh_probe_result, reason) == 8);
static_assert(offsetof(eh_probe_result, device_name) == 264);
static_assert(offsetof(eh_probe_result, total_memory_bytes) == 408);
static_assert(sizeof(eh_probe_result) == 424);
static_assert(offsetof(eh_load_params, view) == 16);
static_assert(offsetof(eh_load_params, progress) == 40);
static_assert(offsetof(eh_load_params, cancel_user) == 64);
static_assert(offsetof(eh_load_params, n_devices) == 72);  // 1.6
static_assert(offsetof(eh_load_params, devices) == 80);
static_assert(sizeof(eh_load_params) == 88);
static_assert(offsetof(eh_model_info, context_length) == 68);
static_assert(offsetof(eh_model_info, device_bytes_used) == 80);
static_assert(offsetof(eh_model_info, runtime_version) == 228);  // end of the 1.0 layout
static_assert(offsetof(eh_model_info, kv_bytes_per_token) == 232);  // 1.1
static_assert(sizeof(eh_model_info) == 240);
static_assert(sizeof(eh_session_params) == 24);
static_assert(offsetof(eh_sampling_params, seed) == 32);
static_assert(offsetof(eh_sampling_params, presence_penalty) == 40);  // 1.2
static_assert(offsetof(eh_sampling_params, frequency_penalty) == 44);
static_assert(sizeof(eh_sampling_params) == 48);
static_assert(offsetof(eh_kv_params, budget_bytes) == 24);
static_assert(offsetof(eh_kv_params, kv_type) == 36);  // 1.4, in the padding that ended the 1.2 struct
static_assert(offsetof(eh_kv_params, reserved) == 40);  // so the 1.4 struct is 48 bytes, a 1.2 one 40
static_assert(sizeof(eh_kv_params) == 48);
static_assert(offsetof(eh_kv_info, block_bytes) == 16);
static_assert(offsetof(eh_kv_info, kv_type) == 40);  // 1.4; a 1.2 struct is 40 bytes
static_assert(sizeof(eh_kv_info) == 48);
static_assert(offsetof(eh_kv_info, max_draft_tokens) == 44);  // 1.6, in the 1.4 struct's padding
static_assert(sizeof(eh_step_entry) == 64);
static_assert(offsetof(eh_embd_span, rows) == 16);  // 1.6, images in
static_assert(sizeof(eh_embd_span) == 24);
static_assert(offsetof(eh_image_encoder_info, span_flags) == 20);
static_assert(offsetof(eh_image_encoder_info, mean) == 24);
static_assert(offsetof(eh_image_encoder_info, tile) == 48);  // 1.8, appended
static_assert(sizeof(eh_image_encoder_info) == 64);
static_assert(offsetof(eh_embd_span, grid_width) == 12);  // 1.8, was reserved
static_assert(offsetof(eh_step_entry, seq) == 8);
static_assert(offsetof(eh_step_entry, tokens) == 16);
static_assert(offsetof(eh_step_entry, n_tokens) == 24);
static_assert(offsetof(eh_step_entry, bias_tokens) == 32);
static_assert(offsetof(eh_step_entry, allowed) == 48);
static_assert(offsetof(eh_step_entry, token) == 56);
static_assert(offsetof(eh_step_entry, n_accepted) == 60);  // 1.6, in the 1.2 struct's padding

// Status and type numbers are stable too: they travel in logs and files.
static_assert(EH_VRAM_OOM == 5 && EH_INTERNAL == 9 && EH_KV_FULL == 10);
static_assert(EH_STEP_SAMPLE == 1 && EH_STEP_LOGITS == 2 && EH_STEP_CHAINED == 4 && EH_STEP_HIDDEN == 8);  // 1.5: HIDDEN
static_assert(EH_TYPE_Q4_K == 12 && EH_TYPE_BF16 == 30 && EH_TYPE_MXFP4 == 39);

TEST(AbiLayout, TypeTraitsMatchTheGgmlBlockLayouts) {
    EXPECT_EQ(eh_tensor_type_traits(EH_TYPE_Q4_K).block_bytes, 144u);
    EXPECT_EQ(eh_tensor_type_traits(EH_TYPE_Q6_K).block_bytes, 210u);
    EXPECT_EQ(eh_tensor_type_traits(EH_TYPE_Q8_0).block_bytes, 34u);
    EXPECT_EQ(eh_tensor_type_traits(EH_TYPE_MXFP4).block_bytes, 17u);
    EXPECT_EQ(eh_tensor_type_traits(EH_TYPE_MXFP4).block_elems, 32u);
    EXPECT_EQ(eh_tensor_type_traits(4).block_bytes, 0u);  // removed Q4_2: unknown
    EXPECT_EQ(eh_tensor_type_traits(4).name, nullptr);
}

TEST(AbiLayout, StatusNamesAreStable) {
    EXPECT_STREQ(eh_status_name(EH_INSUFFICIENT_VRAM), "INSUFFICIENT_VRAM");
    EXPECT_STREQ(eh_status_name(static_cast<eh_status>(42)), "UNKNOWN_STATUS");
}

namespace {

using eh::loader::api_table_size;
using Change = void (*)(eh_plugin_api&);

// A group of calls that ABI minor `minor` added is read only from a table
// that says `minor`, is that minor's size and has every call `fill` sets
// (the batched step among them): true for such a table; false for one that
// says the minor before, for one of the minor before's size, and after each
// of `drops`.
void expect_group_gate(bool (*has)(const eh_plugin_api&), uint16_t minor, Change fill,
                       std::initializer_list<Change> drops) {
    auto full = [&] {
        eh_plugin_api api{};
        api.abi_major = 1;
        api.abi_minor = minor;
        api.struct_size = sizeof(eh_plugin_api);
        fill(api);
        return api;
    };
    EXPECT_TRUE(has(full()));
    eh_plugin_api older = full();
    older.abi_minor = uint16_t(minor - 1);
    EXPECT_FALSE(has(older));
    eh_plugin_api shorter = full();
    shorter.struct_size = uint32_t(api_table_size(uint16_t(minor - 1)));
    EXPECT_FALSE(has(shorter));
    for (Change drop : drops) {
        eh_plugin_api api = full();
        drop(api);
        EXPECT_FALSE(has(api));
    }
}

void set_step(eh_plugin_api& api) { api.step = [](eh_model*, eh_step_entry*, uint32_t) { return EH_OK; }; }
void no_step(eh_plugin_api& api) { api.step = nullptr; }

}  // namespace

// 1.5's seq_hidden is read only from a table that is 1.5's size and says
// 1.5 (a 1.4 table ends before it, whatever lies past its end), beside the
// batched step.
TEST(AbiLayout, HiddenStatesOnlyFromA15Table) {
    static_assert(api_table_size(4) == offsetof(eh_plugin_api, seq_hidden));
    static_assert(api_table_size(5) == offsetof(eh_plugin_api, adapter_load));
    expect_group_gate(
        eh::loader::api_has_hidden, 5,
        [](eh_plugin_api& api) {
            set_step(api);
            api.seq_hidden = [](eh_seq*, const float**, uint32_t*) { return EH_OK; };
        },
        {[](eh_plugin_api& api) { api.seq_hidden = nullptr; }, no_step});
}

// 1.6's adapter calls are read only from a table that is 1.6's size, says
// 1.6, has all three and the batched step: a 1.5 table ends before them.
TEST(AbiLayout, AdaptersOnlyFromA16TableWithAllThree) {
    static_assert(api_table_size(6) == offsetof(eh_plugin_api, seq_park));
    expect_group_gate(
        eh::loader::api_has_adapters, 6,
        [](eh_plugin_api& api) {
            set_step(api);
            api.adapter_load = [](eh_model*, const eh_adapter_params*, eh_adapter**) { return EH_OK; };
            api.adapter_release = [](eh_adapter*) {};
            api.seq_set_adapter = [](eh_seq*, eh_adapter*) { return EH_OK; };
        },
        {[](eh_plugin_api& api) { api.seq_set_adapter = nullptr; }, no_step});
}

// 1.7's park calls are read only from a table that is 1.7's size, says
// 1.7, has all three and the batched step: a 1.6 table ends before them.
TEST(AbiLayout, ParkOnlyFromA17TableWithAllThree) {
    static_assert(api_table_size(7) == offsetof(eh_plugin_api, image_encode_sized));
    expect_group_gate(
        eh::loader::api_has_park, 7,
        [](eh_plugin_api& api) {
            set_step(api);
            api.seq_park = [](eh_seq*, uint32_t, uint64_t, eh_parked**, uint64_t*) { return EH_OK; };
            api.seq_unpark = [](eh_model*, const eh_parked*, const int32_t*, uint32_t, eh_seq**) { return EH_OK; };
            api.parked_release = [](eh_parked*) {};
        },
        {[](eh_plugin_api& api) { api.parked_release = nullptr; }, no_step});
}

// 1.6's eh_plugin_info.max_devices is read only from a 1.6 table whose info
// is long enough to hold it; every other plugin serves one device.
namespace {
eh_plugin_info g_info{};
const eh_plugin_info* info_fn() { return &g_info; }
}  // namespace

TEST(AbiLayout, MaxDevicesOnlyFromA16InfoLongEnough) {
    eh_plugin_api api{};
    api.abi_major = 1;
    api.abi_minor = 6;
    api.info = &info_fn;
    g_info = {};
    g_info.struct_size = sizeof(eh_plugin_info);
    g_info.max_devices = 8;
    EXPECT_EQ(eh::plugin_max_devices(api), 8u);
    g_info.max_devices = 0;  // 0 says one device, like 1
    EXPECT_EQ(eh::plugin_max_devices(api), 1u);
    g_info.max_devices = 8;
    g_info.struct_size = 64;  // a 1.5 plugin's info ends before the member
    EXPECT_EQ(eh::plugin_max_devices(api), 1u);
    g_info.struct_size = sizeof(eh_plugin_info);
    api.abi_minor = 5;
    EXPECT_EQ(eh::plugin_max_devices(api), 1u);
}

// 1.8's sized image call is read only from a table that is 1.8's size, says
// 1.8 and has the 1.6 image group: a 1.7 table ends before it.
TEST(AbiLayout, SizedImagesOnlyFromA18TableWithTheImageGroup) {
    static_assert(api_table_size(8) == sizeof(eh_plugin_api));
    expect_group_gate(
        eh::loader::api_has_sized_images, 8,
        [](eh_plugin_api& api) {
            set_step(api);
            api.image_encoder_load = [](eh_model*, const eh_model_view*, eh_image_encoder_info*) { return EH_OK; };
            api.image_encode = [](eh_model*, const float*, float*) { return EH_OK; };
            api.seq_embd_spans = [](eh_seq*, const eh_embd_span*, uint32_t) { return EH_OK; };
            api.image_encode_sized = [](eh_model*, const float*, uint32_t, uint32_t, float*) { return EH_OK; };
        },
        {[](eh_plugin_api& api) { api.seq_embd_spans = nullptr; },
         [](eh_plugin_api& api) { api.image_encode_sized = nullptr; }});
}
