// CommandQueue: the UCX progress thread's inbox. Any thread pushes a command; the progress thread
// alone runs them, in the order the pushes took effect (a thread's own pushes in call order).
//
// Lock-free (Vyukov's intrusive multi-producer single-consumer queue): a pusher never waits for
// the progress thread or for another pusher. It replaced a mutex-guarded vector that the posting
// thread and the progress thread took once per batch each: on the 2-core VM, with a holder
// preempted now and then, they met in futex waits and wake-ups, a context switch every few
// batches (perf of `kvbench transport --size 65536`, benchmarks/transport.md, issue 24).
//
// A push that is half done (its node swapped in, not yet linked) hides the commands behind it
// until it completes: RunAll() then runs what comes before and reports the rest as pending, so
// the caller polls again instead of sleeping.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

namespace kv::transport::ucx {

class CommandQueue {
 public:
  CommandQueue() = default;
  // Destroys the commands never run, without running them.
  ~CommandQueue();
  CommandQueue(const CommandQueue&) = delete;
  CommandQueue& operator=(const CommandQueue&) = delete;

  // Any thread. Sequentially consistent with a later load the consumer makes (Pending()).
  void Push(std::function<void()> command);

  // Consumer only. Runs the commands pushed before the call, in order (those they push wait for
  // the next call); whether it ran any.
  bool RunAll();

  // Consumer only: whether commands were pushed that have not run yet (one half pushed counts).
  bool Pending() const { return pushed_.load() != popped_; }

 private:
  struct Node {
    std::atomic<Node*> next{nullptr};
    std::function<void()> command;
  };
  void Link(Node* node);
  Node* Pop();

  Node stub_;
  std::atomic<Node*> head_{&stub_};  // the last node pushed (producers)
  Node* tail_ = &stub_;              // the next node to pop (consumer)
  std::atomic<uint64_t> pushed_{0};  // pushes completed
  uint64_t popped_ = 0;              // consumer only
};

}  // namespace kv::transport::ucx
