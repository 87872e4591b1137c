#pragma once
// A run's directory: claimed by one process at a time, and never a directory that holds a
// stranger's files or the run's own inputs.
#include <filesystem>
#include <string>

#include "io/file_util.hpp"
#include "seqforge/train/config.hpp"

namespace seqforge {

// Locks a resumed run's directory `dir` for this process, or refuses: another process is
// training in it, or an input of the run is one of the files the run writes there.
void lock_resumed_run_dir(const Config& c, const std::string& dir, io::DirLock* lock);
// Whether `dir` holds a training run's files (its metrics, model or training state).
bool holds_a_run(const std::filesystem::path& dir);

// The run directory of a new run, locked for it: train.run_dir, which must not hold another
// run unless `overwrite`; by default runs/<config name>, or the first of runs/<name>-2, -3, ...
// that holds no run and no other process is training in.
std::string new_run_dir(const Config& c, bool overwrite, io::DirLock* lock);

}  // namespace seqforge
