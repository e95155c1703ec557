#include "transport/run_check.h"

#include <string>

namespace kv::transport {

Status CheckBatch(const Batch& batch) {
  if (batch.local == nullptr || batch.remote == nullptr)
    return Status::InvalidArgument("batch needs a local registration and a remote descriptor");
  const uint64_t local_bytes = batch.local->length();
  const uint64_t remote_bytes = batch.remote->length();
  const bool put = batch.op == Op::kPut;
  Status s =
      ValidateRuns(batch.runs, put ? local_bytes : remote_bytes, put ? remote_bytes : local_bytes);
  return s.WithContext(put ? "put (src local, dst remote)" : "get (src remote, dst local)");
}

}  // namespace kv::transport
