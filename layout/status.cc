#include "layout/status.h"

namespace kv {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid_argument";
    case Code::kOutOfRange:
      return "out_of_range";
    case Code::kIncompatible:
      return "incompatible";
    case Code::kNotFound:
      return "not_found";
    case Code::kAlreadyExists:
      return "already_exists";
    case Code::kResourceExhausted:
      return "resource_exhausted";
    case Code::kTimeout:
      return "timeout";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kAborted:
      return "aborted";
    case Code::kUnsupported:
      return "unsupported";
    case Code::kIoError:
      return "io_error";
    case Code::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string s(CodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

}  // namespace kv
