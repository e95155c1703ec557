// Forwards to the public header, where Status and Result live (installed as <kv/status.h>).
#pragma once

#include "kv/status.h"  // IWYU pragma: export
