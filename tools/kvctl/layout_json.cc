#include "tools/kvctl/layout_json.h"

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <charconv>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

namespace kv::tools {
namespace {

namespace pt = boost::property_tree;

// Layout files are a few hundred bytes; anything far larger is not one.
constexpr std::streamsize kMaxFileBytes = 1 << 20;

Result<int64_t> Integer(const std::string& path, const std::string& key, const pt::ptree& node) {
  const std::string& text = node.data();
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (!node.empty() || text.empty() || ec != std::errc() || end != text.data() + text.size())
    return Status::InvalidArgument(path + ": '" + key + "' must be an integer, got '" + text + "'");
  return value;
}

Result<int> SmallInteger(const std::string& path, const std::string& key, const pt::ptree& node) {
  KV_ASSIGN_OR_RETURN(int64_t value, Integer(path, key, node));
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max())
    return Status::InvalidArgument(path + ": '" + key +
                                   "' is out of range: " + std::to_string(value));
  return static_cast<int>(value);
}

Status ReadStrides(const std::string& path, const pt::ptree& node, LayoutSpec& spec) {
  if (!node.data().empty())
    return Status::InvalidArgument(path + ": 'strides' must be an object of axis: bytes");
  for (const auto& [axis, value] : node) {
    const std::optional<Axis> index = axis.size() == 1 ? AxisFromName(axis[0]) : std::nullopt;
    if (!index)
      return Status::InvalidArgument(path + ": unknown axis 'strides." + axis +
                                     "' (axes are L, B, H, N, S, C)");
    KV_ASSIGN_OR_RETURN(spec.strides[static_cast<int>(*index)],
                        Integer(path, "strides." + axis, value));
  }
  return Status::Ok();
}

}  // namespace

const char* LayoutFileHelp() {
  return R"(Layout file (JSON):
  {"order": "LBNHC", "layers": 32, "blocks": 1024, "heads": 8, "block_size": 16,
   "content_bytes": 512,
   "strides": {"B": 65536},    optional, bytes per step of an axis; absent axes dense
   "tp_rank": 0, "tp_size": 1, optional; defaults 0 and 1
   "total_heads": 8,           optional; default heads x tp_size (heads when replicated)
   "replicated": false,        optional; true for MLA-style caches on every rank
   "region_bytes": 0}          optional; the registered size the strides must fit in
  order is outermost first: LBNHC (vLLM's default), LBHNC, LHBNC, BLHNC, BLNHC, BHLNC, or a
  legacy form with a K/V axis S (SBNHC, BSNHC), where content_bytes is K (or V) alone.
  heads is the local head count of this rank; C (content_bytes) packs K then V.
)";
}

Result<LayoutSpec> ReadLayoutFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().size() > static_cast<size_t>(kMaxFileBytes))
    return Status::InvalidArgument(path + ": larger than 1 MiB, not a layout file");
  pt::ptree root;
  try {
    pt::read_json(text, root);
  } catch (const pt::json_parser_error& e) {
    return Status::InvalidArgument(path + ": not valid JSON: " + e.message() + " (line " +
                                   std::to_string(e.line()) + ")");
  }

  LayoutSpec spec;
  std::set<std::string> seen;
  for (const auto& [key, node] : root) {
    if (!seen.insert(key).second)
      return Status::InvalidArgument(path + ": key '" + key + "' appears twice");
    if (key == "order") {
      if (!node.empty()) return Status::InvalidArgument(path + ": 'order' must be a string");
      spec.order = node.data();
    } else if (key == "layers") {
      KV_ASSIGN_OR_RETURN(spec.layers, Integer(path, key, node));
    } else if (key == "blocks") {
      KV_ASSIGN_OR_RETURN(spec.blocks, Integer(path, key, node));
    } else if (key == "heads") {
      KV_ASSIGN_OR_RETURN(spec.heads, Integer(path, key, node));
    } else if (key == "block_size") {
      KV_ASSIGN_OR_RETURN(spec.block_size, Integer(path, key, node));
    } else if (key == "content_bytes") {
      KV_ASSIGN_OR_RETURN(spec.content_bytes, Integer(path, key, node));
    } else if (key == "strides") {
      KV_RETURN_IF_ERROR(ReadStrides(path, node, spec));
    } else if (key == "tp_rank") {
      KV_ASSIGN_OR_RETURN(spec.tp_rank, SmallInteger(path, key, node));
    } else if (key == "tp_size") {
      KV_ASSIGN_OR_RETURN(spec.tp_size, SmallInteger(path, key, node));
    } else if (key == "total_heads") {
      KV_ASSIGN_OR_RETURN(spec.total_heads, Integer(path, key, node));
    } else if (key == "region_bytes") {
      KV_ASSIGN_OR_RETURN(spec.region_bytes, Integer(path, key, node));
    } else if (key == "replicated") {
      if (!node.empty() || (node.data() != "true" && node.data() != "false"))
        return Status::InvalidArgument(path + ": 'replicated' must be true or false, got '" +
                                       node.data() + "'");
      spec.replicated = node.data() == "true";
    } else {
      return Status::InvalidArgument(path + ": unknown key '" + key + "'");
    }
  }
  for (const char* required :
       {"order", "layers", "blocks", "heads", "block_size", "content_bytes"}) {
    if (!seen.count(required))
      return Status::InvalidArgument(path + ": missing required key '" + required + "'");
  }
  return spec;
}

Result<KvRegion> LoadRegion(const std::string& path) {
  KV_ASSIGN_OR_RETURN(LayoutSpec spec, ReadLayoutFile(path));
  auto region = KvRegion::Create(spec);
  if (!region.ok()) return region.status().WithContext(path);
  return region;
}

}  // namespace kv::tools
