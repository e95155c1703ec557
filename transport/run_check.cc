#include "transport/run_check.h"

#include <string>

namespace kv::transport {

Status CheckBatch(const Batch& batch, bool takes_groups, bool takes_blocks) {
  if (batch.local == nullptr || batch.remote == nullptr)
    return Status::InvalidArgument("batch needs a local registration and a remote descriptor");
  if (!batch.groups.empty() && !takes_groups)
    return Status::Unsupported("this transport takes no run groups: expand them into runs");
  if (!batch.blocks.empty() && !takes_blocks)
    return Status::Unsupported("this transport takes no blocks of run groups: expand them");
  const uint64_t local_bytes = batch.local->length();
  const uint64_t remote_bytes = batch.remote->length();
  const bool put = batch.op == Op::kPut;
  const uint64_t src_bytes = put ? local_bytes : remote_bytes;
  const uint64_t dst_bytes = put ? remote_bytes : local_bytes;
  Status s = ValidateRuns(batch.runs, src_bytes, dst_bytes);
  if (s.ok()) s = ValidateGroups(batch.groups, src_bytes, dst_bytes);
  if (s.ok()) s = ValidateBlocks(batch.blocks, src_bytes, dst_bytes);
  return s.WithContext(put ? "put (src local, dst remote)" : "get (src remote, dst local)");
}

}  // namespace kv::transport
