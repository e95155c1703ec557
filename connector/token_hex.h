// Transfer tokens as the C API carries them (<kv/kv_connector.h>: kv_transfer_params and
// kv_request_finished_with_token, kv_set_transfer_token): lowercase hex of the raw bytes the C++
// API uses.
// Pure functions; errors are kInvalidArgument naming the field, never the token.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "kv/status.h"

namespace kv::connector {

// Two lowercase hex digits per byte.
std::string TokenToHex(std::string_view bytes);
// The bytes of NUL-terminated `hex` (either case), which holds an even number of digits, at most
// `max_chars`; only the first max_chars + 1 characters are read.
Result<std::string> TokenFromHex(const char* hex, size_t max_chars);

}  // namespace kv::connector
