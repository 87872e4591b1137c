#pragma once
// The host emulation (cuda_runtime.h beside this).
#include "cuda_runtime.h"
