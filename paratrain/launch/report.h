// Words for how workers ended: the message printed when a rank fails and the
// one-line summary printed when the launch ends. Pure functions of outcomes.
#pragma once

#include <string>
#include <vector>

#include "paratrain/launch/launcher.h"

namespace paratrain::launch {

// "rank 1 (pid 4242) exited with code 3" / "rank 0 (pid 4241) was killed by SIGKILL".
std::string describe(const WorkerOutcome& w);

// Compact rank list: {0, 1, 2, 5} -> "ranks 0-2, 5"; {3} -> "rank 3".
std::string rank_list(const std::vector<int>& ranks);

// Fills report.exit_code from the outcomes and returns the summary line, e.g.
// "paratrain launch: FAILED with exit code 3: rank 1 (pid ..) exited with code 3
//  first; stopped by the launcher: rank 0 (pid ..) was killed by SIGTERM; succeeded: none"
std::string summarize(LaunchReport& report);

}  // namespace paratrain::launch
