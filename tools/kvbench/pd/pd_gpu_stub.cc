// CudaPdEngines in a build without CUDA: `--memory cuda` says what it needs.
#include "tools/kvbench/pd/pd_gpu.h"

namespace kv::connector {

int CudaDeviceCount() {
  return 0;
}

Result<std::unique_ptr<CudaPdEngines>> CudaPdEngines::Create(const PdConfig&, int, int) {
  return Status::Unsupported("--memory cuda needs a build with CUDA (this one has none)");
}

}  // namespace kv::connector
