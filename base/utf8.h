// UTF-8 checks for text that goes into protobuf `string` fields. proto3 parsers refuse a message
// whose string field is not valid UTF-8, so one stray byte in an error text (say, one byte of a
// multi-byte character quoted from an engine's input) would make the whole reply unreadable to
// the engine. Thread-safe (pure functions).
#pragma once

#include <string>
#include <string_view>

namespace kv {

// True if `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool IsValidUtf8(std::string_view text);

// `text` with every byte that is not part of a well-formed UTF-8 sequence written as "\xNN";
// well-formed text comes back unchanged.
std::string ToValidUtf8(std::string_view text);

}  // namespace kv
