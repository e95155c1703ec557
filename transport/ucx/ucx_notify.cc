// Notifications of the ucx backend (progress thread): a notification leaves as an eager active
// message once a flush of its endpoint completed, so after the data of every batch posted before
// it (ucx_engine.h). Split from ucx_progress.cc, which keeps the loop and the batches.
#include "transport/ucx/ucx_engine.h"

namespace kv::transport::ucx {

void Engine::Notify(PeerId id, std::string message) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return;  // the peer failed: its notifications are dropped with it
  Peer* peer = it->second.get();
  uint64_t seq = peer->next_note++;
  peer->notes.push_back(Note{seq, std::move(message)});
  // Behind queued batches, the flush waits its turn: it must cover them once they are posted.
  if (peer->queued.empty()) {
    FlushNote(peer, seq);
  } else {
    peer->queued.push_back(Queued{nullptr, seq});
  }
}

void Engine::FlushNote(Peer* peer, uint64_t seq) {
  const PeerId id = peer->id;
  // Puts as messages: landed once acked, which no flush says.
  if (peer->am_puts) {
    if (AmNoteReady(peer, seq)) MarkNoteReady(id, seq);
    return;
  }
  // UCX does not order active messages after RMA: the flush is what makes the data land first.
  ucp_request_param_t flush{};
  flush.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  flush.cb.send = &Engine::OnNoteFlushed;
  auto* ref = new NoteRef{this, id, seq};
  flush.user_data = ref;
  ucs_status_ptr_t request = ucp_ep_flush_nbx(peer->ep, &flush);
  if (UCS_PTR_IS_PTR(request)) return;
  delete ref;
  if (request == nullptr) MarkNoteReady(id, seq);
}

void Engine::OnNoteFlushed(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<NoteRef> ref(static_cast<NoteRef*>(user_data));
  ucp_request_free(request);
  if (status == UCS_OK) ref->engine->MarkNoteReady(ref->peer, ref->seq);
}

void Engine::MarkNoteReady(PeerId id, uint64_t seq) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  for (Note& note : it->second->notes) {
    if (note.seq == seq) note.ready = true;
  }
  SendReadyNotes(it->second.get());
}

void Engine::SendReadyNotes(Peer* peer) {
  while (!peer->notes.empty() && peer->notes.front().ready) {
    auto* message = new std::string(std::move(peer->notes.front().message));
    peer->notes.pop_front();
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_EAGER;  // rendezvous would need a receive-side fetch
    param.cb.send = &Engine::OnNoteSent;
    param.user_data = message;
    ucs_status_ptr_t request = ucp_am_send_nbx(peer->ep, kNotifyAmId, nullptr, 0, message->data(),
                                               message->size(), &param);
    if (!UCS_PTR_IS_PTR(request)) delete message;
  }
}

void Engine::OnNoteSent(void* request, ucs_status_t, void* user_data) {
  delete static_cast<std::string*>(user_data);
  ucp_request_free(request);
}

ucs_status_t Engine::OnNotification(void* arg, const void*, size_t, void* data, size_t length,
                                    const ucp_am_recv_param_t* param) {
  auto* engine = static_cast<Engine*>(arg);
  // Senders force eager; a rendezvous message did not come from this backend and is dropped.
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 || !engine->handler_) return UCS_OK;
  engine->handler_(std::string_view(static_cast<const char*>(data), length));
  return UCS_OK;
}

}  // namespace kv::transport::ucx
