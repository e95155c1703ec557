// The planner's core, shared by PlanTransfer (plan.cc) and LayerPlan (layer_plan.cc); not part
// of layout/plan.h's contract.
#pragma once

#include "base/status.h"
#include "layout/kv_region.h"
#include "layout/plan.h"

namespace kv::internal {

// What PlanInto made of a request to plan blocks.
enum class Blocks {
  kNo,         // not asked, or not of the shape: written as groups
  kAsk,        // asked (in)
  kWritten,    // every page went to plan->blocks
  kAbandoned,  // a block would have changed the runs: what was written must be planned again
};

// PlanTransfer's runs appended to *plan, or with `groups` the same rows as groups (RunWriter).
// With *blocks kAsk too, where the heads (one loop around a page's tokens) repeat the page's
// one group at one step, each page's groups go to plan->blocks as one entry (see Blocks).
Status PlanInto(const KvRegion& src, const KvRegion& dst, const TransferSpec& spec, Plan* plan,
                bool groups, Blocks* blocks = nullptr);

}  // namespace kv::internal
