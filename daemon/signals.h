// Termination signals for kvarenad, handled synchronously: SIGTERM and SIGINT are blocked
// in every thread and collected with sigwait(), so no work runs in a signal handler.
#ifndef KVARENA_DAEMON_SIGNALS_H_
#define KVARENA_DAEMON_SIGNALS_H_

namespace kvarena {

// Blocks SIGTERM and SIGINT and ignores SIGPIPE. Call first in main, before any thread
// starts, so every thread inherits the mask.
void BlockTerminationSignals();

// Waits for SIGTERM or SIGINT; returns the signal number.
int WaitForTerminationSignal();

}  // namespace kvarena

#endif  // KVARENA_DAEMON_SIGNALS_H_
