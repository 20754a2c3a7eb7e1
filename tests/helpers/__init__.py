"""Helpers of the test suite (distributed check workers, cluster probes), not the library."""
