// The device entry points in a build without CUDA: each reports kUnsupported, so callers pick
// the CPU reference (or another path) at run time instead of by #ifdef.
#include "kernels/decode_attention.h"
#include "kernels/gather.h"
#include "kernels/plan_copy.h"
#include "kernels/write_tokens.h"

namespace kv::kernels {
namespace {
Status NoCuda(const char* what) {
  return Status::Unsupported(std::string(what) + ": this build has no CUDA");
}
}  // namespace

Status LaunchPlanCopy(const void*, void*, const void*, size_t, uint64_t, const PlanCopyOptions&,
                      void*) {
  return NoCuda("plan copy kernel");
}

struct PlanCopier::Impl {};
PlanCopier::PlanCopier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PlanCopier::~PlanCopier() = default;
Result<std::unique_ptr<PlanCopier>> PlanCopier::Create(const PlanCopyOptions&) {
  return NoCuda("plan copier");
}
Status PlanCopier::Copy(const void*, void*, std::span<const Run>, void*) {
  return NoCuda("plan copier");
}
Status PlanCopier::CopyGroups(const void*, void*, std::span<const RunGroup>, void*) {
  return NoCuda("plan copier");
}
Status PlanCopier::CopyBlocks(const void*, void*, std::span<const GroupBlocks>, void*) {
  return NoCuda("plan copier");
}
Status LaunchPlanCopyGroups(const void*, void*, const void*, uint64_t, const PlanCopyOptions&,
                            void*) {
  return NoCuda("plan copy group kernel");
}
Status LaunchPlanCopyBlocks(const void*, void*, const void*, uint64_t, const PlanCopyOptions&,
                            void*) {
  return NoCuda("plan copy block kernel");
}

Status LaunchBatchCopy(const void*, void*, std::span<const Run>, void*) {
  return NoCuda("batch copy");
}

Status LaunchGather(const StridedKv&, const void*, const int64_t*, int64_t, const PageSlice&, void*,
                    void*) {
  return NoCuda("gather kernel");
}
Status LaunchScatter(const StridedKv&, void*, const int64_t*, int64_t, const PageSlice&,
                     const void*, void*) {
  return NoCuda("scatter kernel");
}

Status LaunchWriteTokens(const PagedKv&, void*, const NewTokens&, void*) {
  return NoCuda("write-tokens kernel");
}

Status LaunchDecodeAttention(const PagedKv&, const void*, const DecodeAttentionArgs&, void*,
                             uint64_t, void*) {
  return NoCuda("decode attention kernel");
}

}  // namespace kv::kernels
