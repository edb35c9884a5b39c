// Compiles the precompiled header once; other targets reuse it.
#include "paratrain/core/pch.h"
