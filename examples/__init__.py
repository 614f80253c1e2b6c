"""Example jobs that run on Farm."""
