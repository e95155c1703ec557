// Builds without CUDA: engine pages in GPU memory cannot be offloaded.
#include "daemon/offload/page_mover.h"

namespace kv::offload {

Result<std::unique_ptr<PageMover>> CreateCudaPageMover(int device, const CudaMoverOptions&) {
  return Status::Unsupported("cannot offload pages of cuda:" + std::to_string(device) +
                             ": this build of kvd has no CUDA support");
}

}  // namespace kv::offload
