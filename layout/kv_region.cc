#include "layout/kv_region.h"
