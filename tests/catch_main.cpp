// Catch2 v2 needs one translation unit to define main(); v3 links it.
#define CATCH_CONFIG_MAIN
#include "catch.hpp"
