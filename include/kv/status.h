// Status and Result<T>: errors as values, used on every layer of kvd instead of exceptions.
// Public: installed as <kv/status.h>. Header-only, so libkvconnector.so exports no symbol of it.
//
// A Status is either OK or carries a Code and a human-readable message that names what was
// wrong (the offending value, the limit it broke). Result<T> holds a T or a non-OK Status.
// Both are cheap to move and safe to copy; neither is thread-safe for concurrent mutation.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kv {

enum class Code {
  kOk = 0,
  kInvalidArgument,    // the caller passed something malformed or out of range
  kOutOfRange,         // an index or byte range lies outside what was registered
  kIncompatible,       // two descriptions (layouts, versions, peers) cannot work together
  kNotFound,           // an id, key or peer is unknown
  kAlreadyExists,      // registering something twice
  kResourceExhausted,  // a pool, queue or size limit is full
  kTimeout,            // a deadline passed
  kUnavailable,        // a peer or device is gone or not reachable
  kAborted,            // cancelled because something it depended on failed
  kUnsupported,        // valid request this build or backend cannot serve
  kIoError,            // a system call failed
  kInternal,           // a bug: an invariant did not hold
};

inline std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status OutOfRange(std::string m) { return {Code::kOutOfRange, std::move(m)}; }
  static Status Incompatible(std::string m) { return {Code::kIncompatible, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {Code::kResourceExhausted, std::move(m)};
  }
  static Status Timeout(std::string m) { return {Code::kTimeout, std::move(m)}; }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }
  static Status Unsupported(std::string m) { return {Code::kUnsupported, std::move(m)}; }
  static Status IoError(std::string m) { return {Code::kIoError, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: block id 1024 out of range [0, 1024)"; "ok" when OK.
  inline std::string ToString() const;

  // Prefixes context to the message ("peer node-b: ..."); OK stays OK.
  inline Status WithContext(std::string_view context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// ---- inline definitions: the header is the whole type, so it exports no symbol -------------
inline std::string_view CodeName(Code code) {
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

inline std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string s(CodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

inline Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result built from an OK Status has no value");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error; OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kv

// Returns early from the enclosing function when `expr` (a Status) is not OK.
#define KV_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::kv::Status kv_status_ = (expr);        \
    if (!kv_status_.ok()) return kv_status_; \
  } while (0)

#define KV_CONCAT_INNER_(a, b) a##b
#define KV_CONCAT_(a, b) KV_CONCAT_INNER_(a, b)
// KV_ASSIGN_OR_RETURN(auto x, MakeX()); — binds the value or returns the error.
#define KV_ASSIGN_OR_RETURN(lhs, expr) \
  KV_ASSIGN_OR_RETURN_IMPL_(KV_CONCAT_(kv_result_, __LINE__), lhs, expr)
#define KV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
