#include "daemon/offload.h"

#include <utility>

namespace kvarena {

Offload::~Offload() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void Offload::Run(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  if (int(queue_.size()) > idle_ && int(threads_.size()) < max_threads_) {
    threads_.emplace_back([this] { Work(); });
  }
}

int Offload::TEST_threads() const {
  absl::MutexLock lock(&mu_);
  return int(threads_.size());
}

bool Offload::HasWorkLocked() const { return !queue_.empty() || stopping_; }

void Offload::Work() {
  absl::MutexLock lock(&mu_);
  while (true) {
    ++idle_;
    mu_.Await(absl::Condition(this, &Offload::HasWorkLocked));
    --idle_;
    if (queue_.empty()) return;  // stopping, and every queued task has run
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    task();
    task = nullptr;  // what the task holds goes before the lock is taken again
    mu_.Lock();
  }
}

}  // namespace kvarena
