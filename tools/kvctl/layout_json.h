// Reads a layout file (JSON) into a LayoutSpec. kvctl's file format, documented in `kvctl plan
// --help`; the layout library itself does no I/O.
//
//   {"order": "LBNHC", "layers": 32, "blocks": 1024, "heads": 8, "block_size": 16,
//    "content_bytes": 512,
//    "strides": {"B": 65536},                      optional, bytes; absent axes dense
//    "tp_rank": 0, "tp_size": 1, "total_heads": 8, optional; total_heads 0 or absent means
//                                                   heads x tp_size (heads when replicated)
//    "replicated": false,                          optional; true for MLA-style caches
//    "region_bytes": 0}                            optional; registered size, 0: the span
#pragma once

#include <string>

#include "layout/kv_region.h"
#include "base/status.h"

namespace kv::tools {

// Unknown keys, missing required keys, non-integers and an invalid layout are errors whose
// message names the file and the key. The spec is not yet validated by KvRegion::Create.
Result<LayoutSpec> ReadLayoutFile(const std::string& path);

// ReadLayoutFile, then KvRegion::Create; errors name the file.
Result<KvRegion> LoadRegion(const std::string& path);

// The file format, for --help texts.
const char* LayoutFileHelp();

}  // namespace kv::tools
