// The command-line flags of kvarenad (defined in flags.cc, linked into the binary only).
#ifndef KVARENA_DAEMON_FLAGS_H_
#define KVARENA_DAEMON_FLAGS_H_

#include "daemon/server.h"

namespace kvarena {

// Makes --help list the daemon's flags with their text; call before parsing.
void ConfigureFlagsUsage();

// Applies the flags that set process-wide state (abseil's mutex deadlock detection);
// call once, after parsing and before any thread starts.
void ApplyProcessFlags();

// The parsed flags as daemon options.
DaemonOptions OptionsFromFlags();

}  // namespace kvarena

#endif  // KVARENA_DAEMON_FLAGS_H_
