/* The connector's C API: for Python (ctypes/cffi) and engines not written in C++.
 *
 * Mirrors connector/connector.h. Every function returns 0 on success or a kv::Code value (see
 * layout/status.h: 1 invalid argument, 2 out of range, 3 incompatible, 4 not found, ... 8 timeout,
 * 9 unavailable) and, when `err` is not NULL, fills it with the message. Nothing throws and
 * nothing aborts across this boundary. Handles are owned by the caller and freed with their
 * close/stop function; every function is thread-safe on one handle. */
#ifndef KV_CONNECTOR_H_
#define KV_CONNECTOR_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_connector kv_connector;
typedef struct kv_daemon kv_daemon;

typedef struct {
  int code;
  char message[512];
} kv_error;

/* kv::LayoutSpec. strides: byte strides indexed L, B, H, N, S, C; 0 means dense. */
typedef struct {
  const char* order; /* e.g. "LBNHC"; NULL means "LBNHC" */
  int64_t layers, blocks, heads, block_size, content_bytes;
  int64_t strides[6];
  int tp_rank, tp_size;
  int64_t total_heads;
  int replicated;
} kv_layout;

enum { KV_MODE_PUSH = 0, KV_MODE_PULL = 1 };

typedef struct {
  char peer_name[256];
  char peer_address[256];
  char request_id[256];
  int64_t tokens; /* set by the decode side: prompt tokens to load */
  int mode;       /* KV_MODE_PUSH or KV_MODE_PULL */
} kv_transfer_params;

/* Embedded mode: a kvd core in this process. listen "127.0.0.1:0" picks a free port;
 * transport "auto", "ucx" or "local". */
int kv_daemon_start(const char* name, const char* listen, const char* transport, kv_daemon** out,
                    kv_error* err);
/* The same with a CPU offload pool of offload_bytes (kvd --offload-bytes; 0: none). */
int kv_daemon_start_with_offload(const char* name, const char* listen, const char* transport,
                                 uint64_t offload_bytes, kv_daemon** out, kv_error* err);
/* The TCP address peers reach it on ("127.0.0.1:41234"); valid until kv_daemon_stop. */
const char* kv_daemon_address(const kv_daemon* daemon);
void kv_daemon_stop(kv_daemon* daemon);

int kv_connector_open(const char* socket_path, const char* instance, int tp_rank, int tp_size,
                      int timeout_ms, kv_connector** out, kv_error* err);
int kv_connector_open_embedded(kv_daemon* daemon, const char* instance, int tp_rank, int tp_size,
                               int timeout_ms, kv_connector** out, kv_error* err);
void kv_connector_close(kv_connector* connector);

/* Allocates and registers one shared host region per layout; bases[i] receives its address. */
int kv_register_kv_caches(kv_connector* c, const kv_layout* layouts, size_t count, void** bases,
                          kv_error* err);

/* Once, instead of kv_register_kv_caches: registers `count` caches the engine allocated itself
 * on CUDA device `device` (cudaMalloc, or a VMM allocation created with the POSIX fd handle
 * type), bases[i] holding layouts[i]. kvd opens them through CUDA IPC or the VMM fd; per-layer
 * CUDA events are shared with kvd so its copies wait for the engine's writes (no host sync in the
 * engine).
 * KV_UNSUPPORTED (10) without CUDA, in embedded mode, or when kvd's transport cannot
 * reach GPU memory; KV_INVALID_ARGUMENT (1) for a pointer that is not device memory of device. */
int kv_register_gpu_kv_caches(kv_connector* c, const kv_layout* layouts, void* const* bases,
                              int device, size_t count, kv_error* err);

/* One-way: returns once kvd has the message. Errors it can see at once (request id, layer,
 * block ids against the registered caches, an earlier failure of the request) it returns; a
 * save kvd refuses later fails the request, and kv_request_finished returns that error. */
int kv_save_layer(kv_connector* c, const char* request, int layer, const int64_t* block_ids,
                  size_t count, kv_error* err);
/* kv_save_layer for GPU caches: first records the layer's event on cuda_stream (a cudaStream_t;
 * NULL is the legacy default stream) after the work that wrote the layer. */
int kv_save_layer_on_stream(kv_connector* c, const char* request, int layer,
                            const int64_t* block_ids, size_t count, void* cuda_stream,
                            kv_error* err);
int kv_request_finished(kv_connector* c, const char* request, kv_transfer_params* out,
                        kv_error* err);
/* kv_request_finished that also returns the prefill side's block ids (vLLM's remote_block_ids,
 * prefill rank 0's blocks, for the decode scheduler's records): up to `capacity` ids go to
 * remote_block_ids (may be NULL when capacity is 0) and *count is set to how many there are.
 * *count > capacity means the list was cut; the request is finished either way. */
int kv_request_finished_with_blocks(kv_connector* c, const char* request, kv_transfer_params* out,
                                    int64_t* remote_block_ids, size_t capacity, size_t* count,
                                    kv_error* err);
int kv_start_load(kv_connector* c, const char* request, const kv_transfer_params* params,
                  const int64_t* block_ids, size_t count, kv_error* err);
/* One load of kv_start_loads. */
typedef struct {
  const char* request;
  const kv_transfer_params* params;
  const int64_t* block_ids;
  size_t count;
} kv_load;
/* kv_start_load for `n` loads in one round trip to kvd (at most 1024). Returns 0 when kvd
 * answered: then results[i] (n entries, caller-allocated) holds load i's outcome, code 0 when it
 * started; one refused does not stop the others. Otherwise the batch's error, and no load
 * started. */
int kv_start_loads(kv_connector* c, const kv_load* loads, size_t n, kv_error* results,
                   kv_error* err);
int kv_wait_layer(kv_connector* c, const char* request, int layer, kv_error* err);

/* Calls on_request(ctx, id, sent) for every request finished since the last call: sent = 1 on
 * the source side (blocks released), 0 on the destination side (every layer in place). */
typedef void (*kv_request_callback)(void* ctx, const char* request_id, int sent);
int kv_get_finished(kv_connector* c, kv_request_callback on_request, void* ctx, kv_error* err);
/* Calls on_blocks(ctx, ids, count) once with the local blocks of loads that failed since the
 * last call (count may be 0). */
typedef void (*kv_blocks_callback)(void* ctx, const int64_t* block_ids, size_t count);
int kv_get_failed_blocks(kv_connector* c, kv_blocks_callback on_blocks, void* ctx, kv_error* err);

/* CPU offload: kvd's host pool keyed by block hash (kvd --offload-bytes). `keys` holds `count`
 * keys of `key_bytes` bytes each (8 to 32: vLLM's 64-bit prefix hashes are 8), back to back;
 * keys[i] names block_ids[i] of cache `region` (its index in kv_register_kv_caches). Stores and
 * loads are asynchronous: *op receives a handle to wait on and to free with kv_offload_op_free,
 * before the connector is closed. On error *op is left NULL. */
typedef struct kv_offload_op kv_offload_op;

typedef struct {
  size_t stored;          /* keys this store copies */
  size_t already_present; /* keys the pool held already */
  size_t evicted;         /* keys dropped to make room */
  uint64_t bytes;
  size_t runs;
} kv_offload_store_info;

/* KV_RESOURCE_EXHAUSTED (6) when even eviction cannot make room: nothing is stored then.
 * `info` may be NULL. The blocks must not change until the op completes. */
int kv_offload_store(kv_connector* c, uint32_t region, const uint8_t* keys, size_t key_bytes,
                     const int64_t* block_ids, size_t count, kv_offload_op** op,
                     kv_offload_store_info* info, kv_error* err);
/* *hits receives how many leading keys the pool holds ready. */
int kv_offload_lookup(kv_connector* c, uint32_t region, const uint8_t* keys, size_t key_bytes,
                      size_t count, size_t* hits, kv_error* err);
/* Every key must be ready, else 4 (not found) with one line per missing key in err and nothing
 * written. per_layer != 0: the caller waits layer by layer (kv_offload_wait_layer). */
int kv_offload_load(kv_connector* c, uint32_t region, const uint8_t* keys, size_t key_bytes,
                    const int64_t* block_ids, size_t count, int per_layer, kv_offload_op** op,
                    kv_error* err);
/* Until the op's bytes landed: 0, the copy's error, or 8 (timeout). */
int kv_offload_wait(kv_offload_op* op, kv_error* err);
int kv_offload_wait_layer(kv_offload_op* op, int layer, kv_error* err);
void kv_offload_op_free(kv_offload_op* op);

#ifdef __cplusplus
}
#endif

#endif /* KV_CONNECTOR_H_ */
