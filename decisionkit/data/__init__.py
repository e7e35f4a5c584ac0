"""Datasets and the benchmark's metrics: typed-decisions cases, the scenario data sets, KL / Brier / ECE."""
