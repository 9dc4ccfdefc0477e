// The recognizer's state as data: a set of parse stacks over a Grammar's
// flat positions (top last), each stack's top a byte-set position (rules
// are expanded as soon as they come to the top). Canonical form: stacks
// sorted and unique, flattened as [len, pos...] per stack, so equal states
// have equal keys. An empty stack means the input so far is a full match.
#pragma once

#include <cstdint>
#include <vector>

#include "eh/constrain/grammar.hpp"

namespace eh::constrain::detail {

using StateKey = std::vector<uint32_t>;

// Stands for "whatever the full state has below here" at the bottom of a
// truncated stack (truncate_key). A stack whose top is kContext can take no
// byte: the input has left the frames the truncated state knows.
inline constexpr uint32_t kContext = UINT32_MAX;

StateKey start_key(const Grammar& g, size_t max_stacks, size_t max_depth);
// The state after `byte`; empty if no stack takes it. Adds the parse steps
// it took (at least 1) to *steps.
StateKey advance_key(const Grammar& g, const StateKey& key, uint8_t byte, size_t max_stacks, size_t max_depth,
                     size_t* steps = nullptr);
// The state with every count of a counted repeat (Grammar::chains) above
// `limit` lowered to `limit`: for input of at most `limit` bytes the same
// state (each copy takes a byte at least), so it has the same token mask
// when `limit` is the longest token's length.
StateKey clamp_counts(const Grammar& g, const StateKey& key, uint32_t limit);
bool key_accepting(const StateKey& key);
bool key_complete(const StateKey& key);  // only the empty stack is left
bool key_has_context(const StateKey& key);  // some stack has popped down to kContext
// The state without the bottom positions all its stacks share (replaced by
// kContext), or `key` itself when they share none; the deepest stack length
// and the stack count of `key` come back too.
StateKey truncate_key(const StateKey& key, size_t& max_len, size_t& stacks);

}  // namespace eh::constrain::detail
