/* The connector's C API, for Python (ctypes/cffi) and engines not written in C++.
 * Installed as <kv/kv_connector.h>, exported by libkvconnector.so (pkg-config: kvconnector).
 *
 * Mirrors <kv/connector.h>; its comments hold the behaviour of each call.
 *
 * Errors. Every int-returning function returns KV_OK (0) or one of the KV_* codes below, equal to
 * kv::Code, and, when `err` is not NULL, fills it: err->code the same code, err->message a line
 * naming what was wrong (cut at 511 bytes; it is a message, never data). kv_strerror(code) names
 * a code. Bad arguments (NULL pointers, zero counts where something is needed, ids over
 * KV_MAX_ID_BYTES, an unknown region index, an option struct whose struct_size is 0 or larger
 * than this library knows) return KV_INVALID_ARGUMENT. Nothing throws and nothing aborts across
 * this boundary.
 *
 * Option and description structs start with `struct_size`: set it to sizeof(the struct) as your
 * header declares it (KV_INIT(s) does), so that later versions can add fields at the end and
 * still read yours. Arrays of such structs are read with the first element's struct_size as
 * their stride.
 *
 * Ownership. Handles (kv_daemon, kv_connector, kv_offload_op) are created by this library,
 * owned by the caller and freed by their stop/close/free function, once. Every array is passed
 * as a pointer and a count in the caller's memory; the library keeps no pointer past the call.
 * Strings returned in structs are NUL-terminated copies.
 *
 * Thread-safety. Every function may be called from any thread; calls on one handle are
 * serialised where they must be. A handle must not be freed while another thread uses it. */
#ifndef KV_KV_CONNECTOR_H_
#define KV_KV_CONNECTOR_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h> /* memset, for KV_INIT */

#include "kv/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors and version ---------------------------------------------------------------------- */

enum {
  KV_OK = 0,
  KV_INVALID_ARGUMENT = 1,   /* the caller passed something malformed or out of range */
  KV_OUT_OF_RANGE = 2,       /* an index or byte range outside what was registered */
  KV_INCOMPATIBLE = 3,       /* two descriptions (layouts, versions, peers) cannot work together */
  KV_NOT_FOUND = 4,          /* an id, key or peer is unknown */
  KV_ALREADY_EXISTS = 5,     /* registering something twice */
  KV_RESOURCE_EXHAUSTED = 6, /* a pool, queue, size limit or caller buffer is full */
  KV_TIMEOUT = 7,            /* a deadline passed */
  KV_UNAVAILABLE = 8,        /* kvd, a peer or a device is gone or not reachable */
  KV_ABORTED = 9,            /* cancelled because something it depended on failed */
  KV_UNSUPPORTED = 10,       /* valid, but this build or kvd's transport cannot serve it */
  KV_IO_ERROR = 11,          /* a system call failed */
  KV_INTERNAL = 12           /* a bug in kvd: an invariant did not hold */
};

typedef struct {
  int code;
  char message[512];
} kv_error;

/* "invalid_argument", "timeout", ...; "unknown" for a value that is no code. Static storage. */
KV_EXPORT const char* kv_strerror(int code);
/* The library's version, "MAJOR.MINOR.PATCH". Static storage. */
KV_EXPORT const char* kv_version(void);

/* Request ids, instance names, peer names and addresses: 1 to KV_MAX_ID_BYTES bytes; longer ones
 * are refused (KV_INVALID_ARGUMENT), never cut. */
#define KV_MAX_ID_BYTES 256
/* The most loads one kv_start_loads may carry. */
#define KV_MAX_LOADS_PER_CALL 1024
/* The most requests one kv_requests_finished may carry. */
#define KV_MAX_FINISHES_PER_CALL 1024
/* Offload block keys: 8 to 32 bytes. */
#define KV_MAX_KEY_BYTES 32

#define KV_INIT(s)               \
  do {                           \
    memset(&(s), 0, sizeof(s));  \
    (s).struct_size = sizeof(s); \
  } while (0)

/* ---- the embedded daemon -------------------------------------------------------------------- */

typedef struct kv_daemon kv_daemon;

typedef struct {
  size_t struct_size;
  const char* name;       /* NULL: "kvd" */
  const char* listen;     /* peers' TCP address; NULL: "127.0.0.1:0" (a free port) */
  const char* transport;  /* "auto", "ucx" or "local"; NULL: "auto" */
  uint64_t offload_bytes; /* CPU offload pool (kvd --offload-bytes); 0: none */
  /* Peers prove this secret (a 0600 file of 32+ bytes; kvd --auth-secret-file) first. NULL:
   * peers on loopback only, unless insecure_peers != 0 (kvd --insecure). See SECURITY.md. */
  const char* auth_secret_file;
  int insecure_peers;
} kv_daemon_options;

/* A kvd core inside this process (embedded mode), for kv_connector_open_embedded. */
KV_EXPORT int kv_daemon_start(const kv_daemon_options* options, kv_daemon** out, kv_error* err);
/* The TCP address peers reach it on ("127.0.0.1:41234"); valid until kv_daemon_stop. "" for
 * NULL. */
KV_EXPORT const char* kv_daemon_address(const kv_daemon* daemon);
/* Stops it once every connector opened on it is closed too. NULL is ignored. */
KV_EXPORT void kv_daemon_stop(kv_daemon* daemon);

/* ---- connectors ----------------------------------------------------------------------------- */

typedef struct kv_connector kv_connector;

typedef struct {
  size_t struct_size;
  const char* instance; /* engines of one TP group share it; NULL: "engine" */
  int tp_rank;
  int tp_size;    /* 0: 1 */
  int timeout_ms; /* bound of every blocking call; 0: 30000 */
  /* Whose blocks in kvd's offload pool this engine stores and sees; NULL: the instance. */
  const char* offload_namespace;
  /* Nonzero: the connection's reader spins on kvd's socket and waiting calls spin instead of
   * sleeping, a core each (ConnectorOptions::busy_poll; pair with kvd --busy-poll). 0: sleep. */
  int busy_poll;
} kv_connector_options;

/* Connects to the kvd listening on the unix socket `socket_path` (kvd --socket). */
KV_EXPORT int kv_connector_open(const char* socket_path, const kv_connector_options* options,
                                kv_connector** out, kv_error* err);
KV_EXPORT int kv_connector_open_embedded(kv_daemon* daemon, const kv_connector_options* options,
                                         kv_connector** out, kv_error* err);
/* NULL is ignored. Loads still running are abandoned; kvd fails them. */
KV_EXPORT void kv_connector_close(kv_connector* connector);

/* ---- registration --------------------------------------------------------------------------- */

/* kv::LayoutSpec (<kv/layout_spec.h>). strides: byte strides indexed L, B, H, N, S, C; 0 means
 * the dense default of the order. */
typedef struct {
  const char* order; /* e.g. "LBNHC"; NULL means "LBNHC" */
  int64_t layers, blocks, heads, block_size, content_bytes;
  int64_t strides[6];
  int tp_rank, tp_size;
  int64_t total_heads;  /* 0: heads * tp_size */
  int replicated;       /* MLA: every rank holds every head */
  int64_t region_bytes; /* 0: the strides' span */
} kv_layout;

enum { KV_MEMORY_HOST = 0, KV_MEMORY_CUDA = 1 };

/* One KV cache to register (kv::connector::KvCacheDesc):
 *   KV_MEMORY_HOST, base NULL:  the library allocates shared memory kvd maps (returned in bases);
 *   KV_MEMORY_HOST, base:       inside memory from kv_host_memory_alloc, nothing else;
 *   KV_MEMORY_CUDA, base:       device memory of CUDA device `device` (cudaMalloc, or a VMM
 *                               allocation created with the POSIX fd handle type). */
typedef struct {
  size_t struct_size;
  kv_layout layout;
  int memory; /* KV_MEMORY_HOST or KV_MEMORY_CUDA */
  int device; /* CUDA ordinal for KV_MEMORY_CUDA */
  void* base;
} kv_cache_desc;

/* Once: registers `count` caches (host or GPU, not both); bases[i] (count entries, the caller's)
 * receives cache i's address. Errors as Connector::RegisterKvCaches. */
KV_EXPORT int kv_register_kv_caches(kv_connector* c, const kv_cache_desc* caches, size_t count,
                                    void** bases, kv_error* err);

/* Shared host memory kvd can map, page-aligned and zeroed, for engines that build their own views
 * (e.g. torch's as_strided) before registering them. Thread-safe. */
KV_EXPORT int kv_host_memory_alloc(uint64_t bytes, void** out, kv_error* err);
/* KV_NOT_FOUND for a pointer kv_host_memory_alloc did not return. */
KV_EXPORT int kv_host_memory_free(void* base, kv_error* err);

/* ---- prefill -------------------------------------------------------------------------------- */

/* One-way: returns once kvd has the message. GPU caches: first records the layer's event on
 * cuda_stream (a cudaStream_t; NULL is the legacy default stream) after the work that wrote the
 * layer. Host caches ignore it. */
KV_EXPORT int kv_save_layer(kv_connector* c, const char* request, int layer,
                            const int64_t* block_ids, size_t count, void* cuda_stream,
                            kv_error* err);

/* One request's blocks of kv_save_layers. */
typedef struct {
  const char* request;
  const int64_t* block_ids;
  size_t count;
} kv_save;

/* kv_save_layer of `layer` for `n` requests (a forward pass's) in one call: the layer's event is
 * recorded once on cuda_stream. Returns KV_OK when every save was handed over or refused on its
 * own: results[i] (n entries, the caller's) holds save i's outcome. Otherwise the call's error
 * (no saves, NULL arguments, a layer out of range), and no save went out. */
KV_EXPORT int kv_save_layers(kv_connector* c, int layer, const kv_save* saves, size_t n,
                             void* cuda_stream, kv_error* results, kv_error* err);

enum { KV_MODE_PUSH = 0, KV_MODE_PULL = 1 };

/* What the decode side needs to load a request. */
typedef struct {
  size_t struct_size;
  char peer_name[KV_MAX_ID_BYTES + 1];
  /* HOST:PORT of the source kvd, or its daemon name (no ':') for a decode kvd run with --etcd */
  char peer_address[KV_MAX_ID_BYTES + 1];
  char request_id[KV_MAX_ID_BYTES + 1];
  /* The source kvd's capability for this request, lowercase hex (empty: none). A secret. */
  char transfer_token[65];
  int64_t tokens; /* set by the decode side: prompt tokens to load */
  int mode;       /* KV_MODE_PUSH or KV_MODE_PULL */
} kv_transfer_params;

/* Fixes `request`'s transfer token before the request finishes (Connector::SetTransferToken):
 * `transfer_token` is 32 to 64 hex digits (16 to 32 bytes from a CSPRNG), NUL-terminated. For a
 * router or engine that mints the token when the prefill starts and hands it to the decode side
 * then: the decode kvd's Want that presents it is served at once, so layers stream while the
 * prefill still runs, with tokens required. Every rank calls it, before (or after) its first
 * kv_save_layer and before kv_request_finished(_with_token); the first fixes the token, the
 * others must pass the same. A call of its own rather than a token argument on the first save:
 * kv_save_layer and kv_save_layers (whose kv_save carries no struct_size to grow) stay as they
 * are, and the token may be fixed before the first layer is written. One-way, as kv_save_layer:
 * KV_INVALID_ARGUMENT for a bad id or token here; a token kvd refuses later (another one than
 * the fixed token) fails the request, and kv_request_finished returns that error. */
KV_EXPORT int kv_set_transfer_token(kv_connector* c, const char* request,
                                    const char* transfer_token, kv_error* err);
/* Finishes `request` on the prefill side and fills *out (its struct_size set by the caller).
 * Up to `capacity` of the prefill side's block ids (vLLM's remote_block_ids) go to
 * remote_block_ids (may be NULL when capacity is 0); *count (may be NULL) receives how many
 * there are, so *count > capacity means the list was cut. The request is finished either way. */
KV_EXPORT int kv_request_finished(kv_connector* c, const char* request, kv_transfer_params* out,
                                  int64_t* remote_block_ids, size_t capacity, size_t* count,
                                  kv_error* err);
/* kv_request_finished with a transfer token the engine chose: `transfer_token` is 32 to 64 hex
 * digits (16 to 32 bytes from a CSPRNG), NUL-terminated; out->transfer_token receives it back.
 * For engines whose scheduler hands the params to the decode side before the ranks finish the
 * request here (vLLM); every rank must pass the same token (and the one kv_set_transfer_token
 * fixed, if any), else the request fails. A decode kvd's Want that presents it before then
 * waits for it, within its lease. KV_INCOMPATIBLE from a kvd too old to take it. */
KV_EXPORT int kv_request_finished_with_token(kv_connector* c, const char* request,
                                             const char* transfer_token, kv_transfer_params* out,
                                             int64_t* remote_block_ids, size_t capacity,
                                             size_t* count, kv_error* err);

/* One request of kv_requests_finished. */
typedef struct {
  const char* request;
  /* As kv_request_finished_with_token's (32 to 64 hex digits), or NULL for kvd's own. */
  const char* transfer_token;
} kv_finish;

/* kv_request_finished(_with_token) for `n` requests (1 to KV_MAX_FINISHES_PER_CALL) in one round
 * trip to kvd instead of one per request (a pull's decode side waits for them all). Returns
 * KV_OK when kvd answered: then results[i] (n entries, the caller's) holds request i's
 * outcome, code 0 when it finished; one failing does not stop the others. `out` may be NULL;
 * else n kv_transfer_params, each with its struct_size set, receive the requests' params (no
 * remote block ids: kv_request_finished returns those). Otherwise the batch's error, and no
 * request was sent. */
KV_EXPORT int kv_requests_finished(kv_connector* c, const kv_finish* finishes, size_t n,
                                   kv_transfer_params* out, kv_error* results, kv_error* err);

/* ---- decode --------------------------------------------------------------------------------- */

KV_EXPORT int kv_start_load(kv_connector* c, const char* request, const kv_transfer_params* params,
                            const int64_t* block_ids, size_t count, kv_error* err);

/* One load of kv_start_loads. */
typedef struct {
  const char* request;
  const kv_transfer_params* params;
  const int64_t* block_ids;
  size_t count;
} kv_load;

/* kv_start_load for `n` loads (1 to KV_MAX_LOADS_PER_CALL) in one round trip to kvd. Returns
 * KV_OK when kvd answered: then results[i] (n entries, the caller's) holds load i's outcome,
 * code 0 when it started; one refused does not stop the others. Otherwise the batch's error,
 * and no load started. */
KV_EXPORT int kv_start_loads(kv_connector* c, const kv_load* loads, size_t n, kv_error* results,
                             kv_error* err);
/* Until `layer` of `request` is in place: KV_OK, the request's error, or KV_TIMEOUT. */
KV_EXPORT int kv_wait_layer(kv_connector* c, const char* request, int layer, kv_error* err);

/* ---- completion ----------------------------------------------------------------------------- */

/* Calls on_request(ctx, id, sent) for every request finished since the last call: sent = 1 on
 * the source side (blocks released), 0 on the destination side (every layer in place). */
typedef void (*kv_request_callback)(void* ctx, const char* request_id, int sent);
KV_EXPORT int kv_get_finished(kv_connector* c, kv_request_callback on_request, void* ctx,
                              kv_error* err);
/* The local blocks of loads that failed since the last call, into block_ids (capacity entries;
 * may be NULL when capacity is 0); *count receives how many there are. When they do not fit:
 * KV_RESOURCE_EXHAUSTED, *count says how many, and none is taken (call again with room). */
KV_EXPORT int kv_get_failed_blocks(kv_connector* c, int64_t* block_ids, size_t capacity,
                                   size_t* count, kv_error* err);
/* Why the load of `request` failed, into *load_error (code KV_OK when it did not fail, is still
 * running, or is not known): also after kv_get_failed_blocks returned its blocks, for the last
 * 4096 failed loads. For an engine's log ("the transfer token does not match", a peer gone). */
KV_EXPORT int kv_load_error(kv_connector* c, const char* request, kv_error* load_error,
                            kv_error* err);

/* kvd's status as one JSON object, NUL-terminated, into buf (capacity bytes); *length (may be
 * NULL) receives its length without the NUL. KV_RESOURCE_EXHAUSTED (with *length) when it does
 * not fit; its figures change from call to call, so retry with room to spare. */
KV_EXPORT int kv_daemon_status_json(kv_connector* c, char* buf, size_t capacity, size_t* length,
                                    kv_error* err);

/* ---- CPU offload (kvd --offload-bytes) ------------------------------------------------------ */

/* `keys` holds `count` keys of `key_bytes` bytes each (8 to 32: vLLM's 64-bit prefix hashes are
 * 8), back to back; keys[i] names block_ids[i] of cache `region` (its index in
 * kv_register_kv_caches). Stores and loads are asynchronous: *op receives a handle to wait on
 * and to free with kv_offload_op_free, before the connector is closed. On error *op is NULL. */
typedef struct kv_offload_op kv_offload_op;

/* A key of any length kvd holds (an evicted key may be another engine's length). */
typedef struct {
  uint8_t bytes[KV_MAX_KEY_BYTES];
  uint32_t size;
} kv_block_key;

typedef struct {
  size_t struct_size;
  size_t stored;          /* keys this store copies */
  size_t already_present; /* keys the pool held already */
  size_t evicted;         /* keys dropped to make room (all of them, also past the buffer) */
  uint64_t bytes;
  size_t runs;
} kv_offload_store_info;

/* KV_RESOURCE_EXHAUSTED when even eviction cannot make room: nothing is stored then. `info` may
 * be NULL. The evicted keys go to evicted (evicted_capacity entries; NULL when 0); info->evicted
 * > evicted_capacity means some were not returned. The blocks must not change until the op
 * completes. GPU caches: records the last layer's event on cuda_stream first, as
 * kv_save_layer. */
KV_EXPORT int kv_offload_store(kv_connector* c, uint32_t region, const uint8_t* keys,
                               size_t key_bytes, const int64_t* block_ids, size_t count,
                               void* cuda_stream, kv_offload_op** op, kv_offload_store_info* info,
                               kv_block_key* evicted, size_t evicted_capacity, kv_error* err);
/* *hits receives how many leading keys the pool holds ready. */
KV_EXPORT int kv_offload_lookup(kv_connector* c, uint32_t region, const uint8_t* keys,
                                size_t key_bytes, size_t count, size_t* hits, kv_error* err);
/* Every key must be ready, else KV_NOT_FOUND naming the missing keys in err and nothing
 * written. per_layer != 0: the caller waits layer by layer (kv_offload_wait_layer). */
KV_EXPORT int kv_offload_load(kv_connector* c, uint32_t region, const uint8_t* keys,
                              size_t key_bytes, const int64_t* block_ids, size_t count,
                              int per_layer, kv_offload_op** op, kv_error* err);
/* Until the op's bytes landed: KV_OK, the copy's error, or KV_TIMEOUT. */
KV_EXPORT int kv_offload_wait(kv_offload_op* op, kv_error* err);
KV_EXPORT int kv_offload_wait_layer(kv_offload_op* op, int layer, kv_error* err);
/* NULL is ignored. */
KV_EXPORT void kv_offload_op_free(kv_offload_op* op);

#ifdef __cplusplus
}
#endif

#endif /* KV_KV_CONNECTOR_H_ */
