#include "layout/plan.h"
