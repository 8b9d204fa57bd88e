"""Test utilities shared by the tests and the local stack: the fake NVML and its fleet scenarios.

Nothing here is imported by production code paths except when a service is started on a
simulated fleet (``--fake-fleet``).
"""
