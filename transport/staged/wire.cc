#include "transport/staged/wire.h"

#include "base/codec.h"

namespace kv::transport::staged {
namespace {

constexpr uint32_t kRegionMagic = 0x5253564b;  // "KVSR"
constexpr uint32_t kRegionVersion = 2;
constexpr uint32_t kMaxSlots = 1024;
constexpr size_t kMaxString = 64 << 10;

ByteWriter Control(ControlType type) {
  ByteWriter w;
  w.u32(static_cast<uint32_t>(type));
  return w;
}

std::string Tagged(ByteWriter w) {
  // insert(), not `std::string(1, tag) + body`: g++ 12 at -O3 raises a false -Wrestrict inside
  // that operator+.
  std::string out = w.take();
  out.insert(out.begin(), kControlTag);
  return out;
}

ByteWriter& PutStatus(ByteWriter& w, const Status& s) {
  return w.u32(static_cast<uint32_t>(s.code())).bytes(s.message());
}

bool GetStatus(ByteReader& in, Status* s) {
  uint32_t code = 0;
  std::string_view message;
  if (!in.u32(&code) || !in.bytes(&message) || code > static_cast<uint32_t>(Code::kInternal))
    return false;
  *s = code == 0 ? Status::Ok() : Status(static_cast<Code>(code), std::string(message));
  return true;
}

// A reader positioned after the tag and type of a control frame of `type`.
Result<ByteReader> Open(std::string_view frame, ControlType type) {
  KV_ASSIGN_OR_RETURN(ControlType got, PeekControl(frame));
  if (got != type) return Status::InvalidArgument("staged control frame of an unexpected type");
  return ByteReader(frame.substr(1 + sizeof(uint32_t)));
}

Status Malformed(const char* what) {
  return Status::InvalidArgument(std::string("malformed staged ") + what + " frame");
}

}  // namespace

std::string EncodeUser(std::string_view message) {
  std::string out(1, kUserTag);
  out.append(message);
  return out;
}

std::string EncodeHello(const HelloMsg& m) {
  ByteWriter w = Control(ControlType::kHello);
  w.u64(m.key.instance).u64(m.key.link).bytes(m.reply_address).u32(m.slots).u64(m.slot_bytes);
  return Tagged(std::move(w));
}

std::string EncodeWelcome(const WelcomeMsg& m) {
  ByteWriter w = Control(ControlType::kWelcome);
  w.u64(m.link);
  PutStatus(w, m.status).u64(m.slot_bytes).u32(static_cast<uint32_t>(m.descriptors.size()));
  for (const std::string& d : m.descriptors) w.bytes(d);
  return Tagged(std::move(w));
}

std::string EncodeData(const DataMsg& m) {
  ByteWriter w = Control(ControlType::kData);
  w.u64(m.key.instance)
      .u64(m.key.link)
      .u64(m.seq)
      .u64(m.region)
      .u32(m.slot)
      .u64(m.ranges)
      .u64(m.payload_bytes);
  return Tagged(std::move(w));
}

std::string EncodeAck(const AckMsg& m) {
  ByteWriter w = Control(ControlType::kAck);
  w.u64(m.link).u64(m.seq).u32(m.slot);
  PutStatus(w, m.status);
  return Tagged(std::move(w));
}

Result<ControlType> PeekControl(std::string_view frame) {
  ByteReader in(frame.size() > 1 ? frame.substr(1) : std::string_view());
  uint32_t type = 0;
  if (frame.empty() || frame[0] != kControlTag || !in.u32(&type) ||
      type < static_cast<uint32_t>(ControlType::kHello) ||
      type > static_cast<uint32_t>(ControlType::kGetDone))
    return Status::InvalidArgument("not a staged control frame");
  return static_cast<ControlType>(type);
}

Result<HelloMsg> DecodeHello(std::string_view frame) {
  KV_ASSIGN_OR_RETURN(ByteReader in, Open(frame, ControlType::kHello));
  HelloMsg m;
  std::string_view address;
  if (!in.u64(&m.key.instance) || !in.u64(&m.key.link) || !in.bytes(&address) ||
      !in.u32(&m.slots) || !in.u64(&m.slot_bytes) || !in.at_end() || address.empty() ||
      address.size() > kMaxString)
    return Malformed("hello");
  m.reply_address = std::string(address);
  return m;
}

Result<WelcomeMsg> DecodeWelcome(std::string_view frame) {
  KV_ASSIGN_OR_RETURN(ByteReader in, Open(frame, ControlType::kWelcome));
  WelcomeMsg m;
  uint32_t count = 0;
  if (!in.u64(&m.link) || !GetStatus(in, &m.status) || !in.u64(&m.slot_bytes) || !in.u32(&count) ||
      count > kMaxSlots)
    return Malformed("welcome");
  for (uint32_t i = 0; i < count; ++i) {
    std::string_view d;
    if (!in.bytes(&d) || d.size() > kMaxString) return Malformed("welcome");
    m.descriptors.emplace_back(d);
  }
  if (!in.at_end()) return Malformed("welcome");
  return m;
}

Result<DataMsg> DecodeData(std::string_view frame) {
  KV_ASSIGN_OR_RETURN(ByteReader in, Open(frame, ControlType::kData));
  DataMsg m;
  if (!in.u64(&m.key.instance) || !in.u64(&m.key.link) || !in.u64(&m.seq) || !in.u64(&m.region) ||
      !in.u32(&m.slot) || !in.u64(&m.ranges) || !in.u64(&m.payload_bytes) || !in.at_end())
    return Malformed("data");
  return m;
}

Result<AckMsg> DecodeAck(std::string_view frame) {
  KV_ASSIGN_OR_RETURN(ByteReader in, Open(frame, ControlType::kAck));
  AckMsg m;
  if (!in.u64(&m.link) || !in.u64(&m.seq) || !in.u32(&m.slot) || !GetStatus(in, &m.status) ||
      !in.at_end())
    return Malformed("ack");
  return m;
}

std::string EncodeGetRequest(const GetRequestMsg& m) {
  ByteWriter w = Control(ControlType::kGetRequest);
  w.u64(m.key.instance)
      .u64(m.key.link)
      .u64(m.seq)
      .u32(m.part)
      .u64(m.region)
      .u64(m.alias)
      .u64(m.timeout_ms);
  w.u32(static_cast<uint32_t>(m.runs.size()));
  for (const Run& r : m.runs) w.u64(r.src_offset).u64(r.dst_offset).u64(r.length);
  return Tagged(std::move(w));
}

std::string EncodeGetDone(const GetDoneMsg& m) {
  ByteWriter w = Control(ControlType::kGetDone);
  w.u64(m.link).u64(m.seq).u32(m.part);
  PutStatus(w, m.status);
  return Tagged(std::move(w));
}

Result<GetRequestMsg> DecodeGetRequest(std::string_view frame) {
  KV_ASSIGN_OR_RETURN(ByteReader in, Open(frame, ControlType::kGetRequest));
  GetRequestMsg m;
  uint32_t count = 0;
  if (!in.u64(&m.key.instance) || !in.u64(&m.key.link) || !in.u64(&m.seq) || !in.u32(&m.part) ||
      !in.u64(&m.region) || !in.u64(&m.alias) || !in.u64(&m.timeout_ms) || !in.u32(&count) ||
      count > kMaxGetRuns)
    return Malformed("get request");
  m.runs.resize(count);
  for (Run& r : m.runs) {
    if (!in.u64(&r.src_offset) || !in.u64(&r.dst_offset) || !in.u64(&r.length))
      return Malformed("get request");
  }
  if (!in.at_end()) return Malformed("get request");
  return m;
}

Result<GetDoneMsg> DecodeGetDone(std::string_view frame) {
  KV_ASSIGN_OR_RETURN(ByteReader in, Open(frame, ControlType::kGetDone));
  GetDoneMsg m;
  if (!in.u64(&m.link) || !in.u64(&m.seq) || !in.u32(&m.part) || !GetStatus(in, &m.status) ||
      !in.at_end())
    return Malformed("get done");
  return m;
}

std::string EncodeRegion(const RegionDescriptor& d) {
  return ByteWriter()
      .u32(kRegionMagic)
      .u32(kRegionVersion)
      .u64(d.instance)
      .u64(d.region)
      .u64(d.length)
      .u32(static_cast<uint32_t>(d.location.kind))
      .u32(static_cast<uint32_t>(d.location.device))
      .bytes(d.inner)
      .take();
}

bool IsRegionDescriptor(std::string_view packed) {
  uint32_t magic = 0;
  return ByteReader(packed).u32(&magic) && magic == kRegionMagic;
}

Result<RegionDescriptor> DecodeRegion(std::string_view packed) {
  ByteReader in(packed);
  uint32_t magic = 0, version = 0, kind = 0, device = 0;
  RegionDescriptor d;
  if (!in.u32(&magic) || magic != kRegionMagic || !in.u32(&version))
    return Status::InvalidArgument("not a staged memory descriptor");
  if (version != kRegionVersion)
    return Status::Incompatible("staged descriptor version " + std::to_string(version) +
                                ", this build speaks " + std::to_string(kRegionVersion));
  std::string_view inner;
  if (!in.u64(&d.instance) || !in.u64(&d.region) || !in.u64(&d.length) || !in.u32(&kind) ||
      !in.u32(&device) || !in.bytes(&inner) || !in.at_end() ||
      kind > static_cast<uint32_t>(MemoryKind::kCuda) || d.length == 0)
    return Status::InvalidArgument("not a staged memory descriptor");
  d.inner = std::string(inner);
  d.location = {static_cast<MemoryKind>(kind), static_cast<int>(static_cast<int32_t>(device))};
  return d;
}

}  // namespace kv::transport::staged
