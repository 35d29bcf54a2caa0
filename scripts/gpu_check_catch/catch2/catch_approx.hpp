#pragma once
#include <catch2/catch.hpp>
