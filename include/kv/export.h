/* KV_EXPORT marks what libkvconnector.so exports: the C API (kv_*) and the classes and functions
 * of kv::connector. Everything else in the library is built with hidden visibility, so an engine
 * sees only these names and cannot clash with kvd's own copies of protobuf, spdlog or Asio code. */
#ifndef KV_EXPORT_H_
#define KV_EXPORT_H_

#define KV_EXPORT __attribute__((visibility("default")))

#endif /* KV_EXPORT_H_ */
