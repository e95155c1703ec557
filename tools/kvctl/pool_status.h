// The offload pool's figures as a running kvd reports them (DaemonStatus.offload), rendered the
// way `kvctl offload --probe` prints a pool, for `kvctl status` and `kvctl offload --daemon`.
#pragma once

#include <string>

#include "protocol/kvd.pb.h"

namespace kv::tools {

// One JSON object: {"enabled": ..., "shape": ..., then the keys of offload::ToJson}.
std::string PoolStatusJson(const proto::OffloadStatus& s);
// `text` as a JSON string, quotes, backslashes and control characters escaped: names and shapes
// come from another process, and the JSON must stay JSON whatever they hold.
std::string JsonQuoted(const std::string& text);
// Lines for people; "offload    off (start kvd with --offload-bytes)" without a pool.
std::string PoolStatusText(const proto::OffloadStatus& s);

}  // namespace kv::tools
