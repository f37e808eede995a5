// See ../README.md: declarations only, for c10d's ProcessGroupGloo.hpp.
#pragma once
#include "gloo/context.h"
