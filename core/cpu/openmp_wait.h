// libgomp's wait policy for oneDNN's threads: passive unless the environment says otherwise.
#pragma once

namespace zeroth::cpu {

// True when OMP_WAIT_POLICY holds zeroth's default (PASSIVE) rather than a value the caller set.
// Programs the tools start that are not zeroth (PyTorch, fio) then start without it.
bool openmp_wait_defaulted();

}  // namespace zeroth::cpu
