// Forwards to the public header (installed as <kv/block_key.h>).
#pragma once

#include "kv/block_key.h"  // IWYU pragma: export
