"""Tests of the benchmarks' pure parts and of the engine doubles they serve with."""
