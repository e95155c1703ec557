/* A tiny C engine built against the installed kvd (pkg-config kvconnector).
 *
 * Two embedded kvd cores, a prefill and a decode engine: the prefill engine saves one request
 * layer by layer, the decode engine loads it and checks every byte, then both collect the
 * request as finished. Every call's error is checked and printed with its message. */
#include <kv/kv_connector.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int check(int rc, const kv_error* err, const char* what) {
  if (rc != KV_OK) fprintf(stderr, "engine: %s: %s (%s)\n", what, err->message, kv_strerror(rc));
  return rc;
}

static void count_finished(void* ctx, const char* id, int sent) {
  (void)id;
  (void)sent;
  ++*(int*)ctx;
}

int main(void) {
  kv_error err;
  printf("kvd connector %s\n", kv_version());
  kv_daemon_options dopt;
  KV_INIT(dopt);
  kv_daemon *p = NULL, *d = NULL;
  dopt.name = "prefill-node";
  if (check(kv_daemon_start(&dopt, &p, &err), &err, "start prefill kvd")) return 1;
  dopt.name = "decode-node";
  if (check(kv_daemon_start(&dopt, &d, &err), &err, "start decode kvd")) return 1;

  kv_connector_options copt;
  KV_INIT(copt);
  kv_connector *prefill = NULL, *decode = NULL;
  copt.instance = "prefill";
  if (check(kv_connector_open_embedded(p, &copt, &prefill, &err), &err, "open prefill")) return 1;
  copt.instance = "decode";
  if (check(kv_connector_open_embedded(d, &copt, &decode, &err), &err, "open decode")) return 1;

  /* 2 layers × 8 blocks × 2 heads × 4 tokens × 16 bytes, LBNHC: a page is 128 bytes. */
  kv_cache_desc cache;
  KV_INIT(cache);
  cache.layout.order = "LBNHC";
  cache.layout.layers = 2;
  cache.layout.blocks = 8;
  cache.layout.heads = 2;
  cache.layout.block_size = 4;
  cache.layout.content_bytes = 16;
  cache.layout.tp_size = 1;
  cache.memory = KV_MEMORY_HOST;
  void *src = NULL, *dst = NULL;
  if (check(kv_register_kv_caches(prefill, &cache, 1, &src, &err), &err, "register")) return 1;
  if (check(kv_register_kv_caches(decode, &cache, 1, &dst, &err), &err, "register")) return 1;

  kv_transfer_params params;
  KV_INIT(params);
  snprintf(params.peer_address, sizeof(params.peer_address), "%s", kv_daemon_address(p));
  params.tokens = 8; /* two blocks of 4 tokens */
  params.mode = KV_MODE_PUSH;
  const int64_t src_blocks[2] = {1, 2}, dst_blocks[2] = {6, 5};
  if (check(kv_start_load(decode, "req-1", &params, dst_blocks, 2, &err), &err, "start load")) {
    return 1;
  }
  for (int l = 0; l < 2; ++l) {
    memset((char*)src + l * 1024 + 128, 0x40 + l, 256); /* blocks 1 and 2 */
    if (check(kv_save_layer(prefill, "req-1", l, src_blocks, 2, NULL, &err), &err, "save")) return 1;
  }
  kv_transfer_params out;
  KV_INIT(out);
  if (check(kv_request_finished(prefill, "req-1", &out, NULL, 0, NULL, &err), &err, "finish")) {
    return 1;
  }
  for (int l = 0; l < 2; ++l) {
    if (check(kv_wait_layer(decode, "req-1", l, &err), &err, "wait layer")) return 1;
    for (int b = 5; b <= 6; ++b) {
      for (int i = 0; i < 128; ++i) {
        if (((const char*)dst)[l * 1024 + b * 128 + i] != 0x40 + l) {
          fprintf(stderr, "engine: layer %d block %d byte %d differs\n", l, b, i);
          return 1;
        }
      }
    }
  }
  int finished = 0;
  for (int i = 0; i < 1000 && finished < 2; ++i) {
    if (check(kv_get_finished(prefill, count_finished, &finished, &err), &err, "finished")) return 1;
    if (check(kv_get_finished(decode, count_finished, &finished, &err), &err, "finished")) return 1;
    if (finished < 2) usleep(2000);
  }
  /* Errors are values: an unknown request is named, and its code has a name. */
  const int rc = kv_wait_layer(decode, "no-such-request", 0, &err);
  printf("engine: wait on an unknown request: %s (%s)\n", kv_strerror(rc), err.message);
  kv_connector_close(prefill);
  kv_connector_close(decode);
  kv_daemon_stop(p);
  kv_daemon_stop(d);
  if (finished != 2 || rc != KV_NOT_FOUND) {
    fprintf(stderr, "engine: finished %d of 2, unknown request gave %d\n", finished, rc);
    return 1;
  }
  printf("engine: request req-1 moved, 2 layers verified, finished on both sides\n");
  return 0;
}
