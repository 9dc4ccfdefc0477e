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

StateKey start_key(const Grammar& g, size_t max_stacks, size_t max_depth);
// The state after `byte`; empty if no stack takes it.
StateKey advance_key(const Grammar& g, const StateKey& key, uint8_t byte, size_t max_stacks, size_t max_depth);
bool key_accepting(const StateKey& key);
bool key_complete(const StateKey& key);  // only the empty stack is left

}  // namespace eh::constrain::detail
