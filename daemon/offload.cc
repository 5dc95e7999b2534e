#include "daemon/offload.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/refusal.h"

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

absl::Status Offload::Run(uint64_t bytes, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (held_tasks_ > 0 && (held_bytes_ > max_bytes_ || bytes > max_bytes_ - held_bytes_)) {
    return RefusedError(
        Refusal::kMaxQueuedBytes,
        absl::StrCat("the daemon's pool holds ", held_tasks_, " calls of ", held_bytes_,
                     " request bytes; this call's ", bytes,
                     " would pass --max_queued_bytes=", max_bytes_, "; retry later"));
  }
  held_bytes_ += bytes;
  ++held_tasks_;
  queue_.emplace_back(bytes, std::move(task));
  if (int(queue_.size()) > idle_ && int(threads_.size()) < max_threads_) {
    threads_.emplace_back([this] { Work(); });
  }
  return absl::OkStatus();
}

int Offload::TEST_threads() const {
  absl::MutexLock lock(&mu_);
  return int(threads_.size());
}

uint64_t Offload::TEST_held_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_bytes_;
}

bool Offload::HasWorkLocked() const { return !queue_.empty() || stopping_; }

void Offload::Work() {
  absl::MutexLock lock(&mu_);
  while (true) {
    ++idle_;
    mu_.Await(absl::Condition(this, &Offload::HasWorkLocked));
    --idle_;
    if (queue_.empty()) return;  // stopping, and every queued task has run
    auto [bytes, task] = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    task();
    task = nullptr;  // what the task holds goes before the lock is taken again
    mu_.Lock();
    held_bytes_ -= bytes;
    --held_tasks_;
  }
}

}  // namespace kvarena
