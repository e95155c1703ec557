/* The C side of benchmarks/python_overhead.py: the same calls made from C, timed the same way.
 * Two embedded kvd cores (local transport); per step, 64 requests x 256 block ids saved layer
 * by layer (kv_save_layer per request and layer), finished, then loaded with one kv_start_loads
 * (pull) and waited for. Prints the medians of kv_save_layer per call and kv_start_loads per call.
 *
 *   cc -O2 -Iinclude benchmarks/c_api_calls.c -Lbuild/lib -lkvconnector \
 *      -Wl,-rpath,$PWD/build/lib -o /tmp/c_api_calls && /tmp/c_api_calls [steps] */
#include <kv/kv_connector.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define REQUESTS 64
#define BLOCKS 256
#define LAYERS 4

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, n, sizeof(double), cmp);
  return v[n / 2];
}

#define CHECK(call)                                                       \
  do {                                                                    \
    if ((call) != KV_OK) {                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, err.message); \
      return 1;                                                           \
    }                                                                     \
  } while (0)

static int open_engine(kv_daemon* d, const char* name, kv_connector** c) {
  kv_error err;
  kv_connector_options o;
  KV_INIT(o);
  o.instance = name;
  o.timeout_ms = 30000;
  CHECK(kv_connector_open_embedded(d, &o, c, &err));
  kv_cache_desc desc;
  KV_INIT(desc);
  desc.layout.order = "LBNHC";
  desc.layout.layers = LAYERS;
  desc.layout.blocks = REQUESTS * BLOCKS;
  desc.layout.heads = 1;
  desc.layout.block_size = 16;
  desc.layout.content_bytes = 8; /* head_dim 2, K+V, fp16: as the Python benchmark */
  desc.layout.tp_size = 1;
  desc.memory = KV_MEMORY_HOST;
  void* base = NULL;
  CHECK(kv_host_memory_alloc((uint64_t)LAYERS * REQUESTS * BLOCKS * 16 * 8, &base, &err));
  desc.base = base;
  void* bases[1];
  CHECK(kv_register_kv_caches(*c, &desc, 1, bases, &err));
  return 0;
}

int main(int argc, char** argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 20;
  kv_error err;
  kv_daemon *p, *d;
  kv_daemon_options o;
  KV_INIT(o);
  o.transport = "local";
  CHECK(kv_daemon_start(&o, &p, &err));
  CHECK(kv_daemon_start(&o, &d, &err));
  kv_connector *pc, *dc;
  if (open_engine(p, "prefill", &pc) || open_engine(d, "decode", &dc)) return 1;
  static int64_t ids[REQUESTS][BLOCKS];
  for (int j = 0; j < REQUESTS; ++j)
    for (int b = 0; b < BLOCKS; ++b) ids[j][b] = j * BLOCKS + b;
  double* save = malloc(sizeof(double) * steps * LAYERS * REQUESTS);
  double* loads = malloc(sizeof(double) * steps);
  int n_save = 0;
  char names[REQUESTS][32];
  kv_transfer_params params[REQUESTS];
  kv_load batch[REQUESTS];
  kv_error results[REQUESTS];
  for (int s = 0; s < steps; ++s) {
    for (int j = 0; j < REQUESTS; ++j) snprintf(names[j], sizeof names[j], "c%d-r%d", s, j);
    for (int l = 0; l < LAYERS; ++l) {
      for (int j = 0; j < REQUESTS; ++j) {
        double t0 = now_us();
        CHECK(kv_save_layer(pc, names[j], l, ids[j], BLOCKS, NULL, &err));
        save[n_save++] = now_us() - t0;
      }
    }
    for (int j = 0; j < REQUESTS; ++j) {
      kv_transfer_params out;
      KV_INIT(out);
      CHECK(kv_request_finished(pc, names[j], &out, NULL, 0, NULL, &err));
      KV_INIT(params[j]);
      snprintf(params[j].peer_address, sizeof params[j].peer_address, "%s", kv_daemon_address(p));
      snprintf(params[j].request_id, sizeof params[j].request_id, "%s", names[j]);
      params[j].tokens = BLOCKS * 16;
      params[j].mode = KV_MODE_PULL;
      batch[j].request = names[j];
      batch[j].params = &params[j];
      batch[j].block_ids = ids[j];
      batch[j].count = BLOCKS;
    }
    double t0 = now_us();
    CHECK(kv_start_loads(dc, batch, REQUESTS, results, &err));
    loads[s] = now_us() - t0;
    for (int j = 0; j < REQUESTS; ++j) {
      if (results[j].code != KV_OK) {
        fprintf(stderr, "load %d: %s\n", j, results[j].message);
        return 1;
      }
      for (int l = 0; l < LAYERS; ++l) CHECK(kv_wait_layer(dc, names[j], l, &err));
    }
  }
  printf("C: kv_save_layer median %.2f us (%d calls), kv_start_loads of %d median %.2f us "
         "(%d calls)\n", median(save, n_save), n_save, REQUESTS, median(loads, steps), steps);
  kv_connector_close(pc);
  kv_connector_close(dc);
  kv_daemon_stop(p);
  kv_daemon_stop(d);
  return 0;
}
