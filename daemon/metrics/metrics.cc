#include "daemon/metrics/metrics.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <vector>

namespace kv::daemon::metrics {
namespace {

const char* RoleName(Role r) {
  return r == Role::kSource ? "source" : "destination";
}

// HELP and TYPE lines: promtool wants exactly one of each before a family's samples.
void Family(std::string* out, const char* name, const char* type, const char* help) {
  *out += "# HELP ";
  *out += name;
  *out += ' ';
  *out += help;
  *out += "\n# TYPE ";
  *out += name;
  *out += ' ';
  *out += type;
  *out += '\n';
}

void Sample(std::string* out, const std::string& name, const std::string& labels, uint64_t v) {
  *out += name;
  if (!labels.empty()) *out += "{" + labels + "}";
  *out += ' ' + std::to_string(v) + '\n';
}

void SampleDouble(std::string* out, const std::string& name, const std::string& labels, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  *out += name;
  if (!labels.empty()) *out += "{" + labels + "}";
  *out += ' ';
  *out += buf;
  *out += '\n';
}

}  // namespace

std::string EscapeLabel(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void Histogram::Observe(std::chrono::nanoseconds d) {
  const double seconds = std::chrono::duration<double>(d).count();
  size_t i = 0;
  while (i < kBuckets && seconds > kBounds[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, d.count())),
                    std::memory_order_relaxed);
}

void Histogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  // Read each bucket once; cumulative counts are built from that one reading, so a bucket never
  // shows less than the one below it even while the io thread observes.
  uint64_t cumulative = 0;
  const std::string sep = labels.empty() ? "" : ",";
  for (size_t i = 0; i <= kBuckets; ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    char le[32];
    if (i < kBuckets) {
      std::snprintf(le, sizeof(le), "%g", kBounds[i]);
    } else {
      std::snprintf(le, sizeof(le), "+Inf");
    }
    Sample(out, name + "_bucket", labels + sep + "le=\"" + le + "\"", cumulative);
  }
  SampleDouble(out, name + "_sum", labels, sum_ns_.load(std::memory_order_relaxed) / 1e9);
  Sample(out, name + "_count", labels, cumulative);
}

void Metrics::RequestDone(Role role, const std::string& peer, const std::string& transport, bool ok,
                          uint64_t bytes, std::chrono::nanoseconds elapsed) {
  std::shared_ptr<PeerCounters> c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = peers_[Key{peer, transport, role}];
    if (!slot) slot = std::make_shared<PeerCounters>();
    c = slot;
  }
  (ok ? c->done : c->failed).fetch_add(1, std::memory_order_relaxed);
  if (ok) {
    c->bytes.fetch_add(bytes, std::memory_order_relaxed);
    request_[static_cast<int>(role)].Observe(elapsed);
  }
}

std::string Metrics::Render(const proto::DaemonStatus* s, const std::string& version) const {
  std::string out;
  out.reserve(8192);
  std::vector<std::pair<Key, std::shared_ptr<PeerCounters>>> peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers.assign(peers_.begin(), peers_.end());
  }
  auto labels = [](const Key& k) {
    return "peer=\"" + EscapeLabel(std::get<0>(k)) + "\",transport=\"" +
           EscapeLabel(std::get<1>(k)) + "\",role=\"" + RoleName(std::get<2>(k)) + "\"";
  };
  Family(&out, "kvd_transfer_bytes_total", "counter",
         "Bytes of completed transfers, by peer daemon, transport and this kvd's role (source: "
         "sent, destination: received).");
  for (const auto& [k, c] : peers) {
    Sample(&out, "kvd_transfer_bytes_total", labels(k), c->bytes.load(std::memory_order_relaxed));
  }
  Family(&out, "kvd_transfers_total", "counter",
         "Transfers ended, by peer daemon, transport, role and outcome (done or failed).");
  for (const auto& [k, c] : peers) {
    Sample(&out, "kvd_transfers_total", labels(k) + ",outcome=\"done\"",
           c->done.load(std::memory_order_relaxed));
    Sample(&out, "kvd_transfers_total", labels(k) + ",outcome=\"failed\"",
           c->failed.load(std::memory_order_relaxed));
  }
  Family(&out, "kvd_request_seconds", "histogram",
         "Completed transfers: from the request reaching this kvd (first save on the source, "
         "first start_load on the destination) to its end.");
  for (Role r : {Role::kSource, Role::kDestination}) {
    request_[static_cast<int>(r)].Render("kvd_request_seconds",
                                         std::string("role=\"") + RoleName(r) + "\"", &out);
  }
  Family(&out, "kvd_layer_seconds", "histogram",
         "Source side: from a layer saved by every prefill rank (and queued for the transport) to "
         "its copies in place at the destination.");
  layer_.Render("kvd_layer_seconds", "", &out);
  Family(&out, "kvd_heartbeat_timeouts_total", "counter",
         "Peers declared dead after missing their heartbeats (--heartbeat-ms, 5 missed).");
  Sample(&out, "kvd_heartbeat_timeouts_total", "",
         heartbeat_timeouts_.load(std::memory_order_relaxed));
  Family(&out, "kvd_metrics_snapshot_timeouts_total", "counter",
         "Scrapes whose status snapshot the io thread did not answer within 1 s (the gauges are "
         "missing from those).");
  Sample(&out, "kvd_metrics_snapshot_timeouts_total", "",
         snapshot_timeouts_.load(std::memory_order_relaxed));
  if (s == nullptr) return out;

  Family(&out, "kvd_info", "gauge", "Constant 1, labelled with this daemon's identity.");
  Sample(&out, "kvd_info",
         "name=\"" + EscapeLabel(s->name()) + "\",transport=\"" + EscapeLabel(s->transport()) +
             "\",listen=\"" + EscapeLabel(s->listen_address()) + "\",version=\"" +
             EscapeLabel(version) + "\"",
         1);
  struct Counter {
    const char* name;
    const char* help;
    uint64_t value;
  };
  const auto& o = s->offload();
  const Counter counters[] = {
      {"kvd_transfers_done_total", "Transfers completed, both roles.", s->transfers_done()},
      {"kvd_transfers_failed_total", "Transfers failed, both roles.", s->transfers_failed()},
      {"kvd_bytes_sent_total", "Bytes whose copies the transport completed, as a source.",
       s->bytes_sent()},
      {"kvd_bytes_received_total", "Bytes announced in place, as a destination.",
       s->bytes_received()},
      {"kvd_runs_sent_total", "Byte runs posted as a source.", s->runs_sent()},
      {"kvd_batches_posted_total", "Transport posts those runs went out in.", s->batches_posted()},
      {"kvd_offload_hits_total", "Offload pool lookups that found their block.", o.hits()},
      {"kvd_offload_misses_total", "Offload pool lookups that did not.", o.misses()},
      {"kvd_offload_evictions_total", "Offload pool blocks dropped to make room.", o.evictions()},
      {"kvd_offload_bytes_in_total", "Bytes stored into the offload pool.", o.bytes_in()},
      {"kvd_offload_bytes_out_total", "Bytes loaded out of the offload pool.", o.bytes_out()},
      {"kvd_offload_failed_copies_total", "Offload copies that failed.", o.failed_copies()},
      {"kvd_registrations_refused_total",
       "Region registrations refused over --max-registered-bytes.", s->registrations_refused()},
  };
  for (const Counter& c : counters) {
    Family(&out, c.name, "counter", c.help);
    Sample(&out, c.name, "", c.value);
  }
  const Counter gauges[] = {
      {"kvd_transfers_in_flight", "Transfers under way, both roles.", s->transfers_in_flight()},
      {"kvd_engines", "Engines connected (after their hello).", s->engines()},
      {"kvd_registered_regions", "KV regions registered by the connected engines.", s->regions()},
      {"kvd_registered_bytes", "Bytes of those regions.", s->region_bytes()},
      {"kvd_resident_bytes", "Resident memory of the kvd process.", s->resident_bytes()},
      {"kvd_offload_capacity_bytes", "Host memory of the offload pool (0: none).",
       o.capacity_bytes()},
      {"kvd_offload_capacity_slots", "Blocks the pool holds (0 before its first use).",
       o.capacity_slots()},
      {"kvd_offload_used_slots", "Blocks held in the pool now.", o.used_slots()},
  };
  for (const Counter& g : gauges) {
    Family(&out, g.name, "gauge", g.help);
    Sample(&out, g.name, "", g.value);
  }
  Family(&out, "kvd_uptime_seconds", "gauge", "Seconds since this kvd started.");
  SampleDouble(&out, "kvd_uptime_seconds", "", s->uptime_seconds());
  std::map<std::string, uint64_t> by_state = {{"ready", 0}, {"handshake", 0}, {"connecting", 0}};
  for (const auto& p : s->peers()) ++by_state[p.state()];
  Family(&out, "kvd_peers", "gauge", "Peer daemon sessions, by state.");
  for (const auto& [state, n] : by_state) {
    Sample(&out, "kvd_peers", "state=\"" + EscapeLabel(state) + "\"", n);
  }
  return out;
}

}  // namespace kv::daemon::metrics
