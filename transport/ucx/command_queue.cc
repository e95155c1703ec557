#include "transport/ucx/command_queue.h"

#include <utility>

namespace kv::transport::ucx {

CommandQueue::~CommandQueue() {
  while (Node* node = Pop()) {
    if (node != &stub_) delete node;
  }
}

void CommandQueue::Link(Node* node) {
  node->next.store(nullptr, std::memory_order_relaxed);
  Node* previous = head_.exchange(node, std::memory_order_acq_rel);
  previous->next.store(node, std::memory_order_release);
}

void CommandQueue::Push(std::function<void()> command) {
  auto* node = new Node;
  node->command = std::move(command);
  Link(node);
  pushed_.fetch_add(1);  // seq_cst: pairs with the consumer's look before it sleeps
}

CommandQueue::Node* CommandQueue::Pop() {
  Node* tail = tail_;
  Node* next = tail->next.load(std::memory_order_acquire);
  if (tail == &stub_) {
    if (next == nullptr) return nullptr;
    tail_ = next;
    tail = next;
    next = next->next.load(std::memory_order_acquire);
  }
  if (next != nullptr) {
    tail_ = next;
    return tail;
  }
  if (tail != head_.load(std::memory_order_acquire)) return nullptr;  // a push is half done
  Link(&stub_);
  next = tail->next.load(std::memory_order_acquire);
  if (next == nullptr) return nullptr;
  tail_ = next;
  return tail;
}

bool CommandQueue::RunAll() {
  const uint64_t target = pushed_.load(std::memory_order_acquire);
  bool ran = false;
  while (popped_ < target) {
    Node* node = Pop();
    if (node == nullptr) break;  // the next one is half pushed: the caller polls again
    ++popped_;
    ran = true;
    std::function<void()> command = std::move(node->command);
    delete node;
    command();
  }
  return ran;
}

}  // namespace kv::transport::ucx
