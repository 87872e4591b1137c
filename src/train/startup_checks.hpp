#pragma once
// What a run refuses before it claims a directory or takes a step, each refusal naming the
// config key and where it was set: settings the optimizer or the loader would refuse later, an
// empty validation split, a resume that would change the model, ranks that disagree.
#include <string>

#include "run.hpp"
#include "seqforge/dist/communicator.hpp"

namespace seqforge {

// The validation split: empty only when data.split.val is 0.
void check_validation_split(const Config& c, const Task& t);
// A run's inputs before anything is read: the data file and the base model exist and are what
// their keys say; a new run's targets do not take the names of predict's own columns; a resumed
// run keeps its model, its windows and its state's meaning.
void check_run_inputs(const Config& config, const std::string& resume_dir);
// A resumed run's config as it was read (`given`: its config.resolved.yaml and the overrides),
// checked again once the directory's lock is held: another run may have replaced the directory's
// run in between, and its state must not go on under this config.
void check_resumed_config_current(const Config& given, const std::string& resume_dir);
// Under mpirun every rank trains what rank 0's config describes: a rank given another setting
// would build another model (its parameters no longer fit rank 0's in the collectives) or take
// another step silently. Only a process's own resources and its data file's path may differ;
// the data file's bytes may not (a copy on each machine that differs would train on other
// windows silently), nor the seed (a masked autoencoder's masks come from it). Every rank compares
// its own settings with rank 0's and a rank that differs fails naming the first key.
void check_ranks_agree(const Config& c, dist::Communicator& comm);

}  // namespace seqforge
