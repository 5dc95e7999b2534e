// Makes Debian's abseil synchronisation visible to ThreadSanitizer (scripts/sanitize.sh
// thread preloads this library). Debian's libabsl_synchronization is not built with
// -fsanitize=thread, so TSan never sees an absl::Mutex being taken or released and reports
// every access the mutex orders as a race. This library defines the Mutex, CondVar and
// Notification entry points, so the dynamic linker binds every caller (kvarena's code and
// gRPC's) to them; each calls the real function from libabsl_synchronization (dlsym
// RTLD_NEXT) and tells TSan the happens-before edge it implies: a release on the mutex's
// address before giving it up, an acquire after taking it.
//
// Plain acquire/release, not TSan's mutex annotations: Await and CondVar::Wait give the
// mutex up and take it back inside abseil, and abseil may evaluate a waiter's Condition on
// the releasing thread, so ownership as TSan's mutex model tracks it would be wrong; edges
// are never wrong, only possibly more than the program has (a reader lock's release orders
// readers among themselves), so this hides no write-write race under a writer lock and
// invents none. Each Condition is wrapped so that its evaluation, wherever it runs, is
// ordered like code under the lock (GuardedCondition).
//
// Built without -fsanitize (so any process may preload it): the TSan entry points are weak
// and only called where the process has the TSan runtime (the instrumented binaries).
// Tied to the abseil ABI it was compiled against (the inline namespace names the symbols).
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

extern "C" void __tsan_acquire(void* addr) __attribute__((weak));
extern "C" void __tsan_release(void* addr) __attribute__((weak));

namespace {

#define KVARENA_STR2(x) #x
#define KVARENA_STR(x) KVARENA_STR2(x)

// "_ZN4absl" + the inline namespace + rest: the Itanium mangling of absl::<rest>.
// konst: a const member function (_ZNK).
void* Real(const char* rest, bool konst = false) {
  const std::string ns = KVARENA_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name =
      std::string(konst ? "_ZNK4absl" : "_ZN4absl") + std::to_string(ns.size()) + ns + rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "absl_sync_annotations: %s not found: %s\n", name.c_str(), dlerror());
    std::abort();
  }
  return fn;
}

// The real function, looked up once (thread-safe static init).
#define KVARENA_REAL(type, rest, ...) \
  static const auto real = reinterpret_cast<type>(Real(rest, ##__VA_ARGS__))

void Acquire(const void* addr) {
  if (__tsan_acquire != nullptr) __tsan_acquire(const_cast<void*>(addr));
}
void Release(const void* addr) {
  if (__tsan_release != nullptr) __tsan_release(const_cast<void*>(addr));
}

using absl::Condition;
using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

// abseil evaluates a Condition with the mutex held, on the waiting thread or on whichever
// thread is releasing the mutex; this wrapper makes each evaluation an acquire/release
// of the mutex, so what the condition reads is ordered after the writes made under it.
struct GuardedCondition {
  const Condition* cond;
  Mutex* mu;
};
bool EvalGuarded(GuardedCondition* g) {
  Acquire(g->mu);
  const bool holds = g->cond->Eval();
  Release(g->mu);
  return holds;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  KVARENA_REAL(void (*)(Mutex*), "5Mutex4LockEv");
  real(this);
  Acquire(this);
}

void Mutex::ReaderLock() {
  KVARENA_REAL(void (*)(Mutex*), "5Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}

bool Mutex::TryLock() {
  KVARENA_REAL(bool (*)(Mutex*), "5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  KVARENA_REAL(bool (*)(Mutex*), "5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::Unlock() {
  KVARENA_REAL(void (*)(Mutex*), "5Mutex6UnlockEv");
  Release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  KVARENA_REAL(void (*)(Mutex*), "5Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  KVARENA_REAL(void (*)(Mutex*, const Condition&), "5Mutex8LockWhenERKNS0_9ConditionE");
  GuardedCondition guarded{&cond, this};
  real(this, Condition(&EvalGuarded, &guarded));
  Acquire(this);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  KVARENA_REAL(void (*)(Mutex*, const Condition&), "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  GuardedCondition guarded{&cond, this};
  real(this, Condition(&EvalGuarded, &guarded));
  Acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  KVARENA_REAL(bool (*)(Mutex*, const Condition&, Duration),
               "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  GuardedCondition guarded{&cond, this};
  const bool met = real(this, Condition(&EvalGuarded, &guarded), timeout);
  Acquire(this);  // held either way
  return met;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  KVARENA_REAL(bool (*)(Mutex*, const Condition&, Time),
               "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  GuardedCondition guarded{&cond, this};
  const bool met = real(this, Condition(&EvalGuarded, &guarded), deadline);
  Acquire(this);
  return met;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  KVARENA_REAL(bool (*)(Mutex*, const Condition&, Duration),
               "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  GuardedCondition guarded{&cond, this};
  const bool met = real(this, Condition(&EvalGuarded, &guarded), timeout);
  Acquire(this);
  return met;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  KVARENA_REAL(bool (*)(Mutex*, const Condition&, Time),
               "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  GuardedCondition guarded{&cond, this};
  const bool met = real(this, Condition(&EvalGuarded, &guarded), deadline);
  Acquire(this);
  return met;
}

void Mutex::Await(const Condition& cond) {
  KVARENA_REAL(void (*)(Mutex*, const Condition&), "5Mutex5AwaitERKNS0_9ConditionE");
  GuardedCondition guarded{&cond, this};
  Release(this);  // Await may give the mutex up until cond holds
  real(this, Condition(&EvalGuarded, &guarded));
  Acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  KVARENA_REAL(bool (*)(Mutex*, const Condition&, Duration),
               "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  GuardedCondition guarded{&cond, this};
  Release(this);
  const bool met = real(this, Condition(&EvalGuarded, &guarded), timeout);
  Acquire(this);
  return met;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  KVARENA_REAL(bool (*)(Mutex*, const Condition&, Time),
               "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  GuardedCondition guarded{&cond, this};
  Release(this);
  const bool met = real(this, Condition(&EvalGuarded, &guarded), deadline);
  Acquire(this);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  KVARENA_REAL(void (*)(CondVar*, Mutex*), "7CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  KVARENA_REAL(bool (*)(CondVar*, Mutex*, Duration),
               "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool timed_out = real(this, mu, timeout);
  Acquire(mu);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  KVARENA_REAL(bool (*)(CondVar*, Mutex*, Time),
               "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool timed_out = real(this, mu, deadline);
  Acquire(mu);
  return timed_out;
}

void Notification::Notify() {
  KVARENA_REAL(void (*)(Notification*), "12Notification6NotifyEv");
  Release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  KVARENA_REAL(void (*)(const Notification*), "12Notification19WaitForNotificationEv", true);
  real(this);
  Acquire(this);
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  KVARENA_REAL(bool (*)(const Notification*, Duration),
               "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  const bool notified = real(this, timeout);
  if (notified) Acquire(this);
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  KVARENA_REAL(bool (*)(const Notification*, Time),
               "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  const bool notified = real(this, deadline);
  if (notified) Acquire(this);
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
